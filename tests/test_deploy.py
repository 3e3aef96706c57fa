"""The deployment files (deploy/systemd, deploy/docker, deploy/k8s, deploy/README.md) and the configuration
reference, checked against the code they drive.

Every ``peerd``/``peerctl`` command line in them is parsed by the real argparse parsers of peer/cli/main.py (their
``_run`` is replaced, so nothing runs) and every node's settings are built by ``peer.config.load`` from the
same flags, environment and TOML the deployment gives it. The YAML is checked for the fields that matter
(selectors, named ports, the SRV name), the Dockerfile's health check runs against a real node on loopback,
and the local web of the compose file is started on loopback with the compose file's own arguments. External
linters run when installed and skip with the reason otherwise: systemd-analyze (apt package systemd),
shellcheck (apt package shellcheck) and kubectl (kustomize rendering).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import dns.message
import dns.query
import dns.rdatatype
import httpx
import pytest
import yaml  # type: ignore[import-untyped]

from peer.cli import main as cli
from peer.config import FIELDS, TOML_ONLY, Config, load
from peer.control import auth_headers

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKER = DEPLOY / "docker"
SYSTEMD = DEPLOY / "systemd"
SETTINGS = {f.name for f in dataclasses.fields(Config)}
FAKE_SECRET = "0123456789abcdef0123456789abcdef"
DEADLINE = 20.0  # seconds any process started here gets to become ready or to exit


# --------------------------------------------------------------------------- helpers


def parse(main, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed by the real parser of ``main`` (peerd_main or peerctl_main), without running it."""
    captured: list[argparse.Namespace] = []

    def run(args: argparse.Namespace, prog: str) -> int:
        captured.append(args)
        return 0

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "_run", run)
        try:
            main(list(argv))
        except SystemExit as exc:
            pytest.fail(f"{main.__name__} rejects {shlex.join(argv)} (exit {exc.code}; the reason is on stderr)")
    assert len(captured) == 1
    return captured[0]


def node_config(argv: Sequence[str], env: Mapping[str, str] = {}, toml: Path | None = None) -> Config:
    """The settings ``peerd <argv>`` would run with: the real parser, then ``load`` as the CLI calls it."""
    args = parse(cli.peerd_main, argv)
    assert args.cmd == "start", argv
    flags = {name: getattr(args, name, None) for name in SETTINGS}
    return load(toml=toml if toml is not None else args.config, env=env, flags=flags)


class _Built(Exception):
    pass


def subcommands(main) -> set[str]:
    """The subcommand names of ``main``'s real parser, read from the parser it builds."""
    built: list[argparse.ArgumentParser] = []

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        built.append(self)
        raise _Built

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_known_args", capture)  # parse_args calls it too
        with pytest.raises(_Built):
            main([])
    (action,) = [a for a in built[0]._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


def command_lines(text: str) -> Iterator[list[str]]:
    """Every ``peerd SUBCOMMAND ...``/``peerctl SUBCOMMAND ...`` in shell-like ``text`` (the program as a bare
    name or a path), up to a shell operator or comment. ``peerd`` followed by anything else (a unit name in
    ``systemctl restart peerd``) is not a command line."""
    programs = {"peerd": subcommands(cli.peerd_main), "peerctl": subcommands(cli.peerctl_main)}
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, word in enumerate(words):
            program = Path(word.lstrip("-@:+!")).name
            rest = [w for w in words[i + 1 : i + 3] if w != "--debug"]
            if program in programs and rest and rest[0] in programs[program]:
                cmd = [program]
                for w in words[i + 1 :]:
                    if w in (";", "&&", "||", "|", ">", ">>", "<") or w.startswith((">", "2>")):
                        break
                    if w not in ("$@", "$*"):  # a script's own arguments: none when checked here
                        cmd.append(w)
                yield cmd
                break


def check_command(cmd: list[str], env: Mapping[str, str] = {}) -> argparse.Namespace:
    if cmd[0] == "peerd":
        args = parse(cli.peerd_main, cmd[1:])
        if args.cmd == "start":
            secret = {} if args.cluster_secret_file else {"PEERCRAWL_CLUSTER_SECRET": FAKE_SECRET}
            node_config(cmd[1:], {**env, **secret}, toml=Path(os.devnull))
        return args
    return parse(cli.peerctl_main, cmd[1:])


def env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path}: not KEY=VALUE: {line!r}"
            env[key] = value
    return env


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs and all(isinstance(d, dict) for d in docs), path
    return docs


