"""Simulation mode: the plan's cluster on the real ring, a synthetic web, no network, no processes.

The model, kept as small as the question allows:

- The web has ``web.hosts`` hosts; host ``i`` has popularity rank ``i + 1`` (``synthweb``). Each host's owner
  in every phase comes from ``ring.Ring`` built from that phase's weights, exactly as a node computes it.
- A fetched page belongs to a host drawn uniformly: politeness spreads a crawler's fetches over the hosts it
  owns (a popular host is not fetched faster than its delay allows), so a node fetches in proportion to the
  hosts it owns. The page has ``web.links_per_page`` links; each stays on its host with probability
  ``web.internal_links``, else points to a host drawn by popularity (Zipf, exponent ``web.popularity``).
- A link to a host the page's node owns is kept; any other is sent to the host's owner: one URL sent. The
  sender's recently-sent filter and the owner's dedup are not modelled: every link counts, as a URL counter
  on the wire would count it without the filter.
- Time: ``simulate.pages_per_second`` (for the whole cluster) turns ``at`` triggers into pages.
- At each change, the hosts whose owner changed are found by comparing owners host by host, and the URLs the
  previous owners held for them (every link to the host so far) are counted as moved, or as lost when the
  previous owner was killed (a killed node hands nothing off; its hosts start again from zero).

Memory is bounded by the web, not by the links: 8 bytes a host for its ring position, 2 for its owner in each
of two phases at a time, 4 for the URLs it holds; two rings at a time; one URL matrix per phase (8 bytes a
node pair). All draws come from the plan's seed, so a plan always gives the same figures.
"""

from __future__ import annotations

import logging
import random
import resource
import time
from array import array
from collections import Counter
from collections.abc import Callable

import ring

from . import synthweb
from .plan import Plan, PlanError
from .results import ChangeResult, ExperimentResult, PhaseResult, Sample

__all__ = ["phase_boundaries", "run_simulation"]

log = logging.getLogger(__name__)

_MODEL_NOTE = ("simulation: every link counts as a URL (no sender filter, no owner dedup); a page's host is drawn "
               "uniformly, its links' hosts by popularity")

#: Hosts placed per call to ``Ring.owners_at``: about 1 MB of positions at a time.
_CHUNK = 131072


