"""The designated feature hosts of a generated web: every case a correct crawler must get right.

Each feature lives on its own host so a failing test names it: robots.txt variants, redirect chains and a
loop, error pages, gzip, odd charsets, slow / busy / huge answers, a trap, nofollow, unresolvable names,
link forms that normalize to one page, and IDNA host names. Feature pages are linked only from their
host's root page, which the hub (host 0, the seed) links to; so what reaches them is known exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import PORT, HostSpec, Link, Resource, idna_host, norm_path
from .robots_spec import RobotsGroup, RobotsSpec, Rule

__all__ = ["IDNA_LABELS", "MIN_FEATURE_HOSTS", "ROLES", "TRAP_PREFIX", "FeatureSet", "build_features"]

#: Host index of each role; the two IDNA hosts are the last two hosts.
ROLES = {
    "hub": 0,
    "robots-agent": 1,
    "robots-star": 2,
    "robots-404": 3,
    "robots-500": 4,
    "robots-redirect": 5,
    "redirects": 6,
    "content": 7,
    "charsets": 8,
    "timing": 9,
    "traps": 10,
    "forms": 11,
}
IDNA_LABELS = ("bücher", "日本語")
MIN_FEATURE_HOSTS = len(ROLES) + len(IDNA_LABELS)
TRAP_PREFIX = "/trap/"
_PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\n" + bytes(range(256)) + b"\n%%EOF\n"
_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000d4944415478da63f8cfc0f01f0005000201a5f1d3a70000000049454e44ae426082"
)


@dataclass(slots=True)
class FeatureSet:
    """What the feature builder adds to a graph."""

    robots: dict[int, RobotsSpec] = field(default_factory=dict)
    resources: dict[tuple[str, str], Resource] = field(default_factory=dict)
    extra_links: dict[tuple[str, str], list[Link]] = field(default_factory=dict)
    features: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    nxdomain: tuple[str, ...] = ()
    trap_host: str | None = None


def _abs(host: str, path: str, *, written: str | None = None) -> str:
    return f"http://{written or host}:{PORT}{path}"


class _Builder:
    def __init__(self, hosts: list[HostSpec], domain: str, out: FeatureSet) -> None:
        self.hosts = hosts
        self.domain = domain
        self.out = out

    def name(self, role: str) -> str:
        return self.hosts[ROLES[role]].name

    def tag(self, feature: str, host: str, path: str) -> None:
        self.out.features.setdefault(feature, []).append((host, path))

    def add(self, res: Resource, *, from_root: bool = True) -> Resource:
        self.out.resources[(res.host, res.path)] = res
        if res.feature:
            self.tag(res.feature, res.host, res.path)
        if from_root:
            self.link_from(res.host, "/", res.host, res.path)
        return res

    def link_from(self, src_host: str, src_path: str, host: str, path: str, **kw: object) -> None:
        href = kw.pop("href", None) or path
        link = Link(host=host, path=path, href=str(href), text=str(kw.pop("text", path)), **kw)  # type: ignore[arg-type]
        self.out.extra_links.setdefault((src_host, src_path), []).append(link)

    def page(self, host: str, path: str, feature: str = "", links: tuple[Link, ...] = (), **kw: object) -> Resource:
        return Resource(host=host, path=norm_path(path), feature=feature, links=links, **kw)  # type: ignore[arg-type]


def build_features(hosts: list[HostSpec], domain: str, *, huge_bytes: int, slow_delay: float) -> FeatureSet:
    """Designate feature hosts among ``hosts`` (renaming the IDNA ones) and describe their resources."""
    out = FeatureSet()
    b = _Builder(hosts, domain, out)
    for offset, label in enumerate(IDNA_LABELS):
        index = len(hosts) - len(IDNA_LABELS) + offset
        display = f"{label}.{domain}"
        hosts[index] = HostSpec(index=index, name=idna_host(display), display=display, robots=hosts[index].robots, role="idna")
    for role, index in ROLES.items():
        spec = hosts[index]
        hosts[index] = HostSpec(index=index, name=spec.name, display=spec.display, robots=spec.robots, role=role)
    hub = b.name("hub")
    for role, index in ROLES.items():
        if role != "hub":
            b.link_from(hub, "/", hosts[index].name, "/", href=_abs(hosts[index].name, "/"), text=role)
    for index in range(len(hosts) - len(IDNA_LABELS), len(hosts)):
        spec = hosts[index]
        b.link_from(hub, "/", spec.name, "/", href=_abs(spec.name, "/", written=spec.display), text=spec.display)
        b.tag("idna", spec.name, "/")
    _robots(b)
    _redirects(b)
    _content(b)
    _charsets(b)
    _timing(b, huge_bytes=huge_bytes, slow_delay=slow_delay)
    _traps(b)
    _forms(b)
    _scripts(b)
    return out


def _robots(b: _Builder) -> None:
    out = b.out
    agent = b.name("robots-agent")
    out.robots[ROLES["robots-agent"]] = RobotsSpec(
        groups=(
            RobotsGroup(agents=("*",), rules=(Rule(allow=False, pattern="/"),)),
            RobotsGroup(
                agents=("PeerCrawl",),
                rules=(
                    Rule(allow=False, pattern="/private/"),
                    Rule(allow=True, pattern="/private/open.html"),
                    Rule(allow=False, pattern="/*.php$"),
                    Rule(allow=False, pattern="/*?sort="),
                ),
                crawl_delay=0.3,
            ),
        )
    )
    b.tag("robots_agent_group", agent, "/robots.txt")
    for path in ("/private/secret.html", "/private/open.html", "/list.html?sort=asc", "/list.html?page=2",
                 "/app/index.php", "/app/index.php?page=2"):
        b.add(b.page(agent, path, "robots_rules"))
    b.add(b.page(agent, "/private/secret2.html", "robots_rules"), from_root=False)

    star = b.name("robots-star")
    out.robots[ROLES["robots-star"]] = RobotsSpec(
        groups=(
            RobotsGroup(agents=("otherbot",), rules=(Rule(allow=False, pattern="/"),)),
            RobotsGroup(
                agents=("*",),
                rules=(
                    Rule(allow=False, pattern="/tmp"),
                    Rule(allow=False, pattern="/docs/"),
                    Rule(allow=True, pattern="/docs/public/"),
                    Rule(allow=False, pattern="/*/edit$"),
                ),
                crawl_delay=0.2,
            ),
        )
    )
    b.tag("crawl_delay", agent, "/robots.txt")
    b.tag("crawl_delay", star, "/robots.txt")
    for path in ("/tmp.html", "/tmp/x.html", "/tmpl.html", "/docs/a.html", "/docs/public/b.html",
                 "/wiki/edit", "/wiki/edit/history"):
        b.add(b.page(star, path, "robots_rules"))

    out.robots[ROLES["robots-404"]] = RobotsSpec(status=404)
    b.add(b.page(b.name("robots-404"), "/anything/x.html", "robots_404"))
    out.robots[ROLES["robots-500"]] = RobotsSpec(status=500)
    b.add(b.page(b.name("robots-500"), "/never.html", "robots_500"))
    out.robots[ROLES["robots-redirect"]] = RobotsSpec(
        status=301,
        redirect_path="/robots-real.txt",
        groups=(RobotsGroup(agents=("*",), rules=(Rule(allow=False, pattern="/secret/"),)),),
    )
    redirect_host = b.name("robots-redirect")
    b.tag("robots_redirect", redirect_host, "/robots.txt")
    for path in ("/secret/x.html", "/open/y.html"):
        b.add(b.page(redirect_host, path, "robots_redirect"))


def _redirects(b: _Builder) -> None:
    host = b.name("redirects")
    content = b.name("content")
    chains = [
        ((301,), (host, "/r/final0.html")),
        ((302, 307, 308), (content, "/from-redirect.html")),
        ((301, 302, 307, 308, 301), (host, "/r/final2.html")),
        ((301, 301, 302, 302, 307, 307), (host, "/r/final3.html")),
    ]
    for k, (codes, (final_host, final_path)) in enumerate(chains):
        feature = "redirect_over_limit" if len(codes) > 5 else "redirect_chain"
        for hop, code in enumerate(codes):
            path = f"/r/c{k}/{hop}"
            if hop + 1 < len(codes):
                nxt = f"/r/c{k}/{hop + 1}"
                written = (nxt, f"{hop + 1}", _abs(host, nxt))[hop % 3]
                loc = Link(host=host, path=nxt, href=written)
            else:
                loc = Link(host=final_host, path=final_path, href=_abs(final_host, final_path))
            b.add(b.page(host, path, feature, kind="redirect", status=code, location=loc), from_root=hop == 0)
        if final_host == host:
            b.add(b.page(host, final_path, feature), from_root=False)
    b.add(b.page(host, "/r/loop/a", "redirect_loop", kind="redirect", status=302,
                 location=Link(host=host, path="/r/loop/b", href="/r/loop/b")))
    b.add(b.page(host, "/r/loop/b", "redirect_loop", kind="redirect", status=302,
                 location=Link(host=host, path="/r/loop/a", href=_abs(host, "/r/loop/a"))), from_root=False)
    agent = b.name("robots-agent")
    b.add(b.page(host, "/r/to-private", "redirect_to_disallowed", kind="redirect", status=302,
                 location=Link(host=agent, path="/private/secret2.html", href=_abs(agent, "/private/secret2.html"))))
    nx = f"nx-2.{b.domain}"
    b.add(b.page(host, "/r/to-nx", "redirect_to_nxdomain", kind="redirect", status=301,
                 location=Link(host=nx, path="/", href=_abs(nx, "/"))))


def _content(b: _Builder) -> None:
    host = b.name("content")
    b.link_from(host, "/", host, "/missing.html")
    b.tag("not_found", host, "/missing.html")
    b.add(b.page(host, "/gone.html", "gone", kind="missing", status=410))
    b.add(b.page(host, "/img/logo.png", "binary", kind="binary", content_type="image/png", body=_PNG))
    b.add(b.page(host, "/files/paper.pdf", "binary", kind="binary", content_type="application/pdf", body=_PDF))
    b.add(b.page(host, "/download?id=7", "binary", kind="binary", content_type="application/pdf", body=_PDF))
    only = b.add(b.page(host, "/gz/only.html", "gzip", gzip=True), from_root=False)
    b.add(b.page(host, "/gz/index.html", "gzip", gzip=True,
                 links=(Link(host=host, path=only.path, href="only.html"),)))
    b.add(b.page(host, "/from-redirect.html", "redirect_chain"), from_root=False)


def _charsets(b: _Builder) -> None:
    host = b.name("charsets")
    cases = [
        ("/cs/gbk.html", "gbk", "GBK", "header", "这是一个中文页面。", "/cs/中文.html"),
        ("/cs/gb2312.html", "gbk", "gb2312", "meta", "朱镕基的页面，声明为 GB2312。", "/cs/镕.html"),
        ("/cs/sjis.html", "shift_jis", "Shift_JIS", "header", "日本語のページです。", "/cs/日本.html"),
        ("/cs/latin1-header.html", "iso-8859-1", "ISO-8859-1", "header", "Un café à Paris.", "/cs/café.html"),
        ("/cs/latin1-meta.html", "iso-8859-1", "iso-8859-1", "meta", "Une question naïve.", "/cs/naïve.html"),
        ("/cs/latin1-none.html", "iso-8859-1", "", "none",
         "Crème brûlée, pâté, façade, déjà vu, à la française : élève très âgé.", "/cs/plain.html"),
    ]
    for path, charset, label, declare, text, target in cases:
        dest = b.add(b.page(host, target, "charset"), from_root=False)
        b.add(b.page(host, path, "charset", charset=charset, charset_label=label, declare=declare, text=text,
                     links=(Link(host=host, path=dest.path, href=target, text=text[:8]),)))


def _timing(b: _Builder, *, huge_bytes: int, slow_delay: float) -> None:
    host = b.name("timing")
    cases: tuple[tuple[str, str, str, dict[str, object]], ...] = (
        ("/slow.html", "/after-slow.html", "slow", {"delay": slow_delay}),
        ("/busy.html", "/after-busy.html", "retry_after", {"first_status": 429}),
        ("/maint.html", "/after-maint.html", "retry_after", {"first_status": 503}),
    )
    for path, after, feature, kw in cases:
        dest = b.add(b.page(host, after, feature), from_root=False)
        b.add(b.page(host, path, feature, links=(Link(host=host, path=dest.path, href=after),), **kw))
    b.add(b.page(host, "/huge.html", "huge", kind="huge", size=huge_bytes))


def _traps(b: _Builder) -> None:
    host = b.name("traps")
    b.out.trap_host = host
    b.link_from(host, "/", host, TRAP_PREFIX)
    b.tag("trap", host, TRAP_PREFIX)
    dests = {p: b.add(b.page(host, p, "nofollow"), from_root=False) for p in ("/nf/a.html", "/nf/b.html", "/nf/c.html")}
    b.add(b.page(host, "/nofollow.html", "nofollow", links=(
        Link(host=host, path=dests["/nf/a.html"].path, href="nf/a.html", nofollow=True, rel="nofollow"),
        Link(host=host, path=dests["/nf/b.html"].path, href="/nf/b.html", nofollow=True, rel="noopener nofollow"),
        Link(host=host, path=dests["/nf/c.html"].path, href="nf/c.html"),
    )))
    meta_dest = b.add(b.page(host, "/nf/d.html", "meta_nofollow"), from_root=False)
    b.add(b.page(host, "/meta-nofollow.html", "meta_nofollow", meta_nofollow=True,
                 links=(Link(host=host, path=meta_dest.path, href="/nf/d.html"),)))
    nx1, nx2 = f"nx-1.{b.domain}", f"nx-2.{b.domain}"
    b.out.nxdomain = (nx1, nx2)
    b.add(b.page(host, "/outside.html", "nxdomain", links=(
        Link(host=nx1, path="/", href=_abs(nx1, "/")),
        Link(host=nx2, path="/x.html", href=_abs(nx2, "/x.html")),
    )))


def _forms(b: _Builder) -> None:
    host = b.name("forms")
    target = b.add(b.page(host, "/forms/target.html", "link_forms"), from_root=False)
    upper = f"HTTP://{host.upper()}:{PORT}/forms/target.html#frag"
    hrefs = ("../../forms/target.html", "./../../forms/target.html#x", "/forms/./target.html",
             "/forms/../forms/target.html", "/forms/%74arget.html", upper, f"//{host}:{PORT}/forms/target.html",
             _abs(host, "/forms/target.html"))
    links = tuple(Link(host=host, path=target.path, href=h) for h in hrefs)
    links += (Link(host=host, path="/dir/sub/forms.html", href="#top"),)
    b.add(b.page(host, "/dir/sub/forms.html", "link_forms", links=links))
    other = b.add(b.page(host, "/other/x.html", "base_href"), from_root=False)
    b.add(b.page(host, "/base/page.html", "base_href", base_href="/other/",
                 links=(Link(host=host, path=other.path, href="x.html"),)))


#: The script of the pages a script builds: it reads the page's data (its text and links) and writes them into
#: the page's empty ``<div id="app">``.
APP_JS = b"""(function () {
  var me = document.currentScript;
  fetch(me.getAttribute("data-src")).then(function (r) { return r.json(); }).then(function (data) {
    var html = "<h1>" + data.title + "</h1><p>" + data.text + "</p><ul>";
    data.links.forEach(function (l) { html += '<li><a href="' + l.href + '">' + l.text + "</a></li>"; });
    document.getElementById("app").innerHTML = html + "</ul>";
  });
})();
"""
#: The pages a script builds (``scripted`` feature): path, its links (path, written by the script), its text.
SCRIPTED_PAGES: tuple[tuple[str, tuple[tuple[str, bool], ...], str], ...] = (
    ("/app/home.html", (("/app/made-1.html", True), ("/app/made-2.html", True), ("/app/deep.html", True)),
     "This page exists only once its script has run; its three links too."),
    ("/app/deep.html", (("/app/made-3.html", True), ("/app/home.html", True)),
     "A page reached only through a script's link, with a script-written link of its own."),
    # quiet pages: a script that builds nothing new (its links are in the HTML too): renders learn it
    *((f"/quiet/q{i}.html", ((f"/quiet/q{i + 1}.html", False),), "") for i in range(1, 6)),
)


def _scripts(b: _Builder) -> None:
    """Pages whose links and text exist only after their script runs (``scripted``), and pages whose script adds
    nothing (``script_quiet``): a rendering crawler finds the first's links and learns to skip the second's."""
    import json

    host = b.name("content")
    b.add(b.page(host, "/js/app.js", "script_resource", kind="binary", content_type="application/javascript",
                 body=APP_JS), from_root=False)
    for path, links, text in SCRIPTED_PAGES:
        quiet = path.startswith("/quiet/")
        made = tuple(Link(host=host, path=target, href=target, text=target.rsplit("/", 1)[-1], scripted=scripted)
                     for target, scripted in links)
        data = path.rsplit(".", 1)[0] + ".json"
        payload = {"title": path, "text": text,
                   "links": [{"href": link.href, "text": link.text} for link in made if link.scripted]}
        b.add(b.page(host, data, "script_resource", kind="binary", content_type="application/json",
                     body=json.dumps(payload).encode()), from_root=False)
        b.add(b.page(host, path, "script_quiet" if quiet else "scripted", links=made, script_data=data,
                     script_text=text), from_root=path in ("/app/home.html", "/quiet/q1.html"))
        for link in made:
            if link.scripted and b.out.resources.get((host, link.path)) is None and link.path.startswith("/app/made"):
                b.add(b.page(host, link.path, "scripted"), from_root=False)
    b.add(b.page(host, "/quiet/q6.html", "script_quiet"), from_root=False)