def k8s_objects() -> dict[str, dict[str, Any]]:
    objects: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml_docs(path):
            if doc.get("kind") != "Kustomization":
                assert doc["kind"] not in objects, f"two {doc['kind']} objects"
                objects[doc["kind"]] = doc
    return objects


def expand_k8s(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], text)


def interpolate(value: str, env: Mapping[str, str] = {}) -> str:
    """Compose's ``${VAR}``, ``${VAR-default}`` and ``${VAR:-default}`` with ``env`` (empty: the defaults)."""

    def one(m: re.Match[str]) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        if name in env and (op != ":-" or env[name]):
            return env[name]
        return default if op else ""

    return re.sub(r"\$\{(\w+)(?:(:?-)([^}]*))?\}", one, value)


def subset(small: Mapping[str, str], big: Mapping[str, str]) -> bool:
    return all(big.get(k) == v for k, v in small.items())


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (INSTRUCTION, rest), continuation lines joined."""
    text = (DOCKER / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            instr, _, rest = line.strip().partition(" ")
            out.append((instr.upper(), rest.strip()))
    return out


def docker_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for instr, rest in dockerfile():
        if instr == "ENV":
            for pair in shlex.split(rest):
                key, _, value = pair.partition("=")
                env[key] = value
    return env


def last(instr: str) -> str:
    found = [rest for i, rest in dockerfile() if i == instr]
    assert found, f"the Dockerfile has no {instr}"
    return found[-1]


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


# --------------------------------------------------------------------------- YAML


def test_every_yaml_file_parses() -> None:
    paths = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert {p.relative_to(DEPLOY).as_posix() for p in paths} >= {
        "docker/compose.yaml", "k8s/service.yaml", "k8s/statefulset.yaml", "k8s/kustomization.yaml"}
    for path in paths:
        yaml_docs(path)


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = yaml_docs(K8S / "kustomization.yaml")
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(manifests)


def test_kustomize_renders_the_manifests() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it renders the kustomization offline)")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out.stdout) if d)
    assert kinds == sorted(k8s_objects())


# --------------------------------------------------------------------------- Kubernetes


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict[str, Any]]:
    objects = k8s_objects()
    assert {"Service", "StatefulSet", "ConfigMap", "PodDisruptionBudget", "NetworkPolicy"} <= set(objects)
    return objects


@pytest.fixture(scope="module")
def pod_env() -> dict[str, str]:
    return {"POD_NAME": "peerd-1", "POD_NAMESPACE": "crawl"}


def container(k8s: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (c,) = k8s["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return c


def k8s_config(k8s: dict[str, dict[str, Any]], pod_env: dict[str, str], tmp_path: Path) -> Config:
    c = container(k8s)
    args = [expand_k8s(a, pod_env) for a in c["args"]]
    config_path = parse(cli.peerd_main, ["start", *args]).config
    (name, text), = k8s["ConfigMap"]["data"].items()
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert config_path == f"{mount['mountPath']}/{name}"
    toml = tmp_path / name
    toml.write_text(text)
    return node_config(["start", *args], env={}, toml=toml)


def test_selectors_match_the_pod_labels(k8s: dict[str, dict[str, Any]]) -> None:
    sts = k8s["StatefulSet"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert subset(sts["spec"]["selector"]["matchLabels"], labels)
    assert subset(k8s["Service"]["spec"]["selector"], labels)
    assert subset(k8s["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"], labels)
    assert subset(k8s["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"], labels)
    assert sts["spec"]["serviceName"] == k8s["Service"]["metadata"]["name"]


def test_headless_service_publishes_named_ports(k8s: dict[str, dict[str, Any]]) -> None:
    spec = k8s["Service"]["spec"]
    assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
    container_ports = {p["name"]: p["containerPort"] for p in container(k8s)["ports"]}
    for port in spec["ports"]:
        assert port["name"] and port["targetPort"] in container_ports
        assert container_ports[port["targetPort"]] == port["port"]
    for rule in k8s["NetworkPolicy"]["spec"]["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= set(container_ports)


def test_node_settings_come_from_the_pod(k8s, pod_env, tmp_path: Path) -> None:
    cfg = k8s_config(k8s, pod_env, tmp_path)
    svc = k8s["Service"]
    peer_port = next(p for p in svc["spec"]["ports"] if p["port"] == port_of(cfg.listen))
    name, ns = svc["metadata"]["name"], pod_env["POD_NAMESPACE"]
    # The SRV name is the one Kubernetes publishes for the named peer port of the headless service...
    assert cfg.join_srv == f"_{peer_port['name']}._{peer_port['protocol'].lower()}.{name}.{ns}.svc.cluster.local"
    # ...and the address we advertise is exactly the target that record lists for this pod, so
    # srv_seeds(exclude=[advertise]) leaves this pod out.
    assert cfg.advertise == f"{pod_env['POD_NAME']}.{name}.{ns}.svc.cluster.local:{peer_port['port']}"
    assert cfg.node_id == pod_env["POD_NAME"]
    assert cfg.listen.startswith("0.0.0.0:") and cfg.control.startswith("0.0.0.0:")
    assert cfg.seeds and cfg.contact, "the ConfigMap's TOML gives seeds and a contact"
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container(k8s)["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}


def test_data_dir_is_a_persistent_volume_per_pod(k8s, pod_env, tmp_path: Path) -> None:
    cfg = k8s_config(k8s, pod_env, tmp_path)
    sts = k8s["StatefulSet"]["spec"]
    (claim,) = sts["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["name"]: m["mountPath"] for m in container(k8s)["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == cfg.data_dir
    volumes = {v["name"]: v for v in sts["template"]["spec"]["volumes"]}
    assert set(mounts) == set(volumes) | {claim["metadata"]["name"]}
    assert claim["metadata"]["name"] not in volumes


def test_cluster_secret_is_a_mounted_secret(k8s, pod_env, tmp_path: Path) -> None:
    cfg = k8s_config(k8s, pod_env, tmp_path)
    c = container(k8s)
    secret_dir, key = cfg.cluster_secret_file.rsplit("/", 1)
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == secret_dir)
    volume = next(v for v in k8s["StatefulSet"]["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"]
    statefulset_text = (K8S / "statefulset.yaml").read_text()
    assert f"kubectl create secret generic {volume['secret']['secretName']} --from-literal={key}=" in statefulset_text
    assert not any(e["name"] == "PEERCRAWL_CLUSTER_SECRET" for e in c.get("env", []))


def test_probes_hit_healthz_on_the_control_port(k8s, pod_env, tmp_path: Path) -> None:
    cfg = k8s_config(k8s, pod_env, tmp_path)
    c = container(k8s)
    control = next(p for p in c["ports"] if p["containerPort"] == port_of(cfg.control))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": control["name"]}, probe


def test_prestop_leaves_within_the_grace_period(k8s, pod_env, tmp_path: Path) -> None:
    cfg = k8s_config(k8s, pod_env, tmp_path)
    command = container(k8s)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "peerctl"
    args = parse(cli.peerctl_main, command[1:])
    assert args.cmd == "leave" and not args.no_wait
    assert port_of(args.control) == port_of(cfg.control) and args.control.startswith("127.0.0.1:")
    grace = k8s["StatefulSet"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert cfg.leave_timeout < args.timeout < grace


# --------------------------------------------------------------------------- Dockerfile and compose


def test_dockerfile_image() -> None:
    instructions = dockerfile()
    froms = [rest for i, rest in instructions if i == "FROM"]
    assert froms and all(f.split()[0] == "python:3.11-slim" for f in froms)
    user = last("USER")
    assert user not in ("root", "0")
    env = docker_env()
    cfg = load(env={k: v for k, v in env.items() if k.startswith("PEERCRAWL_")})
    assert json.loads(last("VOLUME")) == [cfg.data_dir]
    exposed = last("EXPOSE").split()
    assert {int(p.split("/")[0]) for p in exposed} == {port_of(cfg.listen), port_of(cfg.control)}
    assert f"{port_of(cfg.listen)}/udp" in exposed  # membership's datagrams on the peer port
    entry = json.loads(last("ENTRYPOINT"))
    assert entry == ["peerd", "start"]
    check_command(entry, env)


@pytest.mark.slow
def test_image_build_installs_from_what_it_copies(tmp_path: Path) -> None:
    """The build stage's COPY set is enough: pip builds the project from only those files, and the result
    has the console scripts and the modules the image and the compose file run."""
    src = tmp_path / "src"
    src.mkdir()
    copies = [shlex.split(rest) for instr, rest in dockerfile() if instr == "COPY" and not rest.startswith("--")]
    assert copies
    for *sources, dest in copies:  # relative to WORKDIR, which src stands for
        for name in sources:
            target = src / dest / name if dest.endswith("/") or len(sources) > 1 else src / dest
            (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, target)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                          str(tmp_path / "site"), str(src)], capture_output=True, text=True, timeout=300, check=False)
    if out.returncode != 0 and "Could not find a version" in out.stderr + out.stdout:
        pytest.skip(f"pip cannot reach a package index for the build backend: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr
    assert {"peerd", "peerctl"} <= {p.name for p in (tmp_path / "site" / "bin").iterdir()}
    modules = ["ring", "protocol", "storage", "peer.cli.main", "peer.node", "peer.cluster.net.discovery", "peerlab.localweb.server",
               "peerlab.localweb.dns_server"]
    code = "import importlib, sys; print(*[importlib.import_module(m).__file__ for m in sys.argv[1:]])"
    found = subprocess.run([sys.executable, "-c", code, *modules], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, timeout=60, check=False)
    assert found.returncode == 0, found.stderr
    outside = [f for f in found.stdout.split() if not Path(f).is_relative_to(tmp_path / "site")]
    assert outside == [], "not installed from the image's files (a COPY is missing)"


def healthcheck_command() -> list[str]:
    rest = last("HEALTHCHECK")
    cmd = json.loads(rest[rest.index("CMD") + 3 :])
    assert cmd[:2] == ["python", "-c"]
    return [sys.executable, *cmd[1:]]


@pytest.mark.slow
def test_healthcheck_and_sigterm_against_a_real_node(tmp_path: Path) -> None:
    """The image's HEALTHCHECK passes against a running node, which SIGTERM stops cleanly, and then fails."""
    data = tmp_path / "node"
    env = {**os.environ, "PEERCRAWL_DATA_DIR": str(data)}
    cmd = [sys.executable, "-m", "peer", "start", "--node-id", "health-test", "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--log-format", "json"]
    log = tmp_path / "node.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        addr_file = data / "control.addr"
        deadline = time.monotonic() + DEADLINE
        while not addr_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert addr_file.exists(), f"the node did not start: {log.read_text()}"
        control = addr_file.read_text().strip()
        check = {**os.environ, "PEERCRAWL_CONTROL": control}
        ok = subprocess.run(healthcheck_command(), env=check, capture_output=True, text=True, timeout=DEADLINE,
                            check=False)
        assert ok.returncode == 0, ok.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0, log.read_text()
        failed = subprocess.run(healthcheck_command(), env=check, capture_output=True, timeout=DEADLINE, check=False)
        assert failed.returncode != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    (doc,) = yaml_docs(DOCKER / "compose.yaml")
    return doc


