"""robots.txt conformance: how many of the reference cases (tests/support/robots_cases.py) each parser passes.

Run: python -m tests.bench.bench_robots_conformance [--show-failures]

Ours (`peer.crawl.robots.can_fetch`) against Protego, Scrapy's parser, on the same robots.txt bodies, product
tokens and URLs. Protego takes text, so a case given as bytes is decoded as UTF-8 (bad bytes replaced) for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from protego import Protego

from peer.crawl.robots import can_fetch
from tests.support.robots_cases import CASES, Case


def _protego(case: Case) -> bool:
    body = case.robots if isinstance(case.robots, str) else case.robots.decode("utf-8", "replace")
    return bool(Protego.parse(body).can_fetch(case.url, case.agent))


def _ours(case: Case) -> bool:
    return can_fetch(case.robots, case.agent, case.url)


def score(check: Callable[[Case], bool]) -> tuple[int, list[str]]:
    failed: list[str] = []
    for case in CASES:
        try:
            ok = check(case) is case.allowed
        except Exception as exc:  # a parser that raises on a case fails that case
            ok = False
            failed.append(f"{case.name} (raised {type(exc).__name__})")
            continue
        if not ok:
            failed.append(case.name)
    return len(CASES) - len(failed), failed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show-failures", action="store_true")
    args = ap.parse_args()
    for name, check in (("peercrawl", _ours), ("protego", _protego)):
        passed, failed = score(check)
        print(f"{name:10s} {passed}/{len(CASES)} cases pass")
        if args.show_failures:
            for f in failed:
                print(f"    fails {f}")


if __name__ == "__main__":
    main()
