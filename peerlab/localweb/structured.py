"""Pages with structured content, for the plug-in tests (``SiteGraph.generate(..., structured=True)``): a shop
whose product pages hold known fields, articles in three languages with known main text between a menu and a
footer, and a documentation site with print versions, an archive and tracking parameters in its links.

All of it hangs off the hub's root (``/shop/``, ``/articles/``, ``/docs/``), so a crawl from the usual seeds
reaches it; with the option off the web is exactly what it was. `StructuredTruth` is what the oracle knows:
the item each product page must give, the main text of each article and its language, and which documentation
URLs a documentation URL filter drops or rewrites (`examples/docs_filter.py`'s rules).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from .model import PORT, Link, Resource, make_url

__all__ = ["StructuredTruth", "build_structured"]

_PRODUCTS = (
    ("Walnut desk lamp", "1,299.00", "LMP-001", ("lighting", "walnut")),
    ("Linen armchair", "349.50", "CHR-014", ("seating",)),
    ("Stoneware mug", "12.00", "MUG-102", ("kitchen", "stoneware", "gift")),
    ("Oak bookshelf", "489.99", "SHF-007", ("storage", "oak")),
    ("Wool throw", "79.00", "THR-033", ("textiles",)),
)

_ARTICLES = (
    ("en", "How rivers shape valleys",
     ("A river carries sand and gravel that scrape its bed a little deeper with every flood.",
      "Over thousands of years the valley widens as its walls slump toward the water.",
      "Where the rock is hard the river cuts a gorge; where it is soft the valley grows wide and gentle.")),
    ("fr", "Comment les rivières creusent les vallées",
     ("Une rivière transporte du sable et des graviers qui creusent son lit à chaque crue.",
      "Au fil des millénaires, la vallée s'élargit à mesure que ses versants glissent vers l'eau.",
      "Là où la roche est dure, la rivière taille une gorge ; là où elle est tendre, la vallée devient large.")),
    ("de", "Wie Flüsse Täler formen",
     ("Ein Fluss trägt Sand und Kies, die sein Bett bei jedem Hochwasser ein wenig tiefer schleifen.",
      "Über Jahrtausende wird das Tal breiter, während seine Hänge zum Wasser hin abrutschen.",
      "Wo das Gestein hart ist, schneidet der Fluss eine Schlucht; wo es weich ist, wird das Tal weit.")),
    ("en", "Why bread rises",
     ("Yeast feeds on the sugars in flour and breathes out carbon dioxide as it grows.",
      "The gluten in the dough stretches around each bubble of gas and holds it in place.",
      "In the oven the gas expands, the yeast dies, and the crumb sets around the holes it left.")),
)

_DOC_PAGES = ("intro", "install", "usage")


@dataclass(frozen=True, slots=True)
class StructuredTruth:
    """What a correct extraction finds (paths on the hub host; `urls` makes them URLs)."""

    host: str
    products: dict[str, dict]  # path -> the item the product rule makes (name, price, sku, tags)
    articles: dict[str, dict]  # path -> {"title", "language", "paragraphs"}
    docs_dropped: frozenset[str]  # paths reachable only through links the documentation filter drops
    docs_rewritten: dict[str, str]  # path with tracking parameters -> the path it is rewritten to

    def url(self, path: str, port: int | None) -> str:
        return make_url(self.host, path, port)


def _page(title: str, body: str, lang: str = "en") -> bytes:
    return (f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"</head>\n<body>\n{body}\n</body></html>\n").encode("utf-8")


def _anchor(link: Link) -> str:
    return f'<a href="{html.escape(link.href)}">{html.escape(link.text)}</a>'


def build_structured(hub: str) -> tuple[dict[tuple[str, str], Resource], list[Link], StructuredTruth]:
    """The structured resources on host `hub`, the links the hub's root gains, and the truth about them."""
    res: dict[tuple[str, str], Resource] = {}

    def add(path: str, title: str, body: str, links: list[Link], lang: str = "en") -> None:
        res[(hub, path)] = Resource(host=hub, path=path, links=tuple(links), feature="structured",
                                    body=_page(title, body, lang))

    def link(path: str, text: str, href: str | None = None) -> Link:
        return Link(host=hub, path=path, href=href or path, text=text)

    products: dict[str, dict] = {}
    shop_links = []
    for k, (name, price, sku, tags) in enumerate(_PRODUCTS):
        path = f"/shop/p{k}.html"
        shop_links.append(link(path, name))
        back = link("/shop/", "All products")
        body = (f'<nav>{_anchor(back)}</nav>\n<div class="product">\n<h1 class="name">{html.escape(name)}</h1>\n'
                f'<img class="main" src="/img/p{k}.png" alt="{html.escape(name)}">\n'
                f'<p>Price: <span class="price">${price}</span></p>\n'
                f'<p>Item <span itemprop="sku">{sku}</span></p>\n<ul class="tags">'
                + "".join(f"<li>{t}</li>" for t in tags) + "</ul>\n</div>")
        add(path, name, body, [back])
        products[path] = {"type": "product", "name": name, "price": float(price.replace(",", "")), "sku": sku,
                          "tags": list(tags), "image": f"/img/p{k}.png"}
    add("/shop/", "Shop", "<h1>Shop</h1>\n<ul>" + "".join(f"<li>{_anchor(x)}</li>" for x in shop_links) + "</ul>",
        shop_links)

    articles: dict[str, dict] = {}
    art_links = []
    menu = [link("/articles/", "Articles"), link("/shop/", "Shop"), link("/docs/", "Docs")]
    for k, (lang, title, paragraphs) in enumerate(_ARTICLES):
        path = f"/articles/a{k}.html"
        art_links.append(link(path, title))
        body = ("<header><nav><ul>" + "".join(f"<li>{_anchor(x)}</li>" for x in menu) + "</ul></nav></header>\n"
                f"<main><article>\n<h1>{html.escape(title)}</h1>\n"
                + "\n".join(f"<p>{html.escape(p)}</p>" for p in paragraphs)
                + "\n</article></main>\n<footer><p>Copyright the local web. All rights reserved. "
                  "Terms of use. Privacy.</p></footer>")
        add(path, title, body, menu, lang)
        articles[path] = {"title": title, "language": lang, "paragraphs": list(paragraphs)}
    add("/articles/", "Articles", "<h1>Articles</h1>\n<ul>" + "".join(f"<li>{_anchor(x)}</li>" for x in art_links)
        + "</ul>", art_links)

    doc_links = []
    dropped: set[str] = set()
    rewritten: dict[str, str] = {}
    for name in _DOC_PAGES:
        path = f"/docs/guide/{name}.html"
        tracked = f"{path}?utm_source=nav"
        printed = f"/docs/print/{name}.html"
        # the guide page is linked only with a tracking parameter (the filter rewrites it to the bare path)
        doc_links.append(link(tracked, name.title()))
        rewritten[tracked] = path
        dropped.add(printed)
        prev = link("/docs/", "Contents")
        pr = link(printed, "Print this page")
        add(path, name.title(), f"<nav>{_anchor(prev)}</nav>\n<h1>{name.title()}</h1>\n<p>The {name} chapter.</p>\n"
            f"<p>{_anchor(pr)}</p>", [prev, pr])
        add(tracked, name.title(), f"<nav>{_anchor(prev)}</nav>\n<h1>{name.title()}</h1>\n"
            f"<p>The {name} chapter.</p>\n<p>{_anchor(pr)}</p>", [prev, pr])
        add(printed, name.title(), f"<h1>{name.title()} (print)</h1>\n<p>The {name} chapter.</p>", [])
    archive = link("/docs/archive/", "Old versions")
    dropped.add("/docs/archive/")
    add("/docs/archive/", "Archive", "<h1>Archive</h1>", [])
    add("/docs/", "Documentation", "<h1>Documentation</h1>\n<ul>"
        + "".join(f"<li>{_anchor(x)}</li>" for x in [*doc_links, archive]) + "</ul>", [*doc_links, archive])
    root_links = [link("/shop/", "Shop"), link("/articles/", "Articles"), link("/docs/", "Documentation")]
    truth = StructuredTruth(host=hub, products=products, articles=articles, docs_dropped=frozenset(dropped),
                            docs_rewritten=rewritten)
    assert PORT not in "".join(r.body.decode() for r in res.values())  # every href here is path-absolute
    return res, root_links, truth
