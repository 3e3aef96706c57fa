"""The plug-in chain: loading the ``[[plugins]]`` entries, its fingerprint, and running it on one page.

Order (first match, as documented in docs/plugins.md):

- **URL filters** form a pipeline in chain order: each gets what the one before returned; the first that
  returns None drops the link, and no later filter sees it.
- **Page filters**: the first that returns a `Decision` decides (store? follow?); None passes to the next; when
  none decides, the page is stored and its links followed.
- **Extractors** all run, in chain order; their items are kept in that order.

Containment: each plug-in has ``timeout`` seconds per page (for a URL filter, for all the page's links); one
that took longer has its answer dropped. In the main thread of a process (the node's event loop, a page worker)
the chain is also interrupted (SIGALRM, sent by a watchdog thread that looks ten times a second) once it has
run ``timeout`` times its number of plug-ins on the page, and the plug-in running then is charged with the
timeout: a plug-in that never returns costs one page, not the node. An exception or a timeout is an outcome
failure: the plug-in's answer for that page is ignored (the page is stored and followed as if it had no
opinion), and the node counts it per plug-in and logs it with the URL (`peer.plugins._running`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import _signal  # type: ignore[import-not-found]  # signal's C module (typeshed has no stub): getsignal without an enum
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from peer.crawl.urls import normalize
from peer.plugins._api import Decision, FetchedPage, Link

__all__ = ["KINDS", "Chain", "Outcome", "PluginError", "PluginSpec", "describe_difference", "load_chain",
           "spec_of"]

KINDS = ("url_filter", "page_filter", "extractor", "sink")
_METHODS = {"filter": "url_filter", "decide": "page_filter", "extract": "extractor", "write": "sink"}


class PluginError(ValueError):
    """A plug-in cannot be loaded: its import, its class, its kind or its settings; the message names it."""


class PluginTimeout(BaseException):
    """A plug-in ran past its time on a page. A BaseException, so a plug-in's ``except Exception`` cannot
    swallow it."""


@dataclass(frozen=True, slots=True)
class PluginSpec:
    """One ``[[plugins]]`` entry: ``use = "module:Class"`` and the plug-in's own settings."""

    use: str
    settings: Mapping[str, Any]


def spec_of(entry: Mapping[str, Any], where: str = "plugins") -> PluginSpec:
    """A spec from one TOML table; PluginError when it has no ``use`` of the form module:Class."""
    if not isinstance(entry, Mapping):
        raise PluginError(f"{where}: each [[plugins]] entry is a table, got {type(entry).__name__}")
    use = entry.get("use")
    if not isinstance(use, str) or use.count(":") != 1 or not all(use.split(":")):
        raise PluginError(f"{where}: use = \"module:Class\" is required, got {use!r}")
    settings = {k.replace("-", "_"): v for k, v in entry.items() if k != "use"}
    return PluginSpec(use=use, settings=settings)


class _Loaded(NamedTuple):
    spec: PluginSpec
    obj: Any
    kinds: frozenset[str]
    version: str
    needs_tree: bool