def compose_nodes(compose: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any], Config]]:
    """Service name -> (service, the node's settings), for every service running the image's entrypoint."""
    base = {k: v for k, v in docker_env().items() if k.startswith("PEERCRAWL_")}
    entry = json.loads(last("ENTRYPOINT"))
    nodes = {}
    for name, svc in compose["services"].items():
        if "entrypoint" in svc:
            continue
        env = {**base, **{k: interpolate(str(v)) for k, v in svc.get("environment", {}).items()}}
        assert svc["env_file"] == ["cluster.env"]
        env["PEERCRAWL_CLUSTER_SECRET"] = FAKE_SECRET  # what cluster.env holds
        cfg = node_config([*entry[1:], *svc["command"]], env=env, toml=Path(os.devnull))
        nodes[name] = (name, svc, cfg)
    return nodes


def test_compose_cluster_of_four_weighted_nodes(compose: dict[str, Any]) -> None:
    nodes = compose_nodes(compose)
    weights = {cfg.node_id: cfg.weight for _, _, cfg in nodes.values()}
    assert weights == {"A": 150, "B": 80, "C": 200, "D": 40}
    (first,) = [cfg for _, _, cfg in nodes.values() if not cfg.join]
    assert first.node_id == "A" and first.seeds
    for name, svc, cfg in nodes.values():
        assert cfg.advertise == f"{name}:{port_of(cfg.listen)}"
        if cfg is not first:
            assert cfg.join == (first.advertise,)
            assert svc["depends_on"][first.advertise.split(":")[0]]["condition"] == "service_healthy"
    volumes = [svc["volumes"][0].split(":") for _, svc, _ in nodes.values()]
    assert len({v[0] for v in volumes}) == len(nodes), "every node has a volume of its own"
    assert all(v[1] == cfg.data_dir for v, (_, _, cfg) in zip(volumes, nodes.values()))
    assert {v[0] for v in volumes} <= set(compose["volumes"])
    published = [svc["ports"][0] for _, svc, _ in nodes.values()]
    assert len(set(published)) == len(nodes)
    assert all(p.startswith("127.0.0.1:") and port_of(p) == port_of(cfg.control)
               for p, (_, _, cfg) in zip(published, nodes.values()))
    header = (DOCKER / "compose.yaml").read_text()
    assert '"PEERCRAWL_CLUSTER_SECRET=" + secrets.token_hex(32)' in header
    assert "cluster.env" in (DOCKER / ".gitignore").read_text().split()


