"""A process that runs a render pool and renders a page in a loop until it is killed: the orphan tests kill it
(or its browser) at a random moment. It prints the browser's process group id once the browser is up. The loop
is bounded (at most 2,000 renders a task, 300 s in all), far past any test's kill. Its argument, if any, is the
pool's working directory (where the browsers' profiles go)."""

from __future__ import annotations

import sys

import trio

from peer.render import PoolLimits, RenderPool, Served

PAGE = b"<html><body><div id=app></div><script>let s='';for(let i=0;i<2000;i++)s+='<p>'+i+'</p>';" \
       b"document.getElementById('app').innerHTML=s;</script></body></html>"


async def serve(request):  # type: ignore[no-untyped-def]
    return Served(status=200, headers=[("content-type", "text/html")], body=PAGE)


async def main() -> None:
    pool = RenderPool(PoolLimits(tabs=2, max_pages=5, time_limit=10), workdir=sys.argv[1] if sys.argv[1:] else None)
    with trio.move_on_after(300):
        await _run(pool)


async def _run(pool: RenderPool) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve_pool)
        await pool.render("http://child.test/first", serve)
        print(pool.pgid, flush=True)

        async def loop(k: int) -> None:
            for i in range(1, 2001):
                try:
                    await pool.render(f"http://child.test/{k}/{i}", serve)
                except Exception:
                    pass
                print("rendered", pool.pgid, flush=True)

        nursery.start_soon(loop, 1)
        nursery.start_soon(loop, 2)


if __name__ == "__main__":
    trio.run(main)
    sys.exit(0)
