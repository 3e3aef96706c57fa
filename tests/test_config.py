import pytest

from peer.config import FIELDS, Config, ConfigError, load, parse_address, read_seeds


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
