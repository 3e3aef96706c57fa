"""A small authoritative DNS server for the local web: tests, the demo and benchmarks.

The node resolves names itself (over UDP, with its own cache), so tests need a real name server they control:
one that answers from a zone they can change while it runs, can be told to fail a name (NXDOMAIN, SERVFAIL),
to answer slowly or not at all, and logs every question so a test can prove that a cached name caused no
query. Besides addresses (A, AAAA) it serves SRV records, which cluster discovery reads (a Kubernetes headless
service). It speaks DNS over UDP and TCP on loopback, with dnspython's message parsing on trio sockets.

Run as a process for the demo and benchmarks::

    python -m peerlab.localweb.dns_server --zone-file zone.txt --port 5353

The zone file has one ``name ip [ip ...]`` per line (``#`` starts a comment, ``*.suffix`` is a wildcard);
the server prints ``listening 127.0.0.1:PORT`` once it is ready.
"""

from __future__ import annotations

import argparse
import errno
import functools
import ipaddress
import signal
import socket
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import dns.exception
import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import trio

__all__ = ["DnsServer", "Srv", "main", "read_zone_file", "serve_dns"]

_MAX_TCP_MESSAGE = 65535
_PORT_ATTEMPTS = 20


def _norm(name: str) -> str:
    return name.rstrip(".").lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class Srv:
    """One SRV record: ``priority weight port target``."""

    priority: int
    weight: int
    port: int
    target: str

    def text(self) -> str:
        target = self.target if self.target.endswith(".") else self.target + "."
        return f"{self.priority} {self.weight} {self.port} {target}"


@dataclass(slots=True, eq=False, kw_only=True)
class DnsServer:
    """A running server: where it listens, what it serves (mutable while it runs) and what it was asked.

    ``zone`` maps lower-case names (no trailing dot; ``*.suffix`` for a wildcard) to one address or a list.
    ``srv`` maps names to their SRV records; a name listed there with no record exists (an empty answer).
    ``queries`` logs each question as ``(name, type)``, e.g. ``("a.test", "A")``, in arrival order; a
    ``silent`` server reads questions and never answers, logging each as ``(name, "dropped")``.
    """

    address: tuple[str, int]
    zone: dict[str, str | list[str]]
    nxdomain: set[str]
    servfail: set[str]
    ttl: int
    delay: float
    srv: dict[str, list[Srv]] = field(default_factory=dict)
    silent: bool = False
    queries: list[tuple[str, str]] = field(default_factory=list)
    record_queries: bool = True  # the long-running process turns the log off so it does not grow forever

    @property
    def nameserver(self) -> str:
        """``"ADDR:PORT"``, as ``Config.nameservers`` and discovery take it."""
        return f"{self.address[0]}:{self.address[1]}"

    def dropped(self, query: dns.message.Message) -> bool:
        """Whether a silent server drops ``query`` (logged as ``(name, "dropped")``)."""
        if not self.silent:
            return False
        if self.record_queries:
            self.queries.append((_norm(query.question[0].name.to_text()) if query.question else "", "dropped"))
        return True

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        """The response to ``query`` (pure apart from appending to ``queries``)."""
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if query.opcode() != 0 or len(query.question) != 1:
            response.set_rcode(dns.rcode.NOTIMP if query.opcode() != 0 else dns.rcode.FORMERR)
            return response
        question = query.question[0]
        name = _norm(question.name.to_text())
        rdtype = question.rdtype
        if self.record_queries:
            self.queries.append((name, dns.rdatatype.to_text(rdtype)))
        if question.rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.REFUSED)
            return response
        if name in self.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
            return response
        addresses = None if name in self.nxdomain else self._lookup(name)
        records = None if name in self.nxdomain else self.srv.get(name)
        if addresses is None and records is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
            return response
        if rdtype == dns.rdatatype.SRV and records:
            texts = [r.text() for r in records]
            response.answer.append(dns.rrset.from_text_list(question.name, self.ttl, "IN", rdtype, texts))
        elif addresses and rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
            version = 4 if rdtype == dns.rdatatype.A else 6
            matching = [a for a in addresses if ipaddress.ip_address(a).version == version]
            if matching:
                response.answer.append(
                    dns.rrset.from_text_list(question.name, self.ttl, "IN", rdtype, matching)
                )
        return response

    def _lookup(self, name: str) -> list[str] | None:
        value = self.zone.get(name)
        if value is None:
            labels = name.split(".")
            for i in range(1, len(labels)):
                value = self.zone.get("*." + ".".join(labels[i:]))
                if value is not None:
                    break
            else:
                return None
        return [value] if isinstance(value, str) else list(value)


def _udp_wire(server: DnsServer, query: dns.message.Message) -> bytes:
    response = server.answer(query)
    limit = max(512, query.payload) if query.edns >= 0 else 512
    try:
        return response.to_wire(max_size=limit)
    except dns.exception.TooBig:
        # Too big for UDP: send the header with TC set so the client asks again over TCP.
        response.answer.clear()
        response.flags |= dns.flags.TC
        return response.to_wire()


