"""The crawl oracle: which URLs a correct crawler fetches from a generated web, and which it must not.

It walks the graph from the seeds using the generator's own structures (link targets, robots rules,
resource kinds), never the served bytes and never the product's parsers, so it is an independent referee.
The semantics it assumes are written down in ``docs/localweb.md``; in short: links from 2xx HTML pages
are followed (depth + 1) unless ``rel=nofollow`` or the page says ``<meta name=robots content=nofollow>``;
a redirect's target is routed like a link at the same depth with one more hop (at most
``max_redirect_hops``); the trap guard and the depth limit are applied before DNS and robots; robots.txt
4xx allows all, 5xx disallows all; a body over ``max_body`` is fetched but yields no links.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from peer.crawl.urls import DEFAULT_BINARY_SUFFIXES

from .model import Resource, make_url
from .robots_spec import RobotsSpec

__all__ = ["DEFAULT_SKIP_SUFFIXES", "Expected", "Graph", "TrapGuard", "expected"]


class Graph(Protocol):
    """What the oracle reads of a web (``SiteGraph`` is one): its seeds, robots rules and resources."""

    def seeds(self, *, port: int | None = None) -> list[str]: ...

    def robots(self, host: str) -> RobotsSpec | None: ...

    def resource(self, host: str, path: str) -> Resource | None: ...

    def crawl_delay(self, host: str, user_agent: str = ...) -> float | None: ...


#: Path suffixes refused before fetching: the product's own default scope list (``peer.crawl.urls.Scope``'s
#: ``deny_suffixes``), so the oracle and the crawler it judges cannot drift apart.
DEFAULT_SKIP_SUFFIXES: tuple[str, ...] = DEFAULT_BINARY_SUFFIXES


@dataclass(frozen=True, slots=True, kw_only=True)
class TrapGuard:
    """The crawler-trap rule of ``peer.crawl.urls.Scope``, restated: call it with a URL, True means allowed.

    A URL is refused when it is longer than ``max_url_length`` characters, when its path has more than
    ``max_segments`` non-empty segments, or when one segment value occurs more than
    ``max_segment_repeats`` times in the path (``/trap/a/a/a/`` passes, ``/trap/a/a/a/a/`` does not).
    """

    max_segment_repeats: int = 3
    max_segments: int = 64
    max_url_length: int = 2048

    def __call__(self, url: str) -> bool:
        if len(url) > self.max_url_length:
            return False
        segments = [s for s in urlsplit(url).path.split("/") if s]
        if len(segments) > self.max_segments:
            return False
        return max(Counter(segments).values(), default=0) <= self.max_segment_repeats


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    """What a correct crawl of a graph looks like. Every URL is normalized and carries the port given.

    ``fetched``: requested and answered 2xx/3xx/4xx (redirecting URLs, 404s and 410s included).
    ``never_requested`` (the union of ``disallowed``, ``refused``, ``not_followed``, ``unresolvable``,
    ``over_hop_limit`` and ``beyond_depth``): URLs the crawl meets but must never request.
    """

    seeds: tuple[str, ...]
    fetched: frozenset[str]
    disallowed: frozenset[str]
    refused: frozenset[str]
    not_followed: frozenset[str]
    unresolvable: frozenset[str]
    over_hop_limit: frozenset[str]
    beyond_depth: frozenset[str]
    too_large: frozenset[str]
    retried: frozenset[str]
    robots: frozenset[str]
    redirects: Mapping[str, str]
    statuses: Mapping[str, int]
    depths: Mapping[str, int]
    crawl_delays: Mapping[str, float]
    #: URLs linked only by pages' scripts (met on pages fetched): found by a crawl that renders (``render``)
    scripted: frozenset[str] = frozenset()

    @property
    def never_requested(self) -> frozenset[str]:
        return (self.disallowed | self.refused | self.not_followed | self.unresolvable
                | self.over_hop_limit | self.beyond_depth)

    @property
    def pages(self) -> frozenset[str]:
        """Fetched URLs that answer 200 (the pages a store ends up holding)."""
        return frozenset(u for u in self.fetched if self.statuses[u] == 200)


def expected(
    graph: Graph,
    *,
    user_agent: str = "peercrawl",
    max_depth: int | None = None,
    max_body: int = 10 * 2**20,
    max_redirect_hops: int = 5,
    trap_guard: Callable[[str], bool] = TrapGuard(),
    skip_suffixes: Collection[str] = DEFAULT_SKIP_SUFFIXES,
    port: int | None = None,
    render: bool = False,
) -> Expected:
    """Compute the oracle for ``graph`` (see :class:`Expected`).

    ``render``: the crawl runs pages' scripts, so links a script writes are followed as any other.

    ``max_depth`` counts links from a seed (depth 0); the oracle takes each URL's shortest depth, which a
    crawler working breadth-first reaches; in a cluster, where order is loose, compare with it only when
    ``max_depth`` is None. URLs whose path ends with one of ``skip_suffixes`` (case-insensitive; the query
    is not part of the path) are refused like trap URLs; pass ``()`` to have binary files fetched.
    ``port`` is the web server's port, written into every URL.
    """
    suffixes = tuple(s.lower() for s in skip_suffixes)
    Key = tuple[str, str]
    states: dict[Key, list[tuple[int, int]]] = {}
    queue: deque[tuple[str, str, int, int]] = deque()
    fetched: dict[Key, int] = {}
    depths: dict[Key, int] = {}
    reasons: dict[str, set[Key]] = {k: set() for k in
                                    ("disallowed", "refused", "unresolvable", "over_hop", "depth", "nofollow")}
    too_large: set[Key] = set()
    retried: set[Key] = set()
    redirects: dict[Key, Key] = {}
    robots_hosts: set[str] = set()
    scripted: set[Key] = set()
    plain: set[Key] = set()

    def visit(host: str, path: str, depth: int, hops: int, *, same_depth: bool = False) -> None:
        key = (host, path)
        seen = states.get(key)
        if seen is None:
            states[key] = [(depth, hops)]
        else:
            first = seen[0]
            if (first[0] <= depth and first[1] <= hops) or any(d <= depth and h <= hops for d, h in seen):
                return
            seen.append((depth, hops))
        # 0-1 breadth-first: a redirect target (same depth) goes to the front, a link to the back, so
        # URLs leave the queue in order of depth and the first visit of a URL is at its shortest depth.
        if same_depth:
            queue.appendleft((host, path, depth, hops))
        else:
            queue.append((host, path, depth, hops))

    for seed in graph.seeds():
        parts = urlsplit(seed)
        visit(parts.hostname or "", parts.path or "/", 0, 0)

    while queue:
        host, path, depth, hops = queue.popleft()
        key = (host, path)
        if max_depth is not None and depth > max_depth:
            reasons["depth"].add(key)
            continue
        if not trap_guard(make_url(host, path, port)) or (
            suffixes and path.split("?", 1)[0].lower().endswith(suffixes)
        ):
            reasons["refused"].add(key)
            continue
        robots = graph.robots(host)
        if robots is None:
            reasons["unresolvable"].add(key)
            continue
        robots_hosts.add(host)
        if not robots.allows(user_agent, path):
            reasons["disallowed"].add(key)
            continue
        res = graph.resource(host, path)
        depths[key] = min(depth, depths.get(key, depth))
        if res is None:
            fetched[key] = 404
            continue
        fetched[key] = res.status
        if res.first_status is not None:
            retried.add(key)
        if res.kind == "redirect" and res.location is not None:
            target = (res.location.host, res.location.path)
            redirects[key] = target
            if hops + 1 > max_redirect_hops:
                reasons["over_hop"].add(target)
            else:
                visit(*target, depth, hops + 1, same_depth=True)
            continue
        if res.kind == "huge" and res.size > max_body:
            too_large.add(key)
            continue
        if res.kind != "html" or res.status != 200:
            continue
        child = depth + 1
        for link in res.links:
            if link.scripted:
                scripted.add((link.host, link.path))
                if not render:
                    continue
            else:
                plain.add((link.host, link.path))
            if link.nofollow or res.meta_nofollow:
                reasons["nofollow"].add((link.host, link.path))
                continue
            seen = states.get((link.host, link.path))
            if seen is not None and seen[0][0] <= child and seen[0][1] == 0:  # reached before, as well
                continue
            visit(link.host, link.path, child, 0)

    def urls(keys: Collection[Key]) -> frozenset[str]:
        return frozenset(make_url(h, p, port) for h, p in keys if (h, p) not in fetched)

    robots_urls = set()
    for host in robots_hosts:
        robots_urls.add(make_url(host, "/robots.txt", port))
        spec = graph.robots(host)
        if spec is not None and spec.redirect_path:
            robots_urls.add(make_url(host, spec.redirect_path, port))
    delays = {}
    for host in robots_hosts:
        delay = graph.crawl_delay(host, user_agent)
        if delay is not None:
            delays[host] = delay
    return Expected(
        seeds=tuple(graph.seeds(port=port)),
        fetched=frozenset(make_url(h, p, port) for h, p in fetched),
        disallowed=urls(reasons["disallowed"]),
        refused=urls(reasons["refused"]),
        not_followed=urls(reasons["nofollow"] - states.keys()),
        unresolvable=urls(reasons["unresolvable"]),
        over_hop_limit=urls(reasons["over_hop"] - states.keys()),
        beyond_depth=urls(reasons["depth"]),
        too_large=frozenset(make_url(h, p, port) for h, p in too_large),
        retried=frozenset(make_url(h, p, port) for h, p in retried),
        robots=frozenset(robots_urls),
        redirects={make_url(*k, port): make_url(*v, port) for k, v in redirects.items()},
        statuses={make_url(h, p, port): s for (h, p), s in fetched.items()},
        depths={make_url(h, p, port): d for (h, p), d in depths.items()},
        crawl_delays=delays,
        scripted=frozenset(make_url(h, p, port) for h, p in scripted - plain),
    )
