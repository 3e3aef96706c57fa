"""Generated pages built like real ones: head with stylesheets and scripts, a navigation bar, an article whose
paragraphs carry the links inside their text, lists, tables, code blocks, figures, a sidebar and a footer.

Sizes and counts follow the distributions written in docs/localweb.md ("Pages that look like the web"), each
with its source. Everything comes from ``random.Random`` seeded by the page, and the text from one prose pool
per seed (sentences of words drawn with Zipf weights, with entities and non-ASCII words), so a page costs a few
hundred microseconds to render and is the same in every process.

:func:`link_count` is what the graph asks (cheap: the oracle walks every page); :func:`render_page` writes the
page with the graph's links, in order: navigation first, then the article's inline links, then the footer.
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
import random
from collections.abc import Callable, Sequence
from functools import lru_cache

__all__ = ["INLINE_LINKS_SIGMA", "MEDIAN_INLINE_LINKS", "MEDIAN_PAGE_BYTES", "PAGE_BYTES_SIGMA", "host_shape", "link_count",
           "page_size", "render_page"]

#: Median and log-normal sigma of a generated page's size (docs/localweb.md gives the source).
MEDIAN_PAGE_BYTES = 24_000
PAGE_BYTES_SIGMA = 0.6
#: Links of the article's text: log-normal around this median (docs/localweb.md).
MEDIAN_INLINE_LINKS = 18
INLINE_LINKS_SIGMA = 0.7

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they "
    "you were her she there been one all we their has would when if so no will can more about what up its out "
    "into them only some could time these two may first then do any like my now over such our man me even most "
    "made after also did many before must through back years where much your way well down should because each "
    "just those people how too little state good very make world still own see men work long get here between "
    "both life being under never day same another know while last might us great old year off come since against "
    "go came right used take three system program data network server request page link crawler index search "
    "document version release support user client service model value result number group public report market "
    "research policy health school family history company information development government community "
    "experience different important available performance security management technology design process "
    "analysis production national international university application software interface configuration"
).split()
_FOREIGN = (
    "café", "naïve", "Müller", "Straße", "résumé", "São", "Zürich", "français", "señor", "Ångström", "über",
    "Kraków", "Dvořák", "façade", "coöperate", "déjà", "niño", "Ærø", "Łódź", "Ελλάδα", "данные", "Москва",
    "東京", "数据", "検索", "서울", "العربية", "עברית", "हिन्दी", "€", "£", "°C", "™", "—", "–", "…",
)
_ENTITIES = ("&amp;", "&nbsp;", "&copy;", "&mdash;", "&ndash;", "&#8217;", "&rsquo;", "&laquo;", "&raquo;",
             "&#x2014;", "&lt;", "&gt;", "&quot;", "&hellip;", "&eacute;")
_INLINE = ("em", "strong", "code", "b", "i", "span", "abbr", "mark")
_CLASSES = ("container", "row", "col-md-8", "col-12", "wrapper", "inner", "content", "section", "block", "grid",
            "flex", "card", "card-body", "entry", "post", "widget", "module", "layout", "region", "panel")
_CODE_WORDS = ("def", "return", "for", "in", "if", "else", "import", "from", "class", "self", "None", "True",
               "await", "async", "with", "as", "yield", "lambda", "print", "len", "range", "dict", "list")
_POOL_CHARS = 1 << 18


class _Kit:
    """What the pages of one seed are cut from: the prose pool (~256 K characters of sentences with entities
    and non-ASCII words, HTML-safe) with its sentence starts and words, and pools of tables, code blocks, CSS
    rules and script statements. Pages pick from them, which keeps a page at a few hundred microseconds."""

    def __init__(self, seed: int) -> None:
        rng = random.Random(f"{seed}:prose")
        # Zipf weights over the vocabulary: the frequency of the k-th word ~ 1/k, as in natural text.
        cum = list(itertools.accumulate(1.0 / (k + 1) for k in range(len(_WORDS))))
        total = cum[-1]
        starts: list[int] = []
        parts: list[str] = []
        size = 0
        while size < _POOL_CHARS:
            n = rng.randint(6, 24)
            words = []
            for i in range(n):
                r = rng.random()
                if r < 0.03:
                    words.append(rng.choice(_FOREIGN))
                elif r < 0.045:
                    words.append(rng.choice(_ENTITIES))
                else:
                    words.append(_WORDS[bisect.bisect_left(cum, rng.random() * total)])
                if i and rng.random() < 0.06:
                    words[-1] += ","
            words[0] = words[0].capitalize()
            sentence = " ".join(words) + rng.choice((".", ".", ".", "?", "!")) + " "
            starts.append(size)
            parts.append(sentence)
            size += len(sentence)
        self.pool = "".join(parts)
        self.starts = tuple(starts)
        self.words = tuple(w.strip(".,?!") for w in self.pool.split())
        self.tables = tuple(self._table(rng) for _ in range(64))
        self.codes = tuple(self._code(rng) for _ in range(64))
        self.css_rules = tuple(self._css_rule(rng) for _ in range(512))
        self.js_statements = tuple(self._js_statement(rng, i) for i in range(512))

    def text(self, rand: Callable[[], float], sentences: int) -> str:
        i = int(rand() * (len(self.starts) - sentences - 1))
        return self.pool[self.starts[i]: self.starts[i + sentences]].rstrip()

    def phrase(self, rand: Callable[[], float], n: int) -> str:
        i = int(rand() * (len(self.words) - n))
        return " ".join(self.words[i: i + n])

    def _table(self, rng: random.Random) -> str:
        r = rng.random
        cols, rows = rng.randint(2, 6), rng.randint(2, 12)
        head = "".join(f'<th scope="col">{self.phrase(r, rng.randint(1, 3))}</th>' for _ in range(cols))
        cells = (lambda: self.phrase(r, rng.randint(1, 4)), lambda: str(rng.randint(0, 99999)),
                 lambda: f"{r() * 100:.1f}&nbsp;%")
        body = "".join("<tr>" + "".join(f"<td>{rng.choice(cells)()}</td>" for _ in range(cols)) + "</tr>\n"
                       for _ in range(rows))
        return (f'<div class="table-responsive"><table class="table"><caption>{self.phrase(r, 4)}</caption>'
                f"<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody></table></div>\n")

    @staticmethod
    def _code(rng: random.Random) -> str:
        lines = []
        for _ in range(rng.randint(3, 25)):
            toks = []
            for _ in range(rng.randint(2, 9)):
                w = rng.choice(_CODE_WORDS)
                toks.append(f'<span class="k">{w}</span>' if rng.random() < 0.4 else
                            (f'<span class="s">&quot;{w}&quot;</span>' if rng.random() < 0.2 else w))
            lines.append("    " * rng.randint(0, 3) + " ".join(toks)
                         + rng.choice(("", ":", "()", " &lt; 10", " &amp;&amp; x")))
        lang = rng.choice(("python", "javascript", "bash", "html"))
        return f'<div class="highlight"><pre><code class="language-{lang}">' + "\n".join(lines) + "</code></pre></div>\n"

    @staticmethod
    def _css_rule(rng: random.Random) -> str:
        return (f".{rng.choice(_CLASSES)} .{rng.choice(_CLASSES)}>{rng.choice(('a', 'p', 'li', 'div', 'span'))}"
                f"{{margin:{rng.randint(0, 32)}px {rng.randint(0, 32)}px;color:#{rng.randrange(1 << 24):06x};"
                f"font-size:{rng.randint(10, 24)}px;line-height:{rng.uniform(1, 2):.2f}}}")

    @staticmethod
    def _js_statement(rng: random.Random, i: int) -> str:
        return rng.choice((
            f"var v{i}=d.querySelectorAll('.{rng.choice(_CLASSES)}');",
            f"w.dataLayer=w.dataLayer||[];w.dataLayer.push({{event:'e{i}',value:{rng.randint(0, 999)}}});",
            f"if(w.v{i}&&w.v{i}.length>{rng.randint(0, 9)}){{console.log('<a href=\\\"#\\\">');}}",
            f"d.addEventListener('DOMContentLoaded',function(){{w.x{i}={rng.random():.6f};}});",
        ))

    def css(self, rand: Callable[[], float], rules: int) -> str:
        i = int(rand() * (len(self.css_rules) - rules))
        return "\n".join(self.css_rules[i: i + rules])

    def script(self, rand: Callable[[], float], statements: int) -> str:
        i = int(rand() * (len(self.js_statements) - statements))
        return "(function(w,d){'use strict';\n" + "\n".join(self.js_statements[i: i + statements]) + "\n})(window,document);"


@lru_cache(maxsize=8)
def _kit(seed: int) -> _Kit:
    return _Kit(seed)


def page_size(rng: random.Random) -> int:
    """A generated page's size in bytes: log-normal, median MEDIAN_PAGE_BYTES, sigma PAGE_BYTES_SIGMA."""
    return int(MEDIAN_PAGE_BYTES * math.exp(rng.gauss(0.0, PAGE_BYTES_SIGMA)))


