"""A deterministic web of many hosts, generated from a seed: the ground truth of every crawl test.

Ordinary pages are not stored: page ``j`` of host ``i`` is ``/`` (j = 0) or ``/p/{j}.html``, and its links
are drawn from a random generator seeded by ``(seed, i, j)``, so a graph of 50,000 pages costs no memory
and any process given the same arguments sees the same web. Feature resources (see ``features.py``) are
stored explicitly. The same lookup, ``resource()``, serves the HTTP server and the oracle.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from .features import MIN_FEATURE_HOSTS, TRAP_PREFIX, build_features
from . import markup as _markup
from .corpus import Corpus, load_corpus
from .model import PORT, HostSpec, Link, Resource, idna_host, make_url, norm_path
from .oracle import DEFAULT_SKIP_SUFFIXES, Expected, TrapGuard, expected
from .robots_spec import RobotsGroup, RobotsSpec, Rule
from .structured import StructuredTruth, build_structured

__all__ = ["SiteGraph", "loopback_address", "mirror_body", "mirror_path", "page_path"]

_PAGE = re.compile(r"/p/([1-9][0-9]*)\.html")
_MOVED = re.compile(r"/r/([1-9][0-9]*)")
#: Names under the web's domain that no DNS server answers: links of the real-markup web go there sometimes.
NX_LABELS = ("gone", "old-shop", "cdn-legacy", "typo-domain")
#: Missing pages (/p/N.html past the last) and moved pages (/r/N) each host of the real-markup web links to.
DEAD_PER_HOST = 2
MOVED_PER_HOST = 3
_TRAP_TAIL = re.compile(r"(?:a/)*")
#: Seconds the slow page waits before answering: noticeable, yet far under any sane read timeout.
DEFAULT_SLOW_DELAY = 1.0
#: Bytes of the huge page: twice the crawler's default maximum body.
DEFAULT_HUGE_BYTES = 20 * 2**20


def loopback_address(k: int) -> str:
    """The k-th loopback address of a web spread over several: 127.0.0.1, 127.0.0.2, ..., 127.0.1.1, ... (for
    ``zone(addresses)``)."""
    if not 0 <= k < 255 * 255:
        raise ValueError(f"loopback address index must be within [0, {255 * 255}), got {k}")
    return f"127.0.{k // 255}.{k % 255 + 1}"


def page_path(j: int) -> str:
    """The path of ordinary page ``j`` of any host."""
    return "/" if j == 0 else f"/p/{j}.html"


class SiteGraph:
    """The generated web. Build it with :meth:`generate`; it is immutable afterwards."""

    def __init__(
        self,
        *,
        seed: int,
        domain: str,
        hosts: tuple[HostSpec, ...],
        pages_per_host: int,
        links_per_page: int,
        cross_host_fraction: float,
        page_bytes: int,
        features: bool,
        seed_hosts: int,
        resources: Mapping[tuple[str, str], Resource],
        extra_links: Mapping[tuple[str, str], tuple[Link, ...]],
        feature_urls: Mapping[str, tuple[tuple[str, str], ...]],
        nxdomain: tuple[str, ...],
        trap_host: str | None,
        page_bytes_sigma: float = 0.0,
        links_spread: int = 0,
        markup: str = "filler",
        doc_fraction: float = 0.0,
        odd_link_fraction: float = 0.0,
        corpus: Corpus | None = None,
    ) -> None:
        self.seed = seed
        self.domain = domain
        self.hosts = hosts
        self.pages_per_host = pages_per_host
        self.links_per_page = links_per_page
        self.cross_host_fraction = cross_host_fraction
        self.page_bytes = page_bytes
        # Page sizes log-normal around the median page_bytes (sigma 0: every page page_bytes); links per page
        # uniform in links_per_page +- links_spread.
        self.page_bytes_sigma = page_bytes_sigma
        self.links_spread = links_spread
        # "filler": a <ul> of links and filler words; "real": pages built like the web's (markup.py), and on
        # a doc_fraction of the hosts the real documents of python3-doc (corpus.py) when it is installed.
        self.markup = markup
        self.corpus = corpus
        self.doc_fraction = doc_fraction if corpus is not None else 0.0
        self.odd_link_fraction = odd_link_fraction
        self.features = features
        self.seed_hosts = seed_hosts
        self.nxdomain = nxdomain
        self.trap_host = trap_host
        self._resources = dict(resources)
        self._extra_links = dict(extra_links)
        self._feature_urls = dict(feature_urls)
        self._by_name = {h.name: h for h in hosts}
        # Ordinary links are shared between pages: (host index, page, written form) -> Link.
        self._links: dict[tuple[int, int, int], Link] = {}
        #: what the structured pages hold (``generate(structured=True)``), None without them
        self.structured: StructuredTruth | None = None
        # Real-markup web: host index -> (serves documents, navigation links, footer links).
        self._templates: dict[int, tuple[bool, tuple[Link, ...], tuple[Link, ...]]] = {}

    @classmethod
    def generate(
        cls,
        *,
        seed: int,
        hosts: int = 50,
        pages_per_host: int = 20,
        links_per_page: int = 10,
        cross_host_fraction: float = 0.3,
        page_bytes: int = 2000,
        features: bool = True,
        domain: str = "web.test",
        seed_hosts: int = 1,
        huge_bytes: int = DEFAULT_HUGE_BYTES,
        slow_delay: float = DEFAULT_SLOW_DELAY,
        page_bytes_sigma: float = 0.0,
        links_spread: int = 0,
        crawl_delay_fraction: float = 0.0,
        crawl_delay: float = 2.0,
        structured: bool = False,
        markup: str = "filler",
        doc_fraction: float = 0.2,
        odd_link_fraction: float = 0.02,
        corpus_root: str | None = None,
        mirrored: int = 0,
    ) -> SiteGraph:
        """Generate the web for ``seed``; the same arguments always give the same web. ``structured`` adds the
        pages of `peerlab.localweb.structured` under the hub (off: the web is unchanged). ``mirrored`` adds that
        many mirrored documents: every host serves ``/mirror/K.html`` with the same bytes (about `page_bytes`
        each, linked from its root page), as sites that mirror a manual or a licence do (0: the web is
        unchanged)."""
        if hosts < 1 or pages_per_host < 1 or links_per_page < 0 or page_bytes < 0:
            raise ValueError("hosts and pages_per_host must be >= 1, links_per_page and page_bytes >= 0")
        if not 0.0 <= cross_host_fraction <= 1.0:
            raise ValueError(f"cross_host_fraction must be within [0, 1], got {cross_host_fraction}")
        if features and hosts < MIN_FEATURE_HOSTS:
            raise ValueError(f"features=True needs hosts >= {MIN_FEATURE_HOSTS}, got {hosts}")
        if not 1 <= seed_hosts <= hosts:
            raise ValueError(f"seed_hosts must be within [1, hosts], got {seed_hosts}")
        if page_bytes_sigma < 0 or not 0 <= links_spread <= links_per_page or not 0.0 <= crawl_delay_fraction <= 1.0:
            raise ValueError("page_bytes_sigma >= 0, 0 <= links_spread <= links_per_page and crawl_delay_fraction "
                             "within [0, 1] are required")
        if mirrored < 0:
            raise ValueError(f"mirrored must be >= 0, got {mirrored}")
        if markup not in ("filler", "real"):
            raise ValueError(f"markup must be 'filler' or 'real', got {markup!r}")
        if not 0.0 <= doc_fraction <= 1.0 or not 0.0 <= odd_link_fraction <= 0.5:
            raise ValueError("doc_fraction must be within [0, 1] and odd_link_fraction within [0, 0.5]")
        corpus = load_corpus(corpus_root) if markup == "real" else None
        domain = idna_host(domain)
        specs = [cls._plain_host(seed, i, domain, features, crawl_delay_fraction, crawl_delay) for i in range(hosts)]
        resources: dict[tuple[str, str], Resource] = {}
        extra: dict[tuple[str, str], tuple[Link, ...]] = {}
        feature_urls: dict[str, tuple[tuple[str, str], ...]] = {}
        nxdomain: tuple[str, ...] = ()
        trap_host = None
        if features:
            fs = build_features(specs, domain, huge_bytes=huge_bytes, slow_delay=slow_delay)
            for index, robots in fs.robots.items():
                old = specs[index]
                specs[index] = HostSpec(index=index, name=old.name, display=old.display, robots=robots, role=old.role)
            resources = fs.resources
            extra = {key: tuple(links) for key, links in fs.extra_links.items()}
            feature_urls = {name: tuple(keys) for name, keys in fs.features.items()}
            nxdomain = fs.nxdomain
            trap_host = fs.trap_host
        truth = None
        if structured:
            more, root_links, truth = build_structured(specs[0].name)
            resources = {**resources, **more}
            key = (specs[0].name, "/")
            extra = {**extra, key: (*extra.get(key, ()), *root_links)}
        if mirrored:
            resources = dict(resources)
            extra = dict(extra)
            # on the real-markup web a mirrored document is a real one (python3-doc), its links the host's pages
            docs = [mirror_document(corpus, seed, k, pages_per_host) if corpus is not None
                    else (mirror_body(seed, k, page_bytes), ("/",)) for k in range(mirrored)]
            for spec in specs:
                for k, (body, hrefs) in enumerate(docs):
                    path = mirror_path(k)
                    resources[(spec.name, path)] = Resource(
                        host=spec.name, path=path, feature="mirror", body=body,
                        links=tuple(Link(host=spec.name, path=href, href=href) for href in hrefs))
                key = (spec.name, "/")
                extra[key] = (*extra.get(key, ()),
                              *(Link(host=spec.name, path=mirror_path(k), href=mirror_path(k)) for k in range(mirrored)))
        graph = cls(
            seed=seed, domain=domain, hosts=tuple(specs), pages_per_host=pages_per_host,
            links_per_page=links_per_page, cross_host_fraction=cross_host_fraction, page_bytes=page_bytes,
            features=features, seed_hosts=seed_hosts, resources=resources, extra_links=extra,
            feature_urls=feature_urls, nxdomain=nxdomain, trap_host=trap_host, page_bytes_sigma=page_bytes_sigma,
            links_spread=links_spread, markup=markup, doc_fraction=doc_fraction,
            odd_link_fraction=odd_link_fraction if markup == "real" else 0.0, corpus=corpus,
        )
        graph.structured = truth
        return graph

    @staticmethod
    def _plain_host(
        seed: int, i: int, domain: str, features: bool, crawl_delay_fraction: float = 0.0, crawl_delay: float = 2.0
    ) -> HostSpec:
        name = f"h{i:04d}.{domain}"
        rules: tuple[Rule, ...] = ()
        # With features on, one ordinary host in five disallows the prefix "/p/1" (so /p/1.html and
        # /p/10.html .. /p/19.html): prefix matching exercised across many hosts.
        if features and i != 0 and random.Random(f"{seed}:robots:{i}").random() < 0.2:
            rules = (Rule(allow=False, pattern="/p/1"),)
        delay = None
        if crawl_delay_fraction and i != 0 and random.Random(f"{seed}:delay:{i}").random() < crawl_delay_fraction:
            delay = crawl_delay
        robots = RobotsSpec(groups=(RobotsGroup(agents=("*",), rules=rules, crawl_delay=delay),))
        return HostSpec(index=i, name=name, display=name, robots=robots)

    # -- lookups -----------------------------------------------------------------------------------

    def host(self, name: str) -> HostSpec | None:
        """The host called ``name`` (ASCII or Unicode, any case), or None if the web has no such host."""
        try:
            return self._by_name.get(idna_host(name))
        except UnicodeError:
            return None

    def resource(self, host: str, path: str) -> Resource | None:
        """What ``path`` (normalized path and query) on ``host`` answers, or None for a 404."""
        spec = self._by_name.get(host)
        if spec is None:
            return None
        res = self._resources.get((host, path))
        if res is not None:
            return res
        if path == "/":
            return self._page(spec, 0)
        m = _PAGE.fullmatch(path)
        if m is not None:
            j = int(m.group(1))
            return self._page(spec, j) if j < self.pages_per_host else None
        if self.odd_link_fraction:
            m = _MOVED.fullmatch(path)
            if m is not None and int(m.group(1)) < self.pages_per_host:
                # A moved page: /r/N answers 301 to /p/N.html (nginx does the same: bench.nginx_config).
                target = page_path(int(m.group(1)))
                return Resource(host=host, path=path, kind="redirect", status=301, feature="moved",
                                location=Link(host=host, path=target, href=target))
        if host == self.trap_host and path.startswith(TRAP_PREFIX) and _TRAP_TAIL.fullmatch(path[len(TRAP_PREFIX):]):
            return Resource(host=host, path=path, feature="trap", links=(Link(host=host, path=path + "a/", href="a/"),))
        return None

    def _page(self, spec: HostSpec, j: int) -> Resource:
        rng = random.Random(f"{self.seed}:{spec.index}:{j}")
        if self.markup == "real":
            return self._real_page(spec, j, rng)
        rand = rng.random
        links: list[Link] = []
        n = len(self.hosts)
        pages = self.pages_per_host
        cross = self.cross_host_fraction if n > 1 else 0.0
        cache = self._links
        count = self.links_per_page
        if self.links_spread:
            count += rng.randint(-self.links_spread, self.links_spread)
        for _ in range(count):
            p = int(rand() * pages)
            if rand() < cross:
                t = int(rand() * (n - 1))
                key = (t + (t >= spec.index), p, 3)
            else:
                # written as "/p/3.html", or relative: "p/3.html" from the root, "3.html" from a page
                key = (spec.index, p, 0 if p == 0 or rand() < 0.5 else (1 if j == 0 else 2))
            link = cache.get(key)
            if link is None:
                link = cache[key] = self._make_link(*key)
            links.append(link)
        links.extend(self._extra_links.get((spec.name, page_path(j)), ()))
        size = self.page_bytes
        if self.page_bytes_sigma:
            size = int(size * math.exp(rng.gauss(0.0, self.page_bytes_sigma)))
        return Resource(host=spec.name, path=page_path(j), links=tuple(links), size=size)

    @property
    def doc_hosts(self) -> int:
        """How many hosts serve real documents (0 on the filler web or without python3-doc)."""
        return sum(1 for spec in self.hosts if self.is_doc_host(spec.index))

    def is_doc_host(self, index: int) -> bool:
        """Whether host ``index`` serves real documents (a doc_fraction of the hosts, when the corpus is there)."""
        return bool(self.doc_fraction) and random.Random(f"{self.seed}:doc:{index}").random() < self.doc_fraction

    def _real_page(self, spec: HostSpec, j: int, rng: random.Random) -> Resource:
        """A page of the real-markup web: a real document on a doc host, else a generated page. Its links: on a
        generated page the host's navigation and footer (the same on every page), then the text's; on a
        document one per link slot. A link is drawn like a filler page's, except that odd_link_fraction of them
        go to a missing page (404), a moved one (/r/N, a 301) or a host that does not resolve."""
        index = spec.index
        template = self._templates.get(index)
        if template is None:
            template = self._templates[index] = self._host_template(spec)
        doc, nav, footer = template
        links: list[Link] = []
        fixed: tuple[Link, ...] = ()
        if doc:
            assert self.corpus is not None
            d = rng.randrange(len(self.corpus.documents))
            document = self.corpus.documents[d]
            count, size = document.link_slots, document.size
        else:
            d = -1
            count = _markup.link_count(rng, len(nav), len(footer)) - len(nav) - len(footer)
            size, fixed = _markup.page_size(rng), footer
            links.extend(nav)
        rand = rng.random
        n = len(self.hosts)
        pages = self.pages_per_host
        cross = self.cross_host_fraction if n > 1 else 0.0
        odd = self.odd_link_fraction
        cache = self._links
        for _ in range(count):
            p = int(rand() * pages)
            if odd and rand() < odd:
                r = rand()
                # A few dead and moved pages per host, linked again and again, as on a real site.
                if r < 0.4:
                    key = (index, pages + int(rand() * DEAD_PER_HOST), 0)  # a page that is not there: 404
                elif r < 0.8:
                    moved = min(MOVED_PER_HOST, pages - 1)
                    key = (index, 1 + int(rand() * moved), 5) if moved > 0 else (index, 0, 0)
                else:
                    key = (int(rand() * len(NX_LABELS)), p, 6)
            elif rand() < cross:
                t = int(rand() * (n - 1))
                key = (t + (t >= index), p, 3)
            else:
                key = (index, p, 0 if p == 0 or rand() < 0.5 else (1 if j == 0 else 2))
            link = cache.get(key)
            if link is None:
                link = cache[key] = self._make_link(*key)
            links.append(link)
        links.extend(fixed)
        links.extend(self._extra_links.get((spec.name, page_path(j)), ()))
        return Resource(host=spec.name, path=page_path(j), links=tuple(links), size=size,
                        markup="doc" if doc else "gen", doc=d, nav=len(nav), footer=len(footer))

    def _host_template(self, spec: HostSpec) -> tuple[bool, tuple[Link, ...], tuple[Link, ...]]:
        """Whether the host serves documents, and (for a generated site) its navigation and footer links."""
        if self.is_doc_host(spec.index):
            return True, (), ()
        nav_count, footer_count = _markup.host_shape(self.seed, spec.index)
        rng = random.Random(f"{self.seed}:template:{spec.index}")
        pages = self.pages_per_host
        nav = tuple(self._make_link(spec.index, 0 if k == 0 else int(rng.random() * pages), 0)
                    for k in range(nav_count))
        n = len(self.hosts)
        footer = []
        for _ in range(footer_count):
            if n > 1 and rng.random() < 0.3:
                t = int(rng.random() * (n - 1))
                footer.append(self._make_link(t + (t >= spec.index), 0, 3))
            else:
                footer.append(self._make_link(spec.index, int(rng.random() * pages), 0))
        return False, nav, tuple(footer)

    def _make_link(self, index: int, p: int, form: int) -> Link:
        """Form 0: "/p/3.html"; 1: "p/3.html" (from the root); 2: "3.html" (from a page); 3: absolute;
        5: "/r/3" (a moved page); 6: absolute, to NX_LABELS[index] under the domain (does not resolve)."""
        if form == 5:
            path = f"/r/{p}"
            return Link(host=self.hosts[index].name, path=path, href=path, text=f"moved {p}")
        if form == 6:
            target = f"{NX_LABELS[index]}.{self.domain}"
            path = page_path(p)
            return Link(host=target, path=path, href=f"http://{target}:{PORT}{path}", text=target)
        target = self.hosts[index].name
        path = page_path(p)
        if form == 3:
            return Link(host=target, path=path, href=f"http://{target}:{PORT}{path}", text=f"{target} {p}")
        href = (path, path[1:], path[3:])[form]
        return Link(host=target, path=path, href=href, text=f"page {p}")

    def robots(self, host: str) -> RobotsSpec | None:
        spec = self._by_name.get(host)
        return None if spec is None else spec.robots

    def iter_resources(self) -> Iterator[Resource]:
        """Every finite resource of the web (ordinary pages and stored features; not the trap)."""
        for spec in self.hosts:
            for j in range(self.pages_per_host):
                yield self._page(spec, j)
        yield from self._resources.values()

    # -- URLs for tests --------------------------------------------------------------------------

    def url(self, host: str, path: str, *, port: int | None = None) -> str:
        return make_url(idna_host(host), norm_path(path), port)

    def seeds(self, *, port: int | None = None) -> list[str]:
        """The crawl's start URLs: the root pages of the first ``seed_hosts`` hosts (host 0 is the hub)."""
        return [make_url(h.name, "/", port) for h in self.hosts[: self.seed_hosts]]

    def zone(self, addresses: Sequence[str] = ("127.0.0.1",)) -> dict[str, str]:
        """Host name (ASCII) -> its address for the DNS server; the NXDOMAIN names are left out. With several
        `addresses` the hosts are dealt over them in order (host i on ``addresses[i % len(addresses)]``), so many
        host names share each server address, as on shared hosting."""
        if not addresses:
            raise ValueError("zone needs at least one address")
        return {h.name: addresses[i % len(addresses)] for i, h in enumerate(self.hosts)}

    def feature_names(self) -> list[str]:
        return sorted(self._feature_urls)

    def feature(self, name: str, *, port: int | None = None) -> list[str]:
        """The URLs that carry feature ``name`` (e.g. ``"gzip"``, ``"redirect_chain"``, ``"trap"``)."""
        if name not in self._feature_urls:
            raise KeyError(f"no feature {name!r} in this graph; it has {', '.join(self.feature_names())}")
        return [make_url(h, p, port) for h, p in self._feature_urls[name]]

    def role(self, role: str) -> HostSpec:
        """The host playing ``role`` (``"hub"``, ``"robots-agent"``, ``"redirects"``, ...)."""
        for spec in self.hosts:
            if spec.role == role:
                return spec
        raise KeyError(f"no host has role {role!r} (features={self.features})")

    def crawl_delay(self, host: str, user_agent: str = "peercrawl") -> float | None:
        robots = self.robots(host)
        return None if robots is None else robots.crawl_delay(user_agent)

    def expected(
        self,
        *,
        user_agent: str = "peercrawl",
        max_depth: int | None = None,
        max_body: int = 10 * 2**20,
        max_redirect_hops: int = 5,
        trap_guard: Callable[[str], bool] | None = None,
        skip_suffixes: Collection[str] | None = None,
        port: int | None = None,
        render: bool = False,
    ) -> Expected:
        """The oracle: what a correct crawl fetches and must not fetch (see ``peerlab.localweb.oracle``)."""
        return expected(
            self, user_agent=user_agent, max_depth=max_depth, max_body=max_body,
            max_redirect_hops=max_redirect_hops, trap_guard=trap_guard or TrapGuard(),
            skip_suffixes=DEFAULT_SKIP_SUFFIXES if skip_suffixes is None else skip_suffixes, port=port,
            render=render,
        )

    def __repr__(self) -> str:
        return (f"SiteGraph(seed={self.seed}, hosts={len(self.hosts)}, pages_per_host={self.pages_per_host}, "
                f"features={self.features}, markup={self.markup!r})")