def phase_boundaries(plan: Plan) -> list[int]:
    """Pages crawled at the start of each phase and at the end: ``[0, p1, ..., end]``, strictly increasing."""
    rate = plan.simulate.pages_per_second
    bounds = [0]
    items = [(f"phase[{i + 1}]", p.at, p.after_pages) for i, p in enumerate(plan.phases)]
    items.append(("end", plan.end.at, plan.end.after_pages))
    for key, at, after in items:
        pages = round(at * rate) if at is not None else after
        assert pages is not None  # the plan has exactly one trigger per item
        if pages <= bounds[-1]:
            what = f"at = {at:g} s (page {pages:,} at {rate:g} pages/s)" if at is not None else f"after {pages:,} pages"
            raise PlanError(f"plan {plan.name}: {key}: {what} does not come after the previous phase's start "
                            f"(page {bounds[-1]:,}); every phase needs at least one page")
        bounds.append(pages)
    return bounds


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_simulation(plan: Plan, *, progress: Callable[[str], None] | None = None) -> ExperimentResult:
    """Run ``plan`` in simulation; ``progress`` receives a line per step (ring built, hosts placed, ...)."""
    say = progress or (lambda line: log.info(line))
    started = time.perf_counter()
    timings: dict[str, float] = dict.fromkeys(
        ("host names and positions", "ring build", "host placement", "change analysis", "links"), 0.0)
    bounds = phase_boundaries(plan)
    stages = plan.stage_weights()
    names = plan.phase_names()
    rate = plan.simulate.pages_per_second
    web = plan.web
    hosts = web.hosts

    all_nodes: list[str] = []
    for weights in stages:
        all_nodes.extend(node for node in weights if node not in all_nodes)
    index = {node: i for i, node in enumerate(all_nodes)}
    n = len(all_nodes)
    code = "H" if n < 1 << 16 else "I"

    t = time.perf_counter()
    positions = synthweb.host_positions(plan.seed, hosts)
    timings["host names and positions"] += time.perf_counter() - t
    say(f"{hosts:,} hosts named and placed in {time.perf_counter() - t:.1f} s")

    held = array("I", bytes(4 * hosts))  # URLs each host's owner holds (links to it so far)
    rng = random.Random(f"{plan.seed}:links")
    draw_target = synthweb.zipf_sampler(hosts, web.popularity, rng)

    phases: list[PhaseResult] = []
    samples: list[Sample] = []
    changes: list[ChangeResult] = []
    previous_ring: ring.Ring | None = None
    previous_owner: array | None = None
    for k, weights in enumerate(stages):
        t = time.perf_counter()
        if previous_ring is None:
            the_ring = ring.Ring(weights, points_per_weight=plan.points_per_weight)
        else:  # as a node does at a view change: only the changed nodes' points are inserted or removed
            the_ring = previous_ring.with_weights(weights)
        built = time.perf_counter() - t
        timings["ring build"] += built
        say(f"phase {k + 1} ({names[k]}): ring of {len(weights):,} nodes, {the_ring.point_count:,} points "
            f"{'built' if previous_ring is None else 'derived from the previous phase'} in {built:.2f} s")

        t = time.perf_counter()
        owner, host_counts, mass = _place_hosts(the_ring, positions, index, code, web.popularity)
        key_shares = the_ring.shares()
        timings["host placement"] += time.perf_counter() - t

        if k:
            assert previous_ring is not None and previous_owner is not None
            t = time.perf_counter()
            changes.append(_change(plan, k, bounds[k] / rate, previous_ring, the_ring, previous_owner, owner,
                                   held, all_nodes))
            timings["change analysis"] += time.perf_counter() - t
        previous_ring = None  # two rings at most: free the old one before drawing links
        previous_owner = None

        t = time.perf_counter()
        matrix, kept, phase_samples = _crawl(
            plan, k, bounds[k], bounds[k + 1], owner, held, n, draw_target, rng, all_nodes)
        timings["links"] += time.perf_counter() - t
        samples.extend(phase_samples)
        say(f"phase {k + 1} ({names[k]}): {bounds[k + 1] - bounds[k]:,} pages, "
            f"{sum(matrix):,} URLs sent in {time.perf_counter() - t:.1f} s")

        live = list(weights)
        live_index = [index[node] for node in live]
        local = array("Q", (matrix[a * n + b] for a in live_index for b in live_index))
        total_mass = sum(mass)
        phases.append(PhaseResult(
            index=k, name=names[k], start=bounds[k] / rate, end=bounds[k + 1] / rate,
            pages=bounds[k + 1] - bounds[k], weights=dict(weights),
            key_shares={node: key_shares[node] for node in live},
            host_shares={node: host_counts[index[node]] / hosts for node in live},
            popularity_shares={node: mass[index[node]] / total_mass for node in live},
            sent=local, kept={node: kept[index[node]] for node in live},
        ))
        previous_ring, previous_owner = the_ring, owner

    return ExperimentResult(
        plan=plan, mode="simulate", phases=tuple(phases), samples=tuple(samples), changes=tuple(changes),
        wall_seconds=time.perf_counter() - started, peak_rss_bytes=_peak_rss(), timings=dict(timings),
        notes=(_MODEL_NOTE,),
    )