def test_compose_can_crawl_the_real_web_instead(compose: dict[str, Any]) -> None:
    """With NAMESERVERS and ALLOW_PRIVATE set empty, the nodes use the system resolver and refuse private
    addresses; SEEDS and CONTACT come through."""
    base = {k: v for k, v in docker_env().items() if k.startswith("PEERCRAWL_")}
    user = {"NAMESERVERS": "", "ALLOW_PRIVATE": "", "SEEDS": "https://a.example/,https://b.example/",
            "CONTACT": "https://example.org/crawler"}
    svc = compose["services"]["node-a"]
    env = {**base, **{k: interpolate(str(v), user) for k, v in svc["environment"].items()},
           "PEERCRAWL_CLUSTER_SECRET": FAKE_SECRET}
    cfg = node_config(["start", *svc["command"]], env=env, toml=Path(os.devnull))
    assert cfg.nameservers == () and cfg.allow_private is False
    assert cfg.seeds == ("https://a.example/", "https://b.example/") and cfg.contact == user["CONTACT"]


def _start_listening(cmd: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # The server prints "listening HOST:PORT" once ready, or exits.
    ready, _, _ = select.select([proc.stdout], [], [], DEADLINE)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("listening "):
        proc.kill()
        _, err = proc.communicate(timeout=DEADLINE)
        pytest.fail(f"{shlex.join(cmd)} did not start: {line!r} {err!r}")
    return proc, port_of(line.split()[1])


def _loopback(args: list[str], **replace: str) -> list[str]:
    out = list(args)
    for flag, value in replace.items():
        out[out.index(f"--{flag.replace('_', '-')}") + 1] = value
    return out


@pytest.mark.slow
def test_compose_local_web_serves_the_seed(compose: dict[str, Any], tmp_path: Path) -> None:
    """The compose file's web and DNS services, run on loopback with its own arguments: the seed's host
    resolves to the web service's address and the web answers the seed URL."""
    services = compose["services"]
    web, name_server = services["web"], services["dns"]
    (zone_ref,) = name_server["configs"]
    zone = tmp_path / "zone.txt"
    zone.write_text(compose["configs"][zone_ref["source"]]["content"])
    dns_args = _loopback(name_server["command"], zone_file=str(zone), host="127.0.0.1", port="0")
    assert name_server["command"][name_server["command"].index("--zone-file") + 1] == zone_ref["target"]
    web_args = _loopback(web["command"], host="127.0.0.1", port="0")
    from peerlab.localweb.server import _parser as web_parser

    web_parser().parse_args(web_args)
    nodes = compose_nodes(compose)
    cfg = nodes["node-a"][2]
    (seed,) = cfg.seeds
    url = httpx.URL(seed)
    web_ip = web["networks"]["crawl"]["ipv4_address"]
    dns_ip = name_server["networks"]["crawl"]["ipv4_address"]
    assert cfg.nameservers == (f"{dns_ip}:{name_server['command'][name_server['command'].index('--port') + 1]}",)
    assert url.port == int(web["command"][web["command"].index("--port") + 1]) and cfg.allow_private
    procs = []
    try:
        dns_proc, dns_port = _start_listening([sys.executable, *name_server["entrypoint"][1:], *dns_args])
        procs.append(dns_proc)
        web_proc, web_port = _start_listening([sys.executable, *web["entrypoint"][1:], *web_args])
        procs.append(web_proc)
        query = dns.message.make_query(url.host, dns.rdatatype.A)
        answer = dns.query.udp(query, "127.0.0.1", port=dns_port, timeout=5.0)
        assert [r.address for rrset in answer.answer for r in rrset] == [web_ip]
        resp = httpx.get(f"http://127.0.0.1:{web_port}{url.raw_path.decode()}",
                         headers={"Host": url.netloc.decode()}, timeout=10.0)
        assert resp.status_code == 200 and "<a " in resp.text
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


# --------------------------------------------------------------------------- systemd


def unit(path: Path) -> dict[str, list[str]]:
    """``Key=value`` lines of a unit file (every section), values of repeated keys in order."""
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


SPECIFIERS = {"%S": "/var/lib", "%d": "/run/credentials/peerd.service"}


def systemd_command(line: str) -> list[str]:
    for spec, value in SPECIFIERS.items():
        line = line.replace(spec, value)
    words = shlex.split(line)
    words[0] = Path(words[0].lstrip("-@:+!")).name
    return words


def test_systemd_unit_runs_a_clean_node() -> None:
    keys = unit(SYSTEMD / "peerd.service")
    (start,) = keys["ExecStart"]
    cmd = systemd_command(start)
    assert cmd[:2] == ["peerd", "start"]
    assert keys["EnvironmentFile"] == ["/etc/peercrawl/peerd.env"]
    env = env_file(SYSTEMD / "peerd.env")
    assert "PEERCRAWL_CLUSTER_SECRET" not in env, "the secret is a credential, not an environment variable"
    cfg = node_config(cmd[1:], env=env, toml=Path(os.devnull))
    assert cfg.data_dir == f"{SPECIFIERS['%S']}/{keys['StateDirectory'][0]}"
    credential, _, source = keys["LoadCredential"][0].partition(":")
    assert cfg.cluster_secret_file == f"{SPECIFIERS['%d']}/{credential}" and source.startswith("/etc/")
    assert cfg.join and cfg.advertise and cfg.listen.startswith("0.0.0.0:")
    assert keys["Restart"] == ["on-failure"] and keys["KillSignal"] == ["SIGTERM"]
    assert keys["DynamicUser"] == ["yes"] and keys["NoNewPrivileges"] == ["yes"]
    assert keys["ProtectSystem"] == ["strict"]


def test_leave_drop_in_waits_for_the_hand_off() -> None:
    keys = unit(SYSTEMD / "leave-on-stop.conf")
    (stop,) = keys["ExecStop"]
    cmd = systemd_command(stop)
    args = parse(cli.peerctl_main, cmd[1:])
    assert cmd[0] == "peerctl" and args.cmd == "leave" and not args.no_wait
    data_dir = node_config(systemd_command(unit(SYSTEMD / "peerd.service")["ExecStart"][0])[1:],
                           env=env_file(SYSTEMD / "peerd.env"), toml=Path(os.devnull)).data_dir
    assert args.data_dir == data_dir
    assert Config().leave_timeout < args.timeout < float(keys["TimeoutStopSec"][0])


@pytest.mark.slow
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (apt package systemd)")
    bindir = Path(sys.executable).parent
    if not (bindir / "peerd").exists():
        pytest.skip(f"no peerd console script beside {sys.executable} (install the project into this venv)")
    # The unit names /opt/peercrawl/bin; point it at this venv's scripts so the executables are checked too.
    (tmp_path / "peerd.service").write_text((SYSTEMD / "peerd.service").read_text().replace(
        "/opt/peercrawl/bin", str(bindir)))
    drop_in = tmp_path / "peerd.service.d"
    drop_in.mkdir()
    (drop_in / "leave-on-stop.conf").write_text((SYSTEMD / "leave-on-stop.conf").read_text().replace(
        "/opt/peercrawl/bin", str(bindir)))
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:", "SYSTEMD_LOG_COLOR": "0"}
    out = subprocess.run([tool, "verify", str(tmp_path / "peerd.service")], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    # Warnings (an unknown key, a bad value) leave the exit code 0: any output at all is a finding.
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr


# --------------------------------------------------------------------------- shell


def readme_shell_blocks() -> str:
    text = (DEPLOY / "README.md").read_text()
    return "\n".join(re.findall(r"```(?:sh|bash|shell)\n(.*?)```", text, flags=re.DOTALL))


@pytest.mark.slow
def test_shellcheck(tmp_path: Path) -> None:
    tool = shutil.which("shellcheck")
    if tool is None:
        pytest.skip("shellcheck is not installed (apt package shellcheck)")
    readme = tmp_path / "deploy-readme.sh"
    readme.write_text("#!/usr/bin/env bash\n" + readme_shell_blocks())
    ci = [ROOT / ".ci" / "run", *sorted((ROOT / ".ci").glob("*.sh"))]
    scripts = sorted(DEPLOY.glob("*.sh")) + sorted(DEPLOY.glob("*/*.sh")) + ci + [readme]
    out = subprocess.run([tool, "--shell=bash", "--severity=style", *map(str, scripts)], capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


# --------------------------------------------------------------------------- commands, settings, docs


def deployment_texts() -> dict[str, str]:
    paths = [p for p in sorted(DEPLOY.rglob("*")) if p.is_file() and p.suffix not in (".py", ".pyc")]
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths if "__pycache__" not in p.parts}


def commands_in(name: str, text: str) -> list[list[str]]:
    """The commands a reader would run: code blocks of Markdown, comments of YAML and Dockerfiles (their
    structured parts are checked above), everything else whole."""
    if name.endswith(".md"):
        text = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL))
    elif name.endswith((".yaml", "Dockerfile")):
        text = "\n".join(line.strip()[1:] for line in text.splitlines() if line.strip().startswith("#"))
    return list(command_lines(text))


