"""The simulation's synthetic web: host names in popularity order, and links drawn by popularity.

Host ``i`` (0-based) has popularity rank ``i + 1``: a link points to it with probability proportional to
``(i + 1) ** -s`` (Zipf; ``s = 0`` is uniform). Names come from ``ring.random_hosts`` with a seeded generator,
a chunk at a time, so ten million of them never sit in memory as strings: only their 8-byte ring positions do.

Links are drawn by rejection-inversion (Hörmann and Derflinger, "Rejection-inversion to generate variates from
monotone discrete distributions", 1996; the sampler of Apache Commons RNG): exact for any ``s > 0``, constant
memory, a few floating-point operations per draw, whatever the number of hosts.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Iterator

import ring

__all__ = ["host_positions", "popularity_weights", "zipf_sampler"]

#: Host names are generated, hashed and dropped in chunks of this many: about 5 MB of strings at a time.
NAME_CHUNK = 65536


def _helper1(x: float) -> float:
    """log1p(x) / x, continuous at 0."""
    return math.log1p(x) / x if abs(x) > 1e-8 else 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))


def _helper2(x: float) -> float:
    """expm1(x) / x, continuous at 0."""
    return math.expm1(x) / x if abs(x) > 1e-8 else 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))


def zipf_sampler(n: int, exponent: float, rng: random.Random) -> Callable[[], int]:
    """A function drawing a host index in ``[0, n)`` with P(i) proportional to ``(i + 1) ** -exponent``."""
    if n < 1:
        raise ValueError(f"need at least one host, got {n}")
    if exponent < 0 or not math.isfinite(exponent):
        raise ValueError(f"the popularity exponent must be a finite number >= 0, got {exponent}")
    uniform = rng.random
    if exponent == 0.0:
        return lambda: int(uniform() * n)
    s = exponent
    one_minus_s = 1.0 - s
    log, exp = math.log, math.exp

    def h_integral(x: float) -> float:
        log_x = log(x)
        return _helper2(one_minus_s * log_x) * log_x

    def h_integral_inverse(x: float) -> float:
        t = x * one_minus_s
        t = max(t, -1.0)  # rounding at the upper end of the range
        return exp(_helper1(t) * x)

    def h(x: float) -> float:
        return exp(-s * log(x))

    h_x1 = h_integral(1.5) - 1.0
    h_n = h_integral(n + 0.5)
    span = h_x1 - h_n
    squeeze = 2.0 - h_integral_inverse(h_integral(2.5) - h(2.0))

    def draw() -> int:
        while True:
            u = h_n + uniform() * span
            x = h_integral_inverse(u)
            k = int(x + 0.5)
            if k < 1:
                k = 1
            elif k > n:
                k = n
            if k - x <= squeeze or u >= h_integral(k + 0.5) - h(k):
                return k - 1

    return draw


def popularity_weights(n: int, exponent: float, start: int = 0, stop: int | None = None) -> Iterator[float]:
    """The unnormalized popularity ``(i + 1) ** -exponent`` of hosts ``start <= i < stop``."""
    stop = n if stop is None else stop
    if exponent == 0.0:
        return iter([1.0] * (stop - start))
    neg = -exponent
    return (pow(i, neg) for i in range(start + 1, stop + 1))


def host_positions(seed: int, hosts: int, *, chunk: int = NAME_CHUNK) -> array:
    """The ring position of every host of the web, in popularity order (``array('Q')``, 8 bytes a host)."""
    positions = array("Q")
    rng = random.Random(f"{seed}:hosts")
    position = ring.host_position
    for names in ring.random_hosts(rng, hosts, chunk=chunk):
        positions.extend(map(position, names))
    return positions
