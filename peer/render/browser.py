"""A headless chromium for the node: launched in its own process group, tied to the node's life, reached over
its DevTools websocket on loopback; or a browser that already runs, attached by its websocket URL.

No browser outlives the node that started it: the browser is the leader of a new process group (every process
it forks, renderers and zygotes included, stays in that group), it gets SIGKILL from the kernel when the node's
thread that forked it dies (``PR_SET_PDEATHSIG``; the fork is made from the node's main thread, which lives as
long as the node), and `close` kills the whole group. Its children go with it: they watch their parent's
sockets and exit when it dies.

The browser itself can reach nothing: every request it makes is intercepted and served by the node
(`peer.render.tabs`), and as a second wall its own network stack resolves no name and goes to a proxy on a
closed port, so a request the interception would miss (a WebSocket, a prefetch) fails instead of leaving the
node's politeness behind.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from peer.render.cdp import MAX_MESSAGE, Cdp

__all__ = ["Browser", "BrowserError", "clear_workdir", "find_chromium", "group_rss", "open_browser", "pids_of_group"]

log = logging.getLogger(__name__)

#: Where Debian's chromium binary lives; its /usr/bin/chromium is a shell script that execs it.
_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome", "chrome")
_DEVTOOLS = re.compile(rb"DevTools listening on (ws://\S+)")
#: A browser that has not said where it listens after this long is taken for broken.
START_TIMEOUT = 20.0
_PR_SET_PDEATHSIG = 1


class BrowserError(Exception):
    """The browser could not be started or reached (one line, for a person)."""


def find_chromium(path: str = "") -> str:
    """The browser binary: `path` if given, else the first of Debian's chromium and the usual names found."""
    for name in ((path,) if path else _CANDIDATES):
        found = shutil.which(name) if os.sep not in name else (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    raise BrowserError(f"no chromium found (tried {path or ', '.join(_CANDIDATES)}); install it "
                       "(apt-get install chromium) or name it with --chromium PATH")


def flags(profile: str, *, heap_mib: int) -> list[str]:
    """The command line of a headless browser that reaches nothing on its own (see the module's text)."""
    return [
        "--headless=new", f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
        "--remote-debugging-port=0", "--no-first-run", "--no-default-browser-check", "--disable-gpu",
        "--disable-extensions", "--disable-background-networking", "--disable-sync", "--disable-component-update",
        "--disable-default-apps", "--disable-breakpad", "--disable-crash-reporter", "--mute-audio",
        "--disable-dev-shm-usage", "--block-new-web-contents",
        "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider,InterestFeedContentSuggestions,"
        "BackForwardCache",  # a kept tab keeps no page it left
        "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=<-loopback>", f"--js-flags=--max-old-space-size={heap_mib}",
        # the node runs as a service user or root in a container: chromium's setuid sandbox needs privileges
        # a container seldom grants; the browser fetches nothing itself and renders only what the node gives it
        "--no-sandbox",
        "about:blank",
    ]


#: The name of a launched browser's profile directory, and of its temporary files' directory, starts with this.
PROFILE_PREFIX = "peercrawl-browser-"
#: The file in a profile that names the browser's temporary files' directory.
SCRATCH_NOTE = "peercrawl-tmpdir"


def clear_workdir(workdir: str | os.PathLike[str]) -> int:
    """Create `workdir` if missing and remove the browser profiles a killed node left in it, with the temporary
    directory each names; how many. Only for a directory no running browser uses (a node's own, under its
    locked data dir)."""
    path = Path(workdir)
    path.mkdir(parents=True, exist_ok=True)
    removed = 0
    temp = Path(tempfile.gettempdir())
    for entry in path.iterdir():
        if entry.name.startswith(PROFILE_PREFIX) and entry.is_dir() and not entry.is_symlink():
            try:
                scratch = Path((entry / SCRATCH_NOTE).read_text().strip())
            except (OSError, UnicodeDecodeError):
                scratch = None
            # only a directory of ours in the system's temporary directory, whatever the note says
            if scratch is not None and scratch.parent == temp and scratch.name.startswith(PROFILE_PREFIX):
                shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


def _tie_to_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def pids_of_group(pgid: int) -> list[int]:
    """The live processes of a process group (zombies left out: they are dead, waiting to be reaped)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(int(entry))
    return out


def group_rss(pgid: int) -> int:
    """The memory a process group holds, in bytes: the sum of its processes' proportional set sizes (a page
    shared by n processes counts 1/n in each), so the browser's shared libraries count once."""
    total = 0
    for pid in pids_of_group(pgid):
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            continue
    return total


