"""Running out of file descriptors is an error of the request that needed one, never the node's end.

A child process lowers its descriptor limit and uses up every descriptor, then asks for what opens a socket:
a DNS look-up (an OSError escaped the resolver and ended the node before), an HTTP fetch, and inbound peer
connections; then it frees descriptors and checks that each works again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import os, resource, socket, sys
    import trio
    from peer.fetch import CachingResolver, DnsError, FetchError, Fetcher
    from peer.cluster.net.transport import TcpTransport

    async def main():
        accepted = []

        async def handler(stream):
            accepted.append(1)
            await stream.aclose()

        async with trio.open_nursery() as nursery:
            address = await nursery.start(TcpTransport("127.0.0.1:0").serve, handler)
            host, port = address.rsplit(":", 1)
            resolver = CachingResolver(nameservers=["127.0.0.1:9"], timeout=1.0, allow_private=True)
            fetcher = Fetcher(resolver, user_agent="t", connect_timeout=2.0)
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
            filler = []
            while True:
                try:
                    filler.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    break
            try:
                await resolver.resolve("example.test")
                print("dns: no error")
            except DnsError as exc:
                print("dns:", exc.label)
            try:
                await fetcher.fetch("http://127.0.0.1:9/")
                print("http: no error")
            except FetchError as exc:
                print("http:", exc.label)
            # The peer listener meets EMFILE on accept: it must keep serving.
            for fd in filler[:6]:
                os.close(fd)
            del filler[:6]
            clients = []
            for _ in range(6):  # connect() uses the freed descriptors; accept() then finds none
                s = socket.socket()
                s.setblocking(False)
                try:
                    s.connect((host, int(port)))
                except BlockingIOError:
                    pass
                clients.append(s)
            await trio.sleep(0.5)
            print("accepted while exhausted:", len(accepted))
            for fd in filler:
                os.close(fd)
            with trio.fail_after(10):
                while len(accepted) < len(clients):
                    await trio.sleep(0.05)
            print("accepted after:", len(accepted))
            for s in clients:
                s.close()
            try:
                await resolver.resolve("other.test")
            except DnsError as exc:
                print("dns after:", exc.label)
            nursery.cancel_scope.cancel()

    trio.run(main)
    print("alive")
    """
)


@pytest.mark.slow
def test_descriptor_exhaustion_fails_the_request_not_the_node() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "dns: resources" in lines, lines
    assert "http: connect" in lines, lines
    assert "accepted after: 6" in lines, lines
    assert "accepted while exhausted: 0" in lines, lines  # accept() met EMFILE and the listener waited
    assert "dns after: timeout" in lines, lines  # a socket again: the look-up runs (nobody answers on port 9)
    assert lines[-1] == "alive"
