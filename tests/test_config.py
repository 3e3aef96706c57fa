import argparse
import inspect
from pathlib import Path

import pytest

from peer.cli.main import _add_node_flags
from peer.cluster.core.dispatch import DispatchConfig
from peer.cluster.handoff.handoff import HandoffConfig
from peer.cluster.membership.membership import MembershipConfig
from peer.config import DEFAULTS, FIELDS, Config, ConfigError, default_text, load, parse_address, read_seeds
from peer.crawl.urls import DEFAULT_MAX_URL_LENGTH
from peer.fetch import CachingResolver, Fetcher


def test_defaults_have_reasons():
    import dataclasses

    assert {f.name for f in dataclasses.fields(Config)} == set(FIELDS)
    assert all(FIELDS.values())


def test_precedence_defaults_toml_env_flags(tmp_path):
    toml = tmp_path / "peerd.toml"
    toml.write_text('weight = 150\ndelay = 2.5\nseeds = ["http://a.example/"]\nstore = "none"\n')
    cfg = load(toml=toml)
    assert (cfg.weight, cfg.delay, cfg.seeds, cfg.store) == (150, 2.5, ("http://a.example/",), "none")
    assert cfg.concurrency == Config().concurrency
    cfg = load(toml=toml, env={"PEERCRAWL_WEIGHT": "80", "PEERCRAWL_ALLOW_PRIVATE": "yes", "HOME": "/x"})
    assert cfg.weight == 80 and cfg.allow_private is True and cfg.delay == 2.5
    cfg = load(toml=toml, env={"PEERCRAWL_WEIGHT": "80"}, flags={"weight": 40, "delay": None})
    assert cfg.weight == 40 and cfg.delay == 2.5