@dataclass(slots=True)
class Browser:
    """A browser the node talks to: its DevTools connection, and its process group when the node started it."""

    cdp: Cdp
    ws_url: str
    pgid: int | None  # None: a browser that was running already (attached)

    def rss(self) -> int:
        """Its processes' resident memory in bytes (0 for an attached browser: not ours to measure)."""
        return 0 if self.pgid is None else group_rss(self.pgid)


@asynccontextmanager
async def open_browser(*, chromium: str = "", ws_url: str = "", heap_mib: int = 512,
                       extra: Sequence[str] = (), workdir: str | os.PathLike[str] | None = None,
                       ) -> AsyncIterator[Browser]:
    """A browser for the block: attached at `ws_url`, else launched (`chromium`: its binary). On the way out
    the connection closes, and a launched browser's process group is killed and reaped.

    A launched browser's profile is a new directory in `workdir` (the system's temporary directory if None),
    and the browser's own temporary files (its singleton socket among them) go to a directory of their own in
    the system's temporary directory (``TMPDIR``): both are removed on the way out, so a browser killed at
    each restart leaves nothing behind. Only a node killed itself leaves them, which `clear_workdir` removes
    at its next start."""
    if ws_url:
        async with _connected(ws_url) as cdp:
            yield Browser(cdp=cdp, ws_url=ws_url, pgid=None)
        return
    binary = find_chromium(chromium)
    with tempfile.TemporaryDirectory(prefix=PROFILE_PREFIX, dir=workdir) as profile, \
            tempfile.TemporaryDirectory(prefix=PROFILE_PREFIX) as scratch:
        # chromium's singleton socket lives in its TMPDIR, whose path must stay short (a socket's path is at most
        # 107 bytes): the system's, named in the profile for `clear_workdir`
        Path(profile, SCRATCH_NOTE).write_text(scratch)
        # Popen from this (the main) thread: PR_SET_PDEATHSIG fires when the forking *thread* ends, and trio's
        # worker threads end when idle
        try:
            proc = subprocess.Popen([binary, *flags(profile, heap_mib=heap_mib), *extra], start_new_session=True,
                                    preexec_fn=_tie_to_parent, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "TMPDIR": scratch},
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            raise BrowserError(f"cannot start {binary}: {exc.strerror or exc}") from exc
        try:
            assert proc.stderr is not None
            stderr = trio.lowlevel.FdStream(os.dup(proc.stderr.fileno()))
            proc.stderr.close()
            async with stderr, trio.open_nursery() as nursery:
                url = await _devtools_url(stderr, binary)
                nursery.start_soon(_drain, stderr)
                async with _connected(url) as cdp:
                    yield Browser(cdp=cdp, ws_url=url, pgid=proc.pid)
                nursery.cancel_scope.cancel()
        finally:
            _kill_group(proc)


async def _devtools_url(stderr: trio.lowlevel.FdStream, binary: str) -> str:
    seen = b""
    with trio.move_on_after(START_TIMEOUT):
        while True:
            chunk = await stderr.receive_some(4096)
            if not chunk:
                break
            seen = (seen + chunk)[-16384:]
            match = _DEVTOOLS.search(seen)
            if match:
                return match.group(1).decode("ascii")
    tail = seen.decode("utf-8", "replace").strip().splitlines()[-1:] or ["nothing"]
    raise BrowserError(f"{binary} did not start its DevTools endpoint: {tail[0][:200]}")


async def _drain(stderr: trio.lowlevel.FdStream) -> None:
    """The browser's messages are read and dropped (a full pipe would stop it)."""
    try:
        while await stderr.receive_some(65536):
            pass
    except (trio.ClosedResourceError, OSError):
        pass


@asynccontextmanager
async def _connected(url: str) -> AsyncIterator[Cdp]:
    # imported here: a node that never renders does not pay for the websocket stack at its start
    from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

    try:
        async with open_websocket_url(url, max_message_size=MAX_MESSAGE, connect_timeout=START_TIMEOUT) as ws:
            cdp = Cdp(ws)
            async with trio.open_nursery() as nursery:
                await nursery.start(cdp.run)
                yield cdp
                nursery.cancel_scope.cancel()
    except (OSError, HandshakeError, ConnectionClosed) as exc:
        raise BrowserError(f"cannot reach the browser at {url}: {exc!r}") from exc


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the browser's whole process group and reap its leader (its children are the kernel's to reap)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
        log.error("browser process %d did not die", proc.pid)
