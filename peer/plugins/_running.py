"""The node's plug-in chain in use: which chain runs (its generation, swapped between pages by a reload), the
counts per plug-in, the switch-off of a plug-in that fails on most pages, and the part of a page job that tells
a page worker which chain to run (`job_part`, `run_in_worker`).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence
from typing import Any

from peer.plugins._api import FetchedPage
from peer.plugins._chain import Chain, Outcome, PluginSpec, load_chain

__all__ = ["FAILING_SHARE", "MIN_PAGES", "Plugins", "run_in_worker"]

log = logging.getLogger("peer.plugins")

#: A plug-in is switched off once it has run on at least this many pages ...
MIN_PAGES = 20
#: ... and failed (raised or timed out) on more than this share of them: most pages.
FAILING_SHARE = 0.5


class _Counts:
    __slots__ = ("errors", "items", "last", "off", "pages", "timeouts")

    def __init__(self) -> None:
        self.pages = 0
        self.errors = 0
        self.timeouts = 0
        self.items = 0
        self.last = ""  # the last failure: what and on which URL
        self.off = ""  # why it was switched off ("" while it runs)


class Plugins:
    """The chain a node runs. ``generation`` grows with each reload; a page worker builds the chain of the
    generation a job names (the specs travel with the job, pickled once per generation)."""

    def __init__(self, specs: Sequence[PluginSpec], *, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self.generation = 0
        self._staged: tuple[str, list[PluginSpec], Chain] | None = None  # a reload prepared, not yet run
        self._before: tuple[str, list[PluginSpec]] | None = None  # the chain run before the last reload
        self._install(list(specs), load_chain(specs, timeout=timeout))

    def _install(self, specs: list[PluginSpec], chain: Chain) -> None:
        self.specs = specs
        self.chain = chain
        self.generation += 1
        self._blob = pickle.dumps((specs, self.timeout), protocol=pickle.HIGHEST_PROTOCOL)
        self.counts = [_Counts() for _ in range(len(chain))]
        self.disabled: frozenset[int] = frozenset()

    def reload(self, specs: Sequence[PluginSpec]) -> None:
        """Load `specs` and run them from the next page on; PluginError (and the old chain kept) if one fails."""
        chain = load_chain(specs, timeout=self.timeout)
        self._install(list(specs), chain)
        log.info("plug-in chain reloaded", extra={"generation": self.generation, "plugins": chain.names,
                                                  "fingerprint": chain.fingerprint})

    # A reload across the cluster is all-or-nothing (peer/noderoutes.py): every node loads the new chain and
    # keeps it aside (`prepare`); only when all have, each swaps to it (`commit`); else each drops it, or goes
    # back to the chain it ran before when it had swapped already (`abort`).

    def prepare(self, token: str, specs: Sequence[PluginSpec]) -> Chain:
        """Load `specs` and keep the chain aside under `token` (PluginError naming the plug-in when one fails;
        the chain in use is untouched either way)."""
        chain = load_chain(specs, timeout=self.timeout)
        self._staged = (token, list(specs), chain)
        return chain

    def commit(self, token: str) -> None:
        """Run the chain `prepare` kept under `token` from the next page on; KeyError when none is kept."""
        staged = self._staged
        if staged is None or staged[0] != token:
            raise KeyError(f"no chain was prepared under {token!r}")
        self._staged = None
        self._before = (token, self.specs)
        self._install(staged[1], staged[2])
        log.info("plug-in chain reloaded", extra={"generation": self.generation, "plugins": self.chain.names,
                                                  "fingerprint": self.chain.fingerprint})

    def abort(self, token: str) -> bool:
        """Undo the reload `token` here: drop its chain if only prepared, or go back to the chain run before it
        if committed. Whether anything was undone."""
        staged = self._staged
        if staged is not None and staged[0] == token:
            self._staged = None
            return True
        before = self._before
        if before is not None and before[0] == token:
            self._before = None
            self._install(before[1], load_chain(before[1], timeout=self.timeout))
            log.warning("plug-in reload undone: another node could not take it; the chain run before is back",
                        extra={"generation": self.generation, "fingerprint": self.chain.fingerprint})
            return True
        return False

    @property
    def active(self) -> bool:
        """Whether anything runs on pages (no plug-in: the page path builds nothing for them)."""
        return self.chain.works_on_pages

    @property
    def fingerprint(self) -> str:
        return self.chain.fingerprint

    def description(self) -> dict[str, Any]:
        return {"fingerprint": self.chain.fingerprint, "plugins": self.chain.description}

    def job_part(self) -> tuple | None:
        """What a page job carries for a page worker: the function that runs it there (pickled by name, so the
        crawl engine need not import the plug-ins), the generation, the pickled specs and the plug-ins off."""
        return (run_in_worker, self.generation, self._blob, self.disabled) if self.active else None

    def run(self, page: FetchedPage, links: Sequence[str] | None, base: str | None) -> Outcome:
        """The chain on one page, here (the event loop, or a page thread)."""
        return self.chain.run(page, links, base, self.disabled)

    def run_page(self, url: str, status: int, headers: Sequence[tuple[str, str]], body: bytes,
                 content_type: str | None, fetched_at: float, links: Sequence[str] | None,
                 base: str | None) -> Outcome:
        """The chain on a fetched page given by its parts (the crawl engine's call)."""
        page = FetchedPage(url=url, status=status, headers=headers, body=body, content_type=content_type,
                           fetched_at=fetched_at)
        return self.chain.run(page, links, base, self.disabled)

    @property
    def filters_urls(self) -> bool:
        """Whether a URL filter runs (on seeds, redirects' targets and sitemaps' URLs as well as links)."""
        return self.chain.filters_urls

    def failures(self) -> tuple[int, int]:
        """The errors and the timeouts of the whole chain so far (this generation)."""
        return sum(c.errors for c in self.counts), sum(c.timeouts for c in self.counts)

    def filter_urls(self, source: str, urls: Sequence[str], tag: str | None) -> tuple[list[str | None], int]:
        """The URL filters on URLs that are not a page's links (`Chain.filter_urls`), counted and logged as a
        page's outcome is (`record`): each URL's answer (None: dropped), and the plug-ins this call switched off."""
        answers, outcome = self.chain.filter_urls(source, urls, tag, self.disabled)
        off = self.record(outcome, source or (urls[0] if urls else "")) if outcome.ran else 0
        return answers, off

    def record(self, outcome: Outcome, url: str, generation: int | None = None) -> int:
        """Count a page's outcome per plug-in; log each failure with the URL; switch a plug-in off once it has
        failed on most pages; the number switched off by this page. An outcome of an older generation (a page in
        flight over a reload) is not counted."""
        if generation is not None and generation != self.generation:
            return 0
        counts = self.counts
        for index in outcome.ran:
            counts[index].pages += 1
        for index, _item in outcome.items:
            counts[index].items += 1
        for index, kind, what in outcome.failures:
            c = counts[index]
            if kind == "timeout":
                c.timeouts += 1
            else:
                c.errors += 1
            c.last = f"{what} ({url[:200]})"
            log.warning("a plug-in failed on a page; the page is kept as if it had no opinion",
                        extra={"plugin": self.chain.names[index], "url": url, "failure": kind, "error": what})
        off = set(self.disabled)
        before = len(off)
        for index, _kind, _what in outcome.failures:
            c = counts[index]
            failed = c.errors + c.timeouts
            if not c.off and c.pages >= MIN_PAGES and failed > FAILING_SHARE * c.pages:
                c.off = (f"switched off: failed on {failed} of {c.pages} pages "
                         f"({c.errors} errors, {c.timeouts} timeouts); last: {c.last}")
                off.add(index)
                log.error("a plug-in failing on most pages is switched off until the next reload or restart",
                          extra={"plugin": self.chain.names[index], "reason": c.off})
        self.disabled = frozenset(off)
        return len(off) - before

    def switched_off(self) -> list[tuple[str, str]]:
        """The plug-ins switched off for failing on most pages: (use, why), for the dashboard."""
        return [(name, c.off) for name, c in zip(self.chain.names, self.counts) if c.off]

    def status(self) -> dict[str, Any]:
        """What ``peerctl status`` and ``peerctl plugins`` show."""
        return {
            "generation": self.generation,
            "fingerprint": self.chain.fingerprint,
            "timeout": self.timeout,
            "chain": [{"use": d["use"], "version": d["version"], "kinds": d["kinds"], "settings": d["settings"],
                       "pages": c.pages, "items": c.items, "errors": c.errors, "timeouts": c.timeouts,
                       "last_failure": c.last, "state": c.off or "on"}
                      for d, c in zip(self.chain.description, self.counts)],
        }


_worker_chain: dict[int, Chain] = {}


def run_in_worker(part: tuple, url: str, status: int, headers: Sequence[tuple[str, str]], body: bytes,
                  content_type: str | None, fetched_at: float, links: Sequence[str] | None,
                  base: str | None) -> Outcome:
    """The chain a job names, in a page worker: built once per generation (and kept for the worker's life)."""
    _runner, generation, blob, disabled = part
    page = FetchedPage(url=url, status=status, headers=headers, body=body, content_type=content_type,
                       fetched_at=fetched_at)
    chain = _worker_chain.get(generation)
    if chain is None:
        specs, timeout = pickle.loads(blob)
        chain = load_chain(specs, timeout=timeout)
        _worker_chain.clear()
        _worker_chain[generation] = chain
    return chain.run(page, links, base, disabled)