def host_shape(seed: int, host_index: int) -> tuple[int, int]:
    """Navigation and footer link counts of a host: the same on all its pages, as a site's template."""
    rng = random.Random(f"{seed}:shape:{host_index}")
    return rng.randint(6, 14), rng.randint(3, 9)


def link_count(rng: random.Random, nav: int, footer: int) -> int:
    """Links on a generated page: the host's navigation and footer, and log-normally many in the text."""
    inline = int(round(MEDIAN_INLINE_LINKS * math.exp(rng.gauss(0.0, INLINE_LINKS_SIGMA))))
    return nav + footer + min(inline, 400)


def _anchor(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{text}</a>'


def _pick(rand: Callable[[], float], seq: Sequence[str]) -> str:
    return seq[int(rand() * len(seq))]


def _between(rand: Callable[[], float], lo: int, hi: int) -> int:
    return lo + int(rand() * (hi - lo + 1))


def _paragraph(kit: _Kit, rand: Callable[[], float], hrefs: list[str]) -> str:
    """A paragraph of 2-7 sentences with inline markup and the given links placed inside its text."""
    words = kit.text(rand, _between(rand, 2, 7)).split(" ")
    for _ in range(_between(rand, 0, 3)):
        k = int(rand() * len(words))
        tag = _pick(rand, _INLINE)
        words[k] = f"<{tag}>{words[k]}</{tag}>"
    for href in hrefs:  # inserted, never over a word: no link covers another
        words.insert(int(rand() * (len(words) + 1)), _anchor(href, kit.phrase(rand, _between(rand, 1, 4))))
    return "<p>" + " ".join(words) + "</p>\n"


def _list(kit: _Kit, rand: Callable[[], float], hrefs: list[str]) -> str:
    tag = "ul" if rand() < 0.6 else "ol"
    items = [f"<li>{kit.phrase(rand, _between(rand, 3, 14))}</li>" for _ in range(_between(rand, 2, 9))]
    for href in hrefs:
        items.insert(int(rand() * (len(items) + 1)),
                     f"<li>{_anchor(href, kit.phrase(rand, _between(rand, 1, 5)))} {kit.phrase(rand, 4)}</li>")
    return f"<{tag}>" + "\n".join(items) + f"</{tag}>\n"


def render_page(*, seed: int, key: str, host: str, size: int, nav: int, footer: int, hrefs: Sequence[str]) -> str:
    """A generated page of about ``size`` bytes (more when its links need the room) for ``host``; ``hrefs`` are
    the written forms of its links: the first ``nav`` go to the navigation bar, the last ``footer`` to the
    footer, the rest inside the article's text. ``key`` (the page's host and path) seeds its choices."""
    kit = _kit(seed)
    rand = random.Random(f"{seed}:body:{key}").random
    hrefs = list(hrefs)
    nav_hrefs = hrefs[:nav]
    foot_hrefs = hrefs[len(hrefs) - footer:] if footer else []
    text_hrefs = hrefs[nav: len(hrefs) - footer]
    title = kit.phrase(rand, _between(rand, 3, 9))
    head = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f"<title>{title} | {host}</title>\n",
        f'<meta name="description" content="{kit.phrase(rand, _between(rand, 10, 25))}">\n',
        f'<meta property="og:title" content="{title}">\n',
    ]
    for _ in range(_between(rand, 1, 5)):
        head.append(f'<link rel="stylesheet" href="/static/css/{_pick(rand, _CLASSES)}.{int(rand() * 2**32):08x}.css" '
                    'media="all">\n')
    head.append('<link rel="icon" href="/favicon.ico">\n')
    head.append(f"<style>\n{kit.css(rand, _between(rand, 5, 60))}\n</style>\n")
    for _ in range(_between(rand, 2, 12)):
        if rand() < 0.7:
            head.append(f'<script src="/static/js/{_pick(rand, _CLASSES)}.{int(rand() * 2**32):08x}.js" '
                        f'{_pick(rand, ("async", "defer", ""))}></script>\n')
        else:
            head.append(f"<script>\n{kit.script(rand, _between(rand, 2, 30))}\n</script>\n")
    head.append('<script type="application/ld+json">{"@context":"https://schema.org","@type":"Article",'
                f'"headline":"{title}"}}</script>\n</head>\n')
    # A wrapper depth drawn per page: DOM depth around its measured median (docs/localweb.md).
    wrappers = _between(rand, 1, 7)
    opening = "".join(f'<div class="{_pick(rand, _CLASSES)}">' for _ in range(wrappers))
    nav_items = "".join(f'<li class="menu-item">{_anchor(h, kit.phrase(rand, _between(rand, 1, 3)))}</li>\n'
                        for h in nav_hrefs)
    top = [
        f'<body class="page {_pick(rand, _CLASSES)}">\n<div class="site">\n<header class="site-header">'
        f'<div class="container"><div class="brand"><img src="/static/img/logo.svg" alt="{host}" width="120" '
        'height="40"></div>\n',
        f'<nav class="main-nav" aria-label="Main"><ul class="menu">\n{nav_items}</ul></nav></div></header>\n',
        f'<main id="content">{opening}<article class="post">\n<header class="entry-header"><h1>{title}</h1>'
        f'<p class="byline">{kit.phrase(rand, 2)} &middot; <time datetime="2024-0{_between(rand, 1, 9)}-1'
        f'{_between(rand, 0, 9)}">{_between(rand, 1, 28)} {_pick(rand, ("janvier", "März", "May", "June", "août"))}'
        " 2024</time></p></header>\n<div class=\"entry-content\">\n",
    ]
    aside = ('<aside class="sidebar"><div class="widget"><h3>' + kit.phrase(rand, 2) + "</h3><ul>"
             + "".join(f"<li>{kit.phrase(rand, _between(rand, 2, 6))}</li>" for _ in range(_between(rand, 2, 8)))
             + "</ul></div></aside>\n")
    foot_items = "".join(f"<li>{_anchor(h, kit.phrase(rand, _between(rand, 1, 3)))}</li>" for h in foot_hrefs)
    tail = [
        "</div>\n</article>\n", aside, "</div>" * wrappers, "</main>\n",
        f'<footer class="site-footer"><div class="container"><ul class="footer-links">{foot_items}</ul>'
        f"<p>&copy; 2024 {host}. {kit.text(rand, 1)}</p></div></footer>\n</div>\n",
        f"<script>\n{kit.script(rand, _between(rand, 1, 20))}\n</script>\n</body>\n</html>\n",
    ]
    budget = size - sum(map(len, head)) - sum(map(len, top)) - sum(map(len, tail))
    # The article: headings and blocks until the size is reached; the text's links are dealt to paragraphs and
    # lists as they come, spread over the room left (about one block per 900 characters).
    blocks: list[str] = []
    used = 0
    pending = text_hrefs
    while used < budget or pending:
        r = rand()
        if r < 0.12:
            block = f'<h2 id="s{len(blocks)}">{kit.phrase(rand, _between(rand, 2, 7))}</h2>\n'
        elif r < 0.2:
            block = _pick(rand, kit.tables)
        elif r < 0.3:
            block = _pick(rand, kit.codes)
        elif r < 0.36:
            block = (f'<figure><img src="/static/img/{int(rand() * 2**32):08x}.jpg" alt="{kit.phrase(rand, 4)}" '
                     f'loading="lazy" width="{_between(rand, 300, 1200)}" height="{_between(rand, 200, 800)}">'
                     f"<figcaption>{kit.phrase(rand, _between(rand, 4, 12))}</figcaption></figure>\n")
        elif r < 0.4:
            block = f"<blockquote><p>{kit.text(rand, _between(rand, 1, 3))}</p></blockquote>\n"
        else:
            take = 0
            if pending and (used >= budget or rand() < 0.6):
                left = max(1, (budget - used) // 900)
                take = min(len(pending), -(-len(pending) // left))
            mine, pending = pending[:take], pending[take:]
            block = _list(kit, rand, mine) if r < 0.5 else _paragraph(kit, rand, mine)
        blocks.append(block)
        used += len(block)
    return "".join(head) + "".join(top) + "".join(blocks) + "".join(tail)