def test_env_lists_are_comma_separated():
    cfg = load(env={"PEERCRAWL_NAMESERVERS": "127.0.0.1:5353, 10.0.0.1"})
    assert cfg.nameservers == ("127.0.0.1:5353", "10.0.0.1")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"flags": {"weight": 0}}, "weight must be"),
        ({"env": {"PEERCRAWL_WEIGHT": "many"}}, "PEERCRAWL_WEIGHT"),
        ({"env": {"PEERCRAWL_NOPE": "1"}}, "unknown setting"),
        ({"flags": {"store": "s3"}}, "store must be"),
        ({"flags": {"listen": "localhost"}}, "HOST:PORT"),
        ({"env": {"PEERCRAWL_ALLOW_PRIVATE": "maybe"}}, "not a boolean"),
        ({"flags": {"compression": "lz4"}}, "compression must be br, zlib or none"),
        ({"env": {"PEERCRAWL_PAGE_THREADS": "-1"}}, "page_threads must be within"),
        ({"env": {"PEERCRAWL_SEEN_FILTER_MIB": "0"}}, "seen_filter_mib must be >= 1"),
    ],
)
def test_bad_values_name_the_setting(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        load(**kwargs)


def test_bad_toml_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("weight = [")
    with pytest.raises(ConfigError, match="bad.toml"):
        load(toml=bad)
    with pytest.raises(ConfigError, match="unknown setting 'wieght'"):
        bad.write_text("wieght = 3\n")
        load(toml=bad)
    with pytest.raises(ConfigError, match="missing.toml"):
        load(toml=tmp_path / "missing.toml")


def test_seeds_file_and_user_agent(tmp_path):
    f = tmp_path / "seeds.txt"
    f.write_text("# comment\nhttp://b.example/\n\n  http://c.example/x  \n")
    cfg = load(flags={"seeds": ["http://a.example/"], "seeds_file": str(f), "contact": "https://ops.example/bot"})
    assert read_seeds(cfg) == ["http://a.example/", "http://b.example/", "http://c.example/x"]
    assert cfg.full_user_agent() == "peercrawl/0.1 (+https://ops.example/bot)"


def test_parse_address():
    assert parse_address("127.0.0.1:7400") == ("127.0.0.1", 7400)
    assert parse_address("[::1]:80") == ("::1", 80)
    with pytest.raises(ConfigError):
        parse_address(":80")


def test_peerd_config_never_prints_the_cluster_secret_or_the_control_token(tmp_path, monkeypatch, capsys):
    from peer.cli.main import peerd_main

    secret = "a cluster secret that must stay private"
    token = "control-token-that-must-stay-private"
    monkeypatch.setenv("PEERCRAWL_CLUSTER_SECRET", secret)
    monkeypatch.setenv("PEERCRAWL_CONTROL_TOKEN", token)
    assert peerd_main(["config", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert secret not in out and token not in out
    assert f'cluster_secret = "<set: {len(secret)} bytes, not shown>"' in out
    assert 'control_token = "<set: ' in out
    monkeypatch.delenv("PEERCRAWL_CLUSTER_SECRET")
    monkeypatch.delenv("PEERCRAWL_CONTROL_TOKEN")
    assert peerd_main(["config", "--data-dir", str(tmp_path)]) == 0
    assert 'cluster_secret = ""' in capsys.readouterr().out


def test_max_crashes_and_control_token_are_checked():
    assert load(env={}, flags={}).max_crashes == 3
    with pytest.raises(ConfigError, match="max_crashes"):
        load(env={"PEERCRAWL_MAX_CRASHES": "-1"}, flags={})
    with pytest.raises(ConfigError, match="control_token"):
        load(env={"PEERCRAWL_CONTROL_TOKEN": "short"}, flags={})


def test_components_take_their_defaults_from_the_config():
    """Each operator-visible default is stated once (peer.config) and the components read it."""
    membership, dispatch = MembershipConfig(), DispatchConfig()
    assert (membership.probe_interval, membership.probe_timeout, membership.suspicion_timeout) == (
        DEFAULTS["probe_interval"], DEFAULTS["probe_timeout"], DEFAULTS["suspicion_timeout"])
    assert (dispatch.batch_size, dispatch.interval) == (DEFAULTS["batch_size"], DEFAULTS["dispatch_interval"])
    assert HandoffConfig().wait == DEFAULTS["handoff_wait"]
    assert DEFAULT_MAX_URL_LENGTH == DEFAULTS["max_url_length"]
    fetcher = inspect.signature(Fetcher).parameters
    for name in ("connect_timeout", "read_timeout", "total_timeout", "max_body"):
        assert fetcher[name].default == DEFAULTS[name], name
    resolver = inspect.signature(CachingResolver).parameters
    for param, name in (("cache_size", "dns_cache_size"), ("min_ttl", "dns_min_ttl"), ("max_ttl", "dns_max_ttl")):
        assert resolver[param].default == DEFAULTS[name], name


def test_flag_help_shows_the_config_defaults():
    """`peerd start --help` states each non-empty default as Config has it, and no flag states one by hand."""
    parser = argparse.ArgumentParser(prog="peerd start")
    _add_node_flags(parser)
    shown = 0
    for action in parser._actions:
        if action.dest not in DEFAULTS or action.help is None:
            continue
        text = default_text(action.dest)
        defaults_stated = action.help.count("(default")
        if text is None:
            assert f"(default {DEFAULTS[action.dest]}" not in action.help, action.dest
        else:
            assert action.help.endswith(f"(default {text})") and defaults_stated == 1, action.help
            shown += 1
    assert shown >= 20
def test_compression_and_page_threads_load_from_each_source(tmp_path):
    assert (load().compression, load().page_threads) == ("br", 0)
    cfg = load(env={"PEERCRAWL_COMPRESSION": "zlib", "PEERCRAWL_PAGE_THREADS": "2"})
    assert (cfg.compression, cfg.page_threads) == ("zlib", 2)
    assert load(env={"PEERCRAWL_COMPRESSION": "zlib"}, flags={"compression": "none"}).compression == "none"


def test_http2_proxies_and_host_tables(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('http2 = false\nproxy = ["socks5h://127.0.0.1:1080"]\nproxy_user = "bob"\n'
                    '[hosts."*.legacy.example"]\ntls_min_version = "TLSv1"\nhttp2 = true\n'
                    '[hosts."example.org"]\nproxy = "http://127.0.0.1:3128"\ntls-verify = false\n')
    cfg = load(toml=path, env={"PEERCRAWL_PROXY_PASSWORD": "hunter2"}, flags={"http2": "on"})
    assert cfg.http2 is True and cfg.proxy == ("socks5h://127.0.0.1:1080",)
    assert (cfg.proxy_user, cfg.proxy_password) == ("bob", "hunter2")
    assert cfg.hosts == (("*.legacy.example", (("tls_min_version", "TLSv1"), ("http2", True))),
                         ("example.org", (("proxy", "http://127.0.0.1:3128"), ("tls_verify", False))))
    path.write_text('[hosts."a.example"]\ndelay = 3\n')
    with pytest.raises(ConfigError, match="unknown setting 'delay'"):
        load(toml=path)
    with pytest.raises(ConfigError, match="TOML file only"):
        load(env={"PEERCRAWL_HOSTS": "x"})
    with pytest.raises(ConfigError, match="proxy: expected"):
        load(flags={"proxy": ["ftp://127.0.0.1:21"]})
