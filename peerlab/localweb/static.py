"""The generated web written out as static files, for a real web server (nginx) to serve fast.

Layout: one directory per host, named by its ASCII host name, so nginx's ``root <dir>/$host;`` picks the
virtual host; ``/`` is ``index.html``. Only ordinary pages and robots.txt are written (feature hosts need
the live server's logic), so the graph must be generated with ``features=False``. The absolute links in the
pages carry the port, so a site is written for one port; a stamp file lets a later run reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .graph import SiteGraph, page_path
from .render import render, render_robots

__all__ = ["read_stamp", "site_stamp", "write_site"]

_STAMP = ".peercrawl-site.json"


def site_stamp(graph: SiteGraph, port: int) -> dict[str, object]:
    """What identifies a written site: the graph's parameters, the port its links carry, and a digest of
    two rendered pages (so a change in the generator or the renderer invalidates an old site)."""
    digest = hashlib.sha256()
    for spec, j in ((graph.hosts[0], 0), (graph.hosts[-1], graph.pages_per_host - 1)):
        res = graph.resource(spec.name, page_path(j))
        assert res is not None
        digest.update(render(graph, res, port).body)
    return {
        "sample_sha256": digest.hexdigest(),
        "seed": graph.seed,
        "hosts": len(graph.hosts),
        "pages_per_host": graph.pages_per_host,
        "links_per_page": graph.links_per_page,
        "cross_host_fraction": graph.cross_host_fraction,
        "page_bytes": graph.page_bytes,
        "domain": graph.domain,
        "markup": graph.markup,
        "doc_hosts": graph.doc_hosts,
        "odd_link_fraction": graph.odd_link_fraction,
        "port": port,
    }


def read_stamp(directory: str | Path) -> dict[str, object] | None:
    """The stamp of the site in ``directory``, or None if there is no complete site there."""
    try:
        return json.loads((Path(directory) / _STAMP).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_site(graph: SiteGraph, directory: str | Path, *, port: int) -> Path:
    """Write every page and robots.txt of ``graph`` under ``directory`` for a server on ``port``.

    Returns the directory. If it already holds this very site (same stamp), nothing is written again.
    The stamp is written last, so an interrupted write is never mistaken for a complete site.
    """
    if graph.features:
        raise ValueError("a static site holds only ordinary pages: generate the graph with features=False")
    root = Path(directory)
    stamp = site_stamp(graph, port)
    if read_stamp(root) == stamp:
        return root
    root.mkdir(parents=True, exist_ok=True)
    (root / _STAMP).unlink(missing_ok=True)
    for spec in graph.hosts:
        host_dir = root / spec.name
        (host_dir / "p").mkdir(parents=True, exist_ok=True)
        robots = render_robots(graph, spec.name, "/robots.txt")
        assert robots is not None and robots.status == 200
        (host_dir / "robots.txt").write_bytes(robots.body)
        for j in range(graph.pages_per_host):
            res = graph.resource(spec.name, page_path(j))
            assert res is not None
            name = "index.html" if j == 0 else f"p/{j}.html"
            (host_dir / name).write_bytes(render(graph, res, port).body)
    for dirpath, _dirnames, _files in os.walk(root):
        os.chmod(dirpath, 0o755)  # nginx workers run as an unprivileged user
    (root / _STAMP).write_text(json.dumps(stamp), encoding="utf-8")
    return root
