"""Realistic-looking random host names, generated a chunk at a time.

The ring simulation hashes millions of names; they should look like the hosts a crawler meets (sub-domains,
hyphens, digits, country TLDs) so nothing about the experiment depends on suspiciously regular input, and they
are produced in chunks so ten million names never sit in memory at once. Randomness comes from the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

__all__ = ["RandomSource", "random_hosts"]


class RandomSource(Protocol):
    """What the ring needs from a random generator (``random.Random`` fits)."""

    def getrandbits(self, k: int, /) -> int: ...


_WORDS = tuple(
    """
    able acme alpha amber apex apple arc arrow atlas aurora autumn axis badger bamboo banner bay beacon bear bell
    berry birch bird black blade blaze bloom blue bolt bond book bridge bright brook buffalo cable cactus camel
    candle canyon capital carbon cardinal castle cedar central chalk charm cherry circle city civic clear cliff
    cloud clover coast cobalt comet coral corner cosmic cotton country crane creek crest crown crystal cube
    daily dawn delta desert diamond digital dolphin dove dragon dream drift eagle earth east echo eden ember
    emerald empire falcon fern field fire flash fleet flint flora forest fox frost garden gate giant glacier
    global gold granite green grove harbor hawk hazel heart hill home honey horizon house hub iron island ivory
    jade jet journal jungle key king lake lantern laser leaf legend light lime lion local lotus lucky lunar
    maple marble market meadow metro micro mint mission modern moon mountain nature navy nest net north nova
    oak ocean olive omega open orbit orchid pacific palm panda paper park peak pearl pepper phoenix pine pixel
    planet plaza point polar prime pulse quantum quest rain rapid raven red reef ridge river road rock rose
    royal ruby sage salt sand sapphire scout sea shadow shell shore sierra silver sky smart snow solar south
    spark spring square star steel stone storm summit sun swift tech terra thunder tiger timber topaz tower
    trail tree tribe tropic true union unity urban valley vector velvet venture vista wave west whale wild
    willow wind winter wolf wood world zen zenith
    """.split()
)
_PREFIXES = ("", "", "", "", "www.", "www.", "www.", "blog.", "shop.", "news.", "m.", "en.", "docs.", "cdn.",
             "forum.", "static.")
_JOINS = ("", "", "-", "")
_TLDS = ("com", "com", "com", "com", "com", "com", "org", "org", "net", "net", "de", "uk", "co.uk", "fr", "jp",
         "cn", "ru", "br", "io", "info", "nl", "it", "es", "pl", "ca", "com.au", "in", "edu", "gov", "ch", "se",
         "co")


def random_hosts(rng: RandomSource, count: int, *, chunk: int = 65536) -> Iterator[list[str]]:
    """Yield ``count`` random lower-case host names in lists of at most ``chunk``."""
    if count < 0 or chunk < 1:
        raise ValueError(f"need count >= 0 and chunk >= 1, got count={count}, chunk={chunk}")
    words, prefixes, joins, tlds = _WORDS, _PREFIXES, _JOINS, _TLDS
    n_words = len(words)
    getrandbits = rng.getrandbits
    remaining = count
    while remaining:
        size = min(chunk, remaining)
        names: list[str] = []
        append = names.append
        for _ in range(size):
            r = getrandbits(64)
            first = words[r % n_words]
            r //= n_words
            second = words[r % n_words]
            r //= n_words
            digits = r & 7
            number = str(r >> 13 & 1023) if digits == 0 else ""
            append(f"{prefixes[r >> 3 & 15]}{first}{joins[r >> 7 & 3]}{second}{number}.{tlds[r >> 23 & 31]}")
        remaining -= size
        yield names
