"""Link admission, the crawl's hottest path: a URL is scope-checked, routed to its host's owner when that is
another node, or else deduplicated and queued, in one store transaction with the page it was found on
(`_commit`). Seeds, links, redirect targets and what a sitemap lists all come this way.

Speed: most links of a wide crawl were seen before, so the crawler remembers which URLs the dedup store has
already answered for (URL -> host, bounded) and counts those as seen without parsing, scope-checking or
looking them up again; the dedup store stays the authority (docs/architecture.md, "Seen-URL memory").

A mixin of `peer.crawl.crawler.Crawler`: it works on the crawler's attributes, set in `Crawler.__init__`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from storage import QueuedUrl, RevisitRecord

from peer.crawl.scheduler import HostTurn
from peer.crawl.urls import host_of_normalized, normalize

if TYPE_CHECKING:
    from collections.abc import Callable

    from storage import HostState, NodeStore

    from peer.crawl.scheduler import HostScheduler
    from peer.crawl.seams import Ownership
    from peer.crawl.settings import CrawlSettings
    from peer.crawl.urls import Scope
    from peer.stats import Stats

__all__ = ["Admission", "Batch", "SeedReport"]

# the crawler's records keep the logger name they have always had (operators filter on it)
log = logging.getLogger("peer.crawl.crawler")

#: URLs remembered as already answered by the dedup store (about 200 B each: 200,000 is about 40 MiB).
#: Past it the memory starts over; the dedup store stays the authority, so that only costs look-ups.
_SEEN_CACHE_SIZE = 200_000


@dataclass(frozen=True, slots=True)
class SeedReport:
    """What became of seeds added at runtime: queued here, already seen here, sent to their owners, refused."""

    new: int
    seen: int
    routed: int
    out_of_scope: dict[str, int]
    invalid: list[str]

    def as_dict(self) -> dict:
        return {"new": self.new, "seen": self.seen, "routed": self.routed, "out_of_scope": self.out_of_scope,
                "invalid": self.invalid}


class Batch:
    """Links screened for one store transaction: what to queue if new, and seen-cache hits."""

    __slots__ = ("cands", "seen")

    def __init__(self) -> None:
        self.cands: list[QueuedUrl] = []
        self.seen = 0


class Admission:
    """Admitting URLs: seeds, links, redirect targets, sitemap entries."""

    if TYPE_CHECKING:
        # What this part uses of the Crawler it is mixed into: attributes and its other parts' methods.
        ownership: Ownership
        owns: Callable[[str], bool] | None
        sched: HostScheduler
        scope: Scope
        _seen: dict[str, str]
        settings: CrawlSettings
        stats: Stats
        store: NodeStore
        _wakeup: trio.Event
        plugins: Any  # peer.plugins.Plugins, a room above this one (None: no plug-ins)

        def _state_of(self, turn: HostTurn) -> HostState: ...

    def admit(self, items: Iterable[QueuedUrl]) -> tuple[int, int]:
        """Scope-check, route, dedup and queue normalized URLs (their host is taken from the URL). Returns
        (new, already seen) for the URLs owned here."""
        batch = Batch()
        for item in items:
            self._screen(batch, item.url, item.depth, item.hops, item.found_on, item.lastmod, item.sitemap)
        return self._commit(batch)

    def _filter_urls(self, source: str, urls: list[str], tag: str | None) -> list[str | None]:
        """The plug-ins' URL filters on URLs that are not a page's links: seeds (`tag` None), a redirect's
        target ("redirect"), what a sitemap lists ("sitemap"). Each URL's answer in order (None: dropped; a
        filter may rewrite a URL); `urls` as they are when no filter runs. A filter's failures count as a page's
        do (the node's errors, the plug-in's own counts)."""
        plugins = self.plugins
        if plugins is None or not urls or not plugins.filters_urls:
            return list(urls)
        errors, timeouts = plugins.failures()
        answers, off = plugins.filter_urls(source, urls, tag)
        errors_after, timeouts_after = plugins.failures()
        if errors_after > errors:
            self.stats.errors["plugin-error"] += errors_after - errors
        if timeouts_after > timeouts:
            self.stats.errors["plugin-timeout"] += timeouts_after - timeouts
        if off:
            self.stats.errors["plugin-switched-off"] += off
        dropped = answers.count(None)
        if dropped:
            self.stats.skipped["plugin-url-filter"] += dropped
        return answers

    def _screen_found(self, batch: Batch, urls: Sequence[str], depth: int, found_on: str) -> None:
        """Screen the links of one page, without a record per URL: the crawl's hottest loop.

        Most links of a wide crawl were seen before; a URL the dedup store already answered for, on a host
        this node still owns, is counted as seen without being parsed, scope-checked or looked up again.
        """
        seen = self._seen
        max_depth = self.scope.max_depth
        if max_depth is not None and depth > max_depth:
            seen = {}  # the scope check must name the reason, as without the cache
        hits = repeats = 0
        for url in urls:
            host = seen.get(url)
            if host is not None:  # answered for under the current ring (the ownership clears it at a change)
                if host:
                    hits += 1
                else:  # routed to its owner recently: dropped, as the dispatcher's recently-sent filter would
                    repeats += 1
                continue
            self._screen(batch, url, depth, 0, found_on)
        batch.seen += hits
        self.stats.routed_repeats += repeats

    def _screen(
        self,
        batch: Batch,
        url: str,
        depth: int,
        hops: int,
        found_on: str | None,
        lastmod: float | None = None,
        sitemap: bool = False,
    ) -> None:
        host = host_of_normalized(url)
        reason = self.scope.check(url, host, depth, sitemap=sitemap)
        if reason is not None:
            self.stats.skipped[reason] += 1
            return
        item = QueuedUrl(url=url, host=host, depth=depth, hops=hops, found_on=found_on, lastmod=lastmod, sitemap=sitemap)
        if self.owns is not None and not self.owns(host):
            self.ownership.route(item)
            self._room(1)[url] = ""  # routed: a repeat on a later page is dropped before it is screened again
            return
        batch.cands.append(item)

    def _commit(self, batch: Batch, done: QueuedUrl | None = None,
                revisit: RevisitRecord | None = None, turn: HostTurn | None = None,
                extracted: Sequence[dict] = (), logged: Sequence[Any] | None = None) -> tuple[int, int]:
        """One store transaction: mark the batch seen, queue the new URLs and (with ``done``) clear the page
        they were found on from in-flight, save its host's politeness state (``turn``), spool the items the
        plug-ins ``extracted`` from it and its crawl-log record (``logged``), all together, so a crash can lose
        none of it. New URLs wake their hosts."""
        cands = batch.cands
        more: dict[str, Any] = {} if logged is None else {"logged": logged}
        if revisit is not None:
            assert done is not None
            items = self.store.finish_revisit(done, revisit, cands, self.ownership.take_routed(),
                                              state=self._state_of(turn) if turn is not None else None,
                                              items=extracted, **more)
        elif done is not None:
            routed = self.ownership.take_routed()
            state = self._state_of(turn) if turn is not None else None
            items = (self.store.finish(done, cands, routed, state=state, items=extracted, **more) if routed
                     else self.store.finish(done, cands, state=state, items=extracted, **more))
        else:
            items = self.store.admit(cands) if cands else []
        if cands:
            seen = self._room(len(cands))
            for c in cands:
                seen[c.url] = c.host
        seen_before = batch.seen + len(cands) - len(items)
        if items:
            self.ownership.queued(items)
            now = trio.current_time()
            wake = self.sched.wake
            for item in items:
                wake(item.host, now)
            self._wakeup.set()
        self.stats.urls_new += len(items)
        self.stats.urls_seen += seen_before
        return len(items), seen_before

    def answered(self, url: str) -> bool:
        """Whether the memory holds `url` as answered for by the dedup store, for a host owned here under the
        current ownership (a peer's batch need not look it up again: `Dispatcher.answered_by`)."""
        return bool(self._seen.get(url))

    def known_elsewhere(self, urls: Sequence[str]) -> int:
        """`urls`, of hosts owned elsewhere, are durably queued at their owner (its queued-URL replica reached this
        node): a link to one is dropped like a routed repeat, before it is screened or routed (DESIGN decision
        4: the owner has decided, and nothing is asked of it again). Under the current ring only: `forget_seen`
        drops them with the rest. Returns how many were new to the memory."""
        seen = self._room(len(urls))
        before = len(seen)
        for url in urls:
            seen.setdefault(url, "")
        return len(seen) - before

    def _room(self, count: int) -> dict[str, str]:
        """The memory, with room for `count` more URLs: past `_SEEN_CACHE_SIZE` it starts over."""
        seen = self._seen
        if len(seen) + count > _SEEN_CACHE_SIZE:
            seen.clear()
        return seen

    def forget_seen(self) -> None:
        """Drop the in-memory record of URLs the dedup store has answered for and of URLs routed elsewhere.
        Call it whenever the dedup store may forget URLs (a re-crawl policy deleting keys) and whenever the
        ownership's `owns` answers change (a new ring): a hit is then trusted without asking `owns`."""
        self._seen.clear()

    def seed(self, urls: Sequence[str]) -> int:
        return self.add_seeds(urls).new

    def add_seeds(self, urls: Sequence[str]) -> SeedReport:
        """Seeds (at start or at runtime): checked against the scope in force, queued here if this node owns
        their host, else routed to the owner (whose store decides whether they are new)."""
        batch = Batch()
        invalid: list[str] = []
        refused: dict[str, int] = {}
        routed = 0
        found: list[str] = []
        for raw in urls:
            url = normalize(raw.strip(), max_length=self.settings.max_url_length)
            if url is None:
                log.warning("seed is not a crawlable http(s) URL, skipped", extra={"seed": raw[:200]})
                invalid.append(raw[:200])
                continue
            found.append(url)
        kept = [url for url in self._filter_urls("", found, None) if url is not None]
        if len(kept) < len(found):
            refused["plugin-url-filter"] = len(found) - len(kept)
        for url in kept:
            host = host_of_normalized(url)
            reason = self.scope.check(url, host, 0)
            if reason is not None:
                refused[reason] = refused.get(reason, 0) + 1
                self.stats.skipped[reason] += 1
                continue
            if self.owns is not None and not self.owns(host):
                self.ownership.route(QueuedUrl(url=url, host=host, depth=0))
                routed += 1
                continue
            batch.cands.append(QueuedUrl(url=url, host=host, depth=0))
        new, seen = self._commit(batch)
        return SeedReport(new=new, seen=seen, routed=routed, out_of_scope=refused, invalid=invalid)