def _load_one(spec: PluginSpec) -> _Loaded:
    module_name, _, class_name = spec.use.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import failure is the plug-in's: ImportError, SyntaxError, what it raises
        raise PluginError(f"plug-in {spec.use}: cannot import {module_name}: {type(exc).__name__}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise PluginError(f"plug-in {spec.use}: {module_name} has no class {class_name}")
    kinds = frozenset(kind for method, kind in _METHODS.items() if callable(getattr(cls, method, None)))
    if not kinds:
        raise PluginError(f"plug-in {spec.use}: a plug-in defines filter(), decide(), extract() or write()")
    try:
        obj = cls(**spec.settings)
    except (TypeError, ValueError, KeyError, LookupError) as exc:
        raise PluginError(f"plug-in {spec.use}: bad settings: {exc}") from exc
    return _Loaded(spec, obj, kinds, str(getattr(cls, "version", "0")), bool(getattr(obj, "needs_tree", False)))


def _settings_digest(settings: Mapping[str, Any]) -> str:
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class Outcome(NamedTuple):
    """What the chain made of one page; plain values, so a page worker sends it back as it is."""

    store: bool
    follow: bool
    links: tuple[str, ...] | None  # the links to follow after the URL filters (None: no URL filter ran)
    items: tuple[tuple[int, dict], ...]  # (plug-in index, item)
    failures: tuple[tuple[int, str, str], ...]  # (plug-in index, "error" | "timeout", what happened)
    ran: tuple[int, ...]  # the plug-ins that ran on the page
    tree: bool  # whether the page's tree was built


# ---------------------------------------------------------------------------------------------- time limits

class _Watchdog:
    """Interrupts a chain that runs past its page's limit: a chain run sets `started` and `limit` (two stores a
    page); a thread of this process looks ten times a second and, past the limit, sends SIGALRM, whose handler
    raises in the main thread if that same run is still going. Two `setitimer` calls a page cost 6 µs, half of
    a no-op chain's cost; this costs nothing a page."""

    PERIOD = 0.1

    def __init__(self) -> None:
        self.run = 0  # serial of the chain run in progress (0: none)
        self.started = 0.0
        self.limit = 0.0
        self.fired = -1  # the run the last signal was sent for
        self._thread: threading.Thread | None = None
        self._pid = 0

    def ensure(self) -> None:
        if self._thread is None or self._pid != os.getpid():  # one thread per process (a fork has none)
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._watch, name="plugin-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while True:
            time.sleep(self.PERIOD)
            run, started, limit = self.run, self.started, self.limit
            if run and run != self.fired and time.monotonic() - started > limit:
                self.fired = run
                os.kill(os.getpid(), signal.SIGALRM)


_watchdog = _Watchdog()
_serial = 0


def _on_alarm(signum: int, frame: Any) -> None:
    if _watchdog.run and _watchdog.run == _watchdog.fired:
        raise PluginTimeout()


def _can_interrupt() -> bool:
    """Whether a plug-in can be interrupted here: in a process's main thread, with SIGALRM free (ours, or not
    handled); a process whose SIGALRM belongs to someone else (a test runner's timeout) measures instead.
    Asked once a page (`_signal.getsignal`: `signal.getsignal` makes an enum of the answer, 30 µs)."""
    if threading.current_thread() is not _MAIN:
        return False
    handler = _signal.getsignal(signal.SIGALRM)
    if handler is _on_alarm:
        return True
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        signal.signal(signal.SIGALRM, _on_alarm)
        _watchdog.ensure()
        return True
    return False


_MAIN = threading.main_thread()


def _arm(seconds: float) -> None:
    global _serial
    _serial += 1
    _watchdog.started = time.monotonic()
    _watchdog.limit = seconds
    _watchdog.run = _serial


def _disarm() -> None:
    _watchdog.run = 0


def _url_pass(filt: Any, source: str, urls: list[str], context: Mapping[str, Link]) -> list[str]:
    out = []
    for url in urls:
        got = filt.filter(source, url, context.get(url))
        if got is None:
            continue
        if got != url:
            got = normalize(got)
            if got is None:
                continue
        out.append(got)
    return out


def _items_of(produced: Any) -> list[dict]:
    if produced is None:
        return []
    items = []
    for item in produced:
        if not isinstance(item, Mapping):
            raise TypeError(f"an item is a dict, got {type(item).__name__}")
        item = dict(item)
        json.dumps(item)  # TypeError now, not in the exporter
        items.append(item)
    return items


class Chain:
    """The loaded plug-ins of one configuration, in chain order."""

    def __init__(self, loaded: Sequence[_Loaded], timeout: float) -> None:
        self._loaded = list(loaded)
        self.timeout = timeout
        self.names = [entry.spec.use for entry in loaded]
        self.needs_tree = any(entry.needs_tree for entry in loaded)
        self._url = [i for i, e in enumerate(loaded) if "url_filter" in e.kinds]
        self._page = [i for i, e in enumerate(loaded) if "page_filter" in e.kinds]
        self._extract = [i for i, e in enumerate(loaded) if "extractor" in e.kinds]
        self.sinks = [e.obj for e in loaded if "sink" in e.kinds]
        self._deciders = [(i, loaded[i].obj.decide) for i in self._page]
        self._filters = [(i, loaded[i].obj) for i in self._url]
        self._extractors = [(i, loaded[i].obj.extract) for i in self._extract]
        self.description = [{"use": e.spec.use, "version": e.version, "kinds": sorted(e.kinds),
                             "settings": _settings_digest(e.spec.settings)} for e in loaded]
        text = json.dumps(self.description, sort_keys=True, separators=(",", ":"))
        self.fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16] if loaded else ""

    def __len__(self) -> int:
        return len(self._loaded)

    @property
    def works_on_pages(self) -> bool:
        """Whether any plug-in runs on pages (a chain of sinks alone changes nothing on the page path)."""
        return bool(self._url or self._page or self._extract)

    def kinds(self, index: int) -> frozenset[str]:
        return self._loaded[index].kinds

    def run(self, page: FetchedPage, links: Sequence[str] | None, base: str | None = None,
            disabled: frozenset[int] = frozenset()) -> Outcome:
        """The chain on one page whose links (normalized, as the crawler found them) are `links` (None: the
        page was not parsed for links). Never raises for a plug-in's fault."""
        failures: list[tuple[int, str, str]] = []
        ran: list[int] = []
        loaded, timeout = self._loaded, self.timeout
        interrupt = _can_interrupt()
        if interrupt:
            _arm(timeout * max(1, len(loaded) - len(disabled)))
        try:
            return self._run(page, links, base, disabled, failures, ran)
        finally:
            if interrupt:
                _disarm()

    def _run(self, page: FetchedPage, links: Sequence[str] | None, base: str | None, disabled: frozenset[int],
             failures: list[tuple[int, str, str]], ran: list[int]) -> Outcome:
        # Written out plug-in by plug-in, without a helper per call: a no-op plug-in's cost is these lines.
        timeout = self.timeout
        now = time.monotonic
        if self.needs_tree and page.mime in ("", "text/html", "application/xhtml+xml"):
            page.tree  # built once, before any plug-in's time starts  # noqa: B018
        store = follow = True
        for index, decide in self._deciders:
            if index in disabled:
                continue
            ran.append(index)
            start = now()
            try:
                decision = decide(page)
            except PluginTimeout:
                failures.append((index, "timeout", f"over {timeout:g} s"))
                continue
            except Exception as exc:  # noqa: BLE001 - a plug-in's failure is contained to its page
                failures.append((index, "error", f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if now() - start > timeout:
                failures.append((index, "timeout", f"over {timeout:g} s"))
            elif decision is not None:
                if not isinstance(decision, Decision):
                    failures.append((index, "error", f"decide() returned {type(decision).__name__}, not a Decision"))
                    continue
                store, follow = decision.store, decision.follow
                break
        kept: tuple[str, ...] | None = None
        active_url = [(i, obj) for i, obj in self._filters if i not in disabled]
        if links is not None and active_url and follow:
            context: dict[str, Link] = {}
            for link in page.links():
                url = normalize(link.href, base or page.url)
                if url is not None:
                    context.setdefault(url, link)
            current = list(links)
            for index, obj in active_url:
                ran.append(index)
                start = now()
                try:
                    out = _url_pass(obj, page.url, current, context)
                except PluginTimeout:
                    failures.append((index, "timeout", f"over {timeout:g} s"))
                    continue
                except Exception as exc:  # noqa: BLE001
                    failures.append((index, "error", f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                if now() - start > timeout:
                    failures.append((index, "timeout", f"over {timeout:g} s"))
                else:
                    current = out
            kept = tuple(dict.fromkeys(current))
        items: list[tuple[int, dict]] = []
        for index, extract in self._extractors:
            if index in disabled:
                continue
            ran.append(index)
            start = now()
            try:
                produced = extract(page)
                made = _items_of(produced) if produced else ()
            except PluginTimeout:
                failures.append((index, "timeout", f"over {timeout:g} s"))
                continue
            except Exception as exc:  # noqa: BLE001
                failures.append((index, "error", f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if now() - start > timeout:
                failures.append((index, "timeout", f"over {timeout:g} s"))
            else:
                items += [(index, item) for item in made]
        return Outcome(store, follow, kept, tuple(items), tuple(failures), tuple(ran), page.tree_built)


    @property
    def filters_urls(self) -> bool:
        return bool(self._url)

    def filter_urls(self, source: str, urls: Sequence[str], tag: str | None,
                    disabled: frozenset[int] = frozenset()) -> tuple[list[str | None], Outcome]:
        """The URL filters on URLs that did not come from a page's links: seeds (`tag` None: no source, no
        link), a redirect's target (``tag="redirect"``, `source` the URL that redirected) or what a sitemap lists
        (``tag="sitemap"``, `source` the sitemap's URL); each gets a `Link` of that tag whose ``href`` is the
        URL as found, no text and no rel. Returns each URL's answer in the order given (None: dropped) and the
        outcome to count. Never raises for a plug-in's fault; a failing filter passes the URLs on as if it had
        no opinion."""
        failures: list[tuple[int, str, str]] = []
        ran: list[int] = []
        current: list[str | None] = list(urls)
        active = [(i, obj) for i, obj in self._filters if i not in disabled]
        if not active:
            return current, Outcome(True, True, None, (), (), (), False)
        timeout = self.timeout
        now = time.monotonic
        interrupt = _can_interrupt()
        if interrupt:
            _arm(timeout * len(active))
        try:
            for index, obj in active:
                ran.append(index)
                start = now()
                try:
                    out = [None if url is None else _filtered_one(obj, source, url, tag) for url in current]
                except PluginTimeout:
                    failures.append((index, "timeout", f"over {timeout:g} s"))
                    continue
                except Exception as exc:  # noqa: BLE001 - a plug-in's failure is contained to its URLs
                    failures.append((index, "error", f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                if now() - start > timeout:
                    failures.append((index, "timeout", f"over {timeout:g} s"))
                else:
                    current = out
        finally:
            if interrupt:
                _disarm()
        return current, Outcome(True, True, None, (), tuple(failures), tuple(ran), False)


def _filtered_one(filt: Any, source: str, url: str, tag: str | None) -> str | None:
    got = filt.filter(source, url, None if tag is None else Link(href=url, text="", tag=tag, rel=frozenset()))
    if got is None or got == url:
        return got
    return normalize(got)


def load_chain(specs: Sequence[PluginSpec], *, timeout: float = 2.0) -> Chain:
    """Import and build every plug-in of `specs`, in order; PluginError naming the first that fails."""
    if timeout <= 0:
        raise PluginError(f"plugin_timeout must be > 0, got {timeout}")
    return Chain([_load_one(spec) for spec in specs], timeout)


def describe_difference(mine: Sequence[Mapping[str, Any]], theirs: Sequence[Mapping[str, Any]], *,
                        me: str = "this node", them: str = "the cluster") -> str:
    """What differs between two chains' descriptions, for a person: the first differing entry, named as what
    `me` runs and what `them` runs."""
    def name(entry: Mapping[str, Any] | None) -> str:
        if entry is None:
            return "nothing"
        return f"{entry['use']} version {entry['version']} settings {entry['settings']}"

    for i in range(max(len(mine), len(theirs))):
        a = mine[i] if i < len(mine) else None
        b = theirs[i] if i < len(theirs) else None
        if a != b:
            what = "settings" if a and b and a["use"] == b["use"] and a["version"] == b["version"] else "plug-in"
            return f"{what} #{i + 1} differs: {me} runs {name(a)}, {them} runs {name(b)}"
    return "the chains are the same"