def test_every_command_line_parses() -> None:
    """Every peerd/peerctl command in the deployment files and deploy/README.md parses, and every node
    started there has valid settings."""
    found: dict[str, int] = {}
    for name, text in deployment_texts().items():
        for cmd in commands_in(name, text):
            args = check_command(cmd)
            if cmd[0] == "peerctl" and args.cmd != "demo":
                # Name the node: `peerctl ring` needs it, and a container's PEERCRAWL_CONTROL is 0.0.0.0.
                assert args.control or args.data_dir, f"{name}: {shlex.join(cmd)} names no node"
            found[name] = found.get(name, 0) + 1
    assert found.get("deploy/README.md", 0) >= 5
    assert found.get("deploy/systemd/peerd.service", 0) >= 1 and found.get("deploy/docker/compose.yaml", 0) >= 2


def test_command_lines_finds_commands_and_a_bad_flag_fails() -> None:
    text = "x && /opt/peercrawl/bin/peerctl status --cluster --control 127.0.0.1:7410 | head  # note\n" \
           "docker compose exec node-c peerctl leave --no-wait\n"
    assert list(command_lines(text)) == [
        ["peerctl", "status", "--cluster", "--control", "127.0.0.1:7410"], ["peerctl", "leave", "--no-wait"]]
    with pytest.raises(pytest.fail.Exception):
        check_command(["peerd", "start", "--wieght", "3"])