async def _bind_pair(host: str, port: int) -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    """A UDP socket and a listening TCP socket on the same port (OS-chosen when ``port`` is 0)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(_PORT_ATTEMPTS):
        udp = trio.socket.socket(family, socket.SOCK_DGRAM)
        # A deep receive buffer: hundreds of look-ups in flight overflow the default ~200 KB and make
        # clients retry after a second (the kernel caps this at net.core.rmem_max).
        udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        await udp.bind((host, port))
        chosen = udp.getsockname()[1]
        tcp = trio.socket.socket(family, socket.SOCK_STREAM)
        tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await tcp.bind((host, chosen))
        except OSError as exc:
            udp.close()
            tcp.close()
            if port != 0 or exc.errno != errno.EADDRINUSE:
                raise
            continue
        tcp.listen(64)
        return udp, tcp
    raise OSError(errno.EADDRINUSE, f"no port free for both UDP and TCP on {host} after {_PORT_ATTEMPTS} tries")


async def _answer_udp(server: DnsServer, sock: trio.socket.SocketType, data: bytes, peer: tuple[object, ...]) -> None:
    try:
        query = dns.message.from_wire(data)
    except dns.exception.DNSException:
        return  # not a DNS query: nothing sensible to answer
    if server.dropped(query):
        return
    if server.delay > 0:
        await trio.sleep(server.delay)
    try:
        await sock.sendto(_udp_wire(server, query), peer)
    except OSError:
        pass  # the client went away; UDP has no one to tell


async def _serve_udp(server: DnsServer, sock: trio.socket.SocketType) -> None:
    async with trio.open_nursery() as nursery:
        while True:
            try:
                data, peer = await sock.recvfrom(_MAX_TCP_MESSAGE)
            except ConnectionError:
                continue  # an ICMP error from an earlier reply's destination
            nursery.start_soon(_answer_udp, server, sock, data, peer)


async def _receive_exactly(stream: trio.SocketStream, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


async def _serve_tcp_connection(server: DnsServer, stream: trio.SocketStream) -> None:
    async with stream:
        try:
            while True:
                with trio.move_on_after(30):
                    prefix = await _receive_exactly(stream, 2)
                    if prefix is None:
                        return
                    data = await _receive_exactly(stream, int.from_bytes(prefix, "big"))
                    if data is None:
                        return
                    query = dns.message.from_wire(data)
                    if server.dropped(query):
                        continue
                    if server.delay > 0:
                        await trio.sleep(server.delay)
                    wire = server.answer(query).to_wire()
                    await stream.send_all(len(wire).to_bytes(2, "big") + wire)
                    continue
                return  # idle for 30 s: close
        except (dns.exception.DNSException, trio.BrokenResourceError, trio.ClosedResourceError):
            return


async def serve_dns(
    zone: Mapping[str, str | list[str]],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ttl: int = 300,
    nxdomain: Collection[str] = (),
    servfail: Collection[str] = (),
    delay: float = 0.0,
    srv: Mapping[str, Sequence[Srv]] | None = None,
    silent: bool = False,
    task_status: trio.TaskStatus[DnsServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``zone`` (and the ``srv`` records) over UDP and TCP until cancelled; ``task_status.started`` gets
    the DnsServer.

    Names neither in the zone (nor matched by a ``*.`` wildcard) nor in ``srv`` get NXDOMAIN, as do names in
    ``nxdomain``; names in ``servfail`` get SERVFAIL. A name with only IPv4 addresses gets an empty AAAA
    answer, a name without SRV records an empty SRV answer. ``delay`` seconds pass before each answer;
    ``silent`` drops every question instead (a server that times out).
    """
    udp, tcp = await _bind_pair(host, port)
    with udp, tcp:
        server = DnsServer(
            address=(host, udp.getsockname()[1]),
            zone={_norm(k): v for k, v in zone.items()},
            nxdomain={_norm(n) for n in nxdomain},
            servfail={_norm(n) for n in servfail},
            ttl=ttl,
            delay=delay,
            srv={_norm(k): list(v) for k, v in (srv or {}).items()},
            silent=silent,
        )
        listener = trio.SocketListener(tcp)

        async def handle(stream: trio.SocketStream) -> None:
            await _serve_tcp_connection(server, stream)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_udp, server, udp)
            nursery.start_soon(trio.serve_listeners, handle, [listener])
            task_status.started(server)


def read_zone_file(path: str) -> dict[str, list[str]]:
    """Parse a zone file of ``name ip [ip ...]`` lines; raises ValueError naming the bad line."""
    zone: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            name, *ips = line.split()
            if not ips:
                raise ValueError(f"{path}:{lineno}: expected 'name ip', got {raw.strip()!r}")
            for ip in ips:
                try:
                    ipaddress.ip_address(ip)
                except ValueError:
                    raise ValueError(f"{path}:{lineno}: {ip!r} is not an IP address") from None
            zone.setdefault(_norm(name), []).extend(ips)
    return zone


async def _run(args: argparse.Namespace, zone: dict[str, list[str]]) -> str | None:
    """Serve until SIGINT or SIGTERM; returns an error line if the server could not start."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            start = functools.partial(serve_dns, zone, host=args.host, port=args.port, ttl=args.ttl, delay=args.delay)
            try:
                server = await nursery.start(start)
            except OSError as exc:
                return f"dns_server: cannot listen on {args.host}:{args.port}: {exc}"
            server.record_queries = False
            host, port = server.address
            print(f"listening {host}:{port}", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    return None


def main(argv: list[str] | None = None) -> int:
    """Command line: serve a zone file until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m peerlab.localweb.dns_server",
        description="Serve a zone file over DNS (UDP and TCP) for the local web.",
        epilog="example: python -m peerlab.localweb.dns_server --zone-file zone.txt --port 5353",
    )
    parser.add_argument("--zone-file", required=True, help="lines of 'name ip [ip ...]'; '*.suffix' is a wildcard")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port for UDP and TCP (default: chosen by the OS)")
    parser.add_argument("--ttl", type=int, default=300, help="TTL of every answer in seconds (default 300)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before each answer")
    args = parser.parse_args(argv)
    try:
        zone = read_zone_file(args.zone_file)
    except (OSError, ValueError) as exc:
        print(f"dns_server: cannot read zone file: {exc}", file=sys.stderr)
        return 2
    error = trio.run(_run, args, zone)
    if error is not None:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