def mirror_path(k: int) -> str:
    """The path of mirrored document `k` (the same bytes on every host)."""
    return f"/mirror/{k}.html"


def mirror_document(corpus: Corpus, seed: int, k: int, pages: int) -> tuple[bytes, tuple[str, ...]]:
    """Mirrored document `k` of the real-markup web: a python3-doc page whose links are the host's pages (by
    absolute path, so the same bytes link within whichever host serves them), and those paths."""
    rng = random.Random(f"{seed}:mirror:{k}")
    document = corpus.documents[rng.randrange(len(corpus.documents))]
    hrefs = tuple(page_path(rng.randrange(pages)) for _ in range(document.link_slots))
    return document.render(hrefs, mirror_path(k)).encode("utf-8"), hrefs


def mirror_body(seed: int, k: int, size: int) -> bytes:
    """Mirrored document `k` of the web of `seed`: an HTML page of about `size` bytes whose only link is
    relative (so the same bytes link to the root of whichever host serves them)."""
    rng = random.Random(f"{seed}:mirror:{k}")
    words = []
    total = 0
    while total < size:
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    text = " ".join(words)
    return (f"<!DOCTYPE html>\n<html><head><title>Mirrored document {k}</title></head>\n"
            f"<body><h1>Mirrored document {k}</h1>\n<p>{text}</p>\n<p><a href=\"/\">home</a></p>\n"
            "</body></html>\n").encode("ascii")