def test_environment_variables_are_settings() -> None:
    used: set[str] = set()
    for text in [*deployment_texts().values(), (ROOT / "docs" / "configuration.md").read_text()]:
        used |= set(re.findall(r"\bPEERCRAWL_([A-Z0-9_]+)\b", text))
    unknown = sorted(name for name in used if name.lower() not in SETTINGS)
    assert unknown == [] and len(used) > 10


def _configdoc():
    spec = importlib.util.spec_from_file_location("configdoc", DEPLOY / "configdoc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_is_in_sync() -> None:
    configdoc = _configdoc()
    assert configdoc.check() == []
    current = (ROOT / "docs" / "configuration.md").read_text()
    assert current == configdoc.render(), "docs/configuration.md is stale: run .venv/bin/python deploy/configdoc.py --write"
    for name in SETTINGS:
        env = "`-`" if name in TOML_ONLY else f"`PEERCRAWL_{name.upper()}`"  # tables: the TOML file only
        assert f"| `{name}` |" in current and env in current


def test_configuration_reference_refuses_holes(monkeypatch: pytest.MonkeyPatch) -> None:
    configdoc = _configdoc()
    monkeypatch.setattr(configdoc, "FIELDS", {k: v for k, v in FIELDS.items() if k != "weight"} | {"gone": "x"})
    assert configdoc.check() == ["setting 'weight' has no reason in peer.config.FIELDS",
                                 "FIELDS has a reason for 'gone', which is not a setting"]
    with pytest.raises(SystemExit, match="configdoc: setting 'weight'"):
        configdoc.render()


# --------------------------------------------------------------------------- Grafana


GRAFANA = ROOT / "deploy" / "grafana" / "peercrawl-dashboard.json"


def _grafana_metrics() -> set[str]:
    board = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    return {name for e in exprs for name in re.findall(r"\b((?:peercrawl|process)_[a-z_]+)\b", e)}


@pytest.mark.slow  # a cluster of nodes crawls first
def test_grafana_dashboard_reads_only_metrics_a_real_cluster_node_exports(tmp_path: Path) -> None:
    """Every metric the Grafana dashboard queries is in a running cluster node's /metrics."""
    board = json.loads(GRAFANA.read_text())
    assert board["uid"] and {v["name"] for v in board["templating"]["list"]} == {"datasource", "job"}
    titles = " ".join(p["title"] for p in board["panels"]).lower()
    for panel in ("pages/s", "queued urls", "errors by kind", "dns cache", "robots.txt cache", "resident memory",
                  "key share", "urls sent from each node", "stalled", "estimated completion"):
        assert panel in titles, panel
    wanted = _grafana_metrics()
    data = tmp_path / "node"
    env = {**os.environ, "PEERCRAWL_DATA_DIR": str(data), "PEERCRAWL_CLUSTER_SECRET": "grafana-test-secret-0123456789"}
    cmd = [sys.executable, "-m", "peer", "start", "--node-id", "grafana-test", "--listen", "127.0.0.1:0",
           "--control", "127.0.0.1:0", "--log-format", "json"]
    log = tmp_path / "node.log"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log_file)
    try:
        deadline = time.monotonic() + DEADLINE
        while not (data / "peer.addr").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (data / "peer.addr").exists(), f"the node did not start: {log.read_text()}"
        control = (data / "control.addr").read_text().strip()
        text = httpx.get(f"http://{control}/metrics", timeout=10, headers=auth_headers(data)).text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=DEADLINE)
    exported = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            exported.add(name + "_total" if kind == "counter" and not name.endswith("_total") else name)
        elif line and not line.startswith("#"):
            exported.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    assert wanted - exported == set(), f"the dashboard queries metrics no node exports: {sorted(wanted - exported)}"