def _place_hosts(the_ring: ring.Ring, positions: array, index: dict[str, int], code: str,
                 exponent: float) -> tuple[array, list[int], list[float]]:
    """Every host's owner (global node index), hosts per node, and popularity mass per node."""
    n = len(index)
    hosts = len(positions)
    owner = array(code)
    counts = [0] * n
    mass = [0.0] * n
    to_index = index.__getitem__
    for start in range(0, hosts, _CHUNK):
        stop = min(hosts, start + _CHUNK)
        owners = list(map(to_index, the_ring.owners_at(positions[start:stop].tolist())))
        owner.extend(owners)
        for node, count in Counter(owners).items():
            counts[node] += count
        if exponent == 0.0:
            continue
        for node, weight in zip(owners, synthweb.popularity_weights(hosts, exponent, start, stop)):
            mass[node] += weight
    if exponent == 0.0:
        mass = [float(c) for c in counts]
    return owner, counts, mass


def _change(plan: Plan, k: int, when: float, old: ring.Ring, new: ring.Ring, old_owner: array, new_owner: array,
            held: array, all_nodes: list[str]) -> ChangeResult:
    """Compare phase k-1 with phase k: key space and hosts moved, URLs moved or lost. Empties the held counts
    of hosts a killed node owned (nobody hands them off)."""
    phase = plan.phases[k - 1]
    killed = {all_nodes.index(node) for node in phase.kill}
    moves = ring.diff_moves(old, new)  # arrays: a join at 1,000 points per weight moves one arc per point
    old_shares, new_shares = old.weight_shares(), new.weight_shares()
    ideal = sum(max(0.0, share - old_shares.get(node, 0.0)) for node, share in new_shares.items())
    urls_held = sum(held)
    pairs: Counter[tuple[int, int]] = Counter()
    hosts_moved = moved = lost = 0
    for i, (a, b) in enumerate(zip(old_owner, new_owner)):
        if a != b:
            hosts_moved += 1
            count = held[i]
            pairs[(a, b)] += count
            if a in killed:
                lost += count
                held[i] = 0
            else:
                moved += count
    return ChangeResult(
        phase=k, name=phase.name, time=when, actions=tuple(phase.actions()), ideal_keyspace=ideal,
        moved_keyspace=ring.moved_fraction(moves), hosts_moved=hosts_moved, hosts_total=len(held),
        urls_moved=moved, urls_lost=lost, urls_held=urls_held,
        by_pair={(all_nodes[a], all_nodes[b]): count for (a, b), count in sorted(pairs.items())},
    )


def _crawl(plan: Plan, k: int, first: int, last: int, owner: array, held: array, n: int,
           draw_target: Callable[[], int], rng: random.Random, all_nodes: list[str]
           ) -> tuple[list[int], list[int], list[Sample]]:
    """Fetch pages ``first..last`` of the crawl in phase ``k``: the URL matrix (global indices), URLs kept per
    node, and ``samples_per_phase`` samples of what each node sent and received."""
    rate = plan.simulate.pages_per_second
    links = plan.web.links_per_page
    internal = plan.web.internal_links
    hosts = len(owner)
    rand = rng.random
    sent = [0] * (n * n)
    kept = [0] * n
    samples = []
    pages = last - first
    buckets = min(plan.simulate.samples_per_phase, pages)
    done = 0
    for b in range(buckets):
        bucket_pages = pages * (b + 1) // buckets - done
        out_by = [0] * n
        in_by = [0] * n
        for _ in range(bucket_pages):
            source = int(rand() * hosts)
            sender = owner[source]
            base = sender * n
            page_sent = 0
            page_kept = 0
            for _ in range(links):
                if rand() < internal:
                    held[source] += 1
                    page_kept += 1
                    continue
                target = draw_target()
                held[target] += 1
                receiver = owner[target]
                if receiver == sender:
                    page_kept += 1
                else:
                    sent[base + receiver] += 1
                    in_by[receiver] += 1
                    page_sent += 1
            out_by[sender] += page_sent
            kept[sender] += page_kept
        done += bucket_pages
        samples.append(Sample(
            time=(first + done) / rate, phase=k,
            sent_by={all_nodes[i]: c for i, c in enumerate(out_by) if c},
            received_by={all_nodes[i]: c for i, c in enumerate(in_by) if c},
        ))
    return sent, kept, samples
