"""A small DNS server for SRV records, on a real UDP socket on loopback (the local web's server has A/AAAA only).

``serve_srv`` answers from ``records`` (a name to its SRV records) while it runs; the zone can be changed in
place. A name listed in ``names_without_srv`` exists but has no SRV record (an empty NOERROR answer), a name in
``servfail`` gets SERVFAIL, any other name NXDOMAIN, and with ``silent`` set the server reads questions and
never answers (a time-out). Every question is logged as ``(name, type)``. UDP only: answers that would not fit
in one datagram are a test's mistake and raise, rather than being truncated for a TCP retry.
"""

from __future__ import annotations

import socket
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

__all__ = ["Srv", "SrvServer", "serve_srv"]


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


def _norm(name: str) -> str:
    return name.rstrip(".").lower()


@dataclass(slots=True, eq=False, kw_only=True)
class SrvServer:
    """A running server: its address, what it serves (mutable while it runs) and the questions it got."""

    address: tuple[str, int]
    records: dict[str, list[Srv]]
    names_without_srv: set[str]
    servfail: set[str]
    ttl: int = 30
    silent: bool = False
    queries: list[tuple[str, str]] = field(default_factory=list)

    @property
    def nameserver(self) -> str:
        """``"ADDR:PORT"`` as ``Config.nameservers`` takes it."""
        return f"{self.address[0]}:{self.address[1]}"

    def answer(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response
        question = query.question[0]
        name = _norm(question.name.to_text())
        self.queries.append((name, dns.rdatatype.to_text(question.rdtype)))
        if question.rdclass != dns.rdataclass.IN:
            response.set_rcode(dns.rcode.REFUSED)
        elif name in self.servfail:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif name in self.records:
            if question.rdtype == dns.rdatatype.SRV and self.records[name]:
                texts = [r.text() for r in self.records[name]]
                response.answer.append(
                    dns.rrset.from_text_list(question.name, self.ttl, "IN", dns.rdatatype.SRV, texts)
                )
        elif name not in self.names_without_srv:
            response.set_rcode(dns.rcode.NXDOMAIN)
        return response


async def serve_srv(
    records: Mapping[str, Sequence[Srv]],
    *,
    names_without_srv: Collection[str] = (),
    servfail: Collection[str] = (),
    silent: bool = False,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[SrvServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled on ``host`` and a port the OS picks; ``task_status.started`` gets the server."""
    sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        await sock.bind((host, 0))
        server = SrvServer(
            address=(host, sock.getsockname()[1]),
            records={_norm(k): list(v) for k, v in records.items()},
            names_without_srv={_norm(n) for n in names_without_srv},
            servfail={_norm(n) for n in servfail},
            silent=silent,
        )
        task_status.started(server)
        while True:
            try:
                data, peer = await sock.recvfrom(65535)
            except ConnectionError:
                continue  # an ICMP error for an earlier answer
            try:
                query = dns.message.from_wire(data)
            except dns.exception.DNSException:
                continue
            if server.silent:
                asked = _norm(query.question[0].name.to_text()) if query.question else ""
                server.queries.append((asked, "dropped"))
                continue
            limit = max(512, query.payload) if query.edns >= 0 else 512
            await sock.sendto(server.answer(query).to_wire(max_size=limit), peer)
