"""When a page is rendered (peer/render/decision.py): the signals its HTML shows, the mode per host pattern, and
what renders of a path pattern taught."""

from __future__ import annotations

import pytest

from peer.config import ConfigError, load
from peer.render.decision import FRUITLESS, MIN_TEXT, Decider, path_pattern, signals

APP = b"<html><head><script src='/app.js'></script></head><body><div id='root'></div></body></html>"
ARTICLE = (b"<html><body><h1>Title</h1><p>" + b"Plenty of words a person reads. " * 20 + b"</p>"
           b"<a href='/a'>a</a><a href='/b'>b</a><a href='/c'>c</a><script>track()</script></body></html>")
NOSCRIPT = (b"<html><body><p>" + b"words " * 60 + b"</p><script>x()</script>"
            b"<noscript>You need to enable JavaScript to run this app.</noscript></body></html>")
BARE = b"<html><body><p>short</p><script src='/build.js'></script></body></html>"
STATIC = b"<html><body><div id='app'></div><p>no script here</p></body></html>"


def test_signals_of_pages() -> None:
    assert signals(APP).reason() == "mount"
    assert signals(NOSCRIPT).reason() == "noscript"
    assert signals(BARE).reason() == "script-built"
    assert signals(ARTICLE).reason() is None
    assert signals(ARTICLE).text > MIN_TEXT and signals(ARTICLE).links == 3
    assert signals(STATIC).reason() is None  # an empty mount with no script: nothing would fill it
    filled = b"<html><body><div id='app'><p>served already</p></div><script>x()</script><p>" + b"w " * 150
    assert signals(filled + b"</p></body></html>").reason() is None
    assert signals(b"\xff\xfe garbage <<<").reason() is None


def test_path_patterns_generalize_the_last_segment_and_digits() -> None:
    assert path_pattern("a.test", "/shop/item-12.html?x=1") == "a.test/shop/*"
    assert path_pattern("a.test", "/2024/05/post") == "a.test/N/N/*"  # a run of digits is one N
    assert path_pattern("a.test", "/docs/") == "a.test/docs/"
    assert path_pattern("a.test", "/") == "a.test/"


def test_modes_and_host_rules_first_match_first() -> None:
    decider = Decider("auto", [("*", "never"), ("static.test", "never"), ("*.spa.test", "always"),
                               ("other.test", "auto")])
    assert decider.decide("www.static.test", "/", APP) is None
    assert decider.decide("x.spa.test", "/", ARTICLE) == "always"
    assert decider.decide("other.test", "/", APP) == "mount"
    assert decider.decide("other.test", "/a", ARTICLE) is None
    assert decider.decide("elsewhere.test", "/", APP) is None  # `*` is every other host's default
    assert decider.counts["rendered"] == 2 and decider.counts["considered"] == 3
    assert not Decider("never").active and Decider("never", [("a.test", "auto")]).active
    with pytest.raises(ValueError):
        Decider("sometimes")


def test_a_pattern_whose_renders_find_nothing_is_no_longer_rendered() -> None:
    decider = Decider("auto")
    for i in range(FRUITLESS):
        assert decider.decide("a.test", f"/app/{i}.html", APP) == "mount"
        assert not decider.learn("a.test", f"/app/{i}.html", new_links=0, text_before=0, text_after=10)
    assert decider.decide("a.test", "/app/9.html", APP) is None
    assert decider.counts["learned"] == 1
    assert decider.decide("a.test", "/other/1.html", APP) == "mount"  # another pattern is still rendered
    assert decider.learn("a.test", "/other/1.html", new_links=2, text_before=0, text_after=0)
    # a fruitful render resets its pattern
    decider.learn("a.test", "/more/1.html", new_links=0, text_before=0, text_after=0)
    decider.learn("a.test", "/more/2.html", new_links=0, text_before=100, text_after=900)
    assert decider.decide("a.test", "/more/3.html", APP) == "mount"


def test_the_render_settings_are_checked(tmp_path) -> None:  # type: ignore[no-untyped-def]
    toml = tmp_path / "node.toml"
    toml.write_text('[hosts."spa.test"]\nrender = "always"\n[hosts."docs.test"]\nrender = "never"\nhttp2 = false\n')
    cfg = load(toml=toml, flags={"render": "auto"})
    assert cfg.render == "auto" and dict(cfg.hosts)["spa.test"] == (("render", "always"),)
    toml.write_text('[hosts."spa.test"]\nrender = "maybe"\n')
    with pytest.raises(ConfigError, match="render must be never, auto or always"):
        load(toml=toml)
    with pytest.raises(ConfigError, match="browser_ws"):
        load(flags={"browser_ws": "http://127.0.0.1:9222"})
