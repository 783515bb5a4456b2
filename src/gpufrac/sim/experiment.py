"""Many replays (policies × seeds), in a process pool, summarised the way the paper reports them."""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.placement.reserve import KEPT_WHOLE
from gpufrac.placement.workload import Workload
from gpufrac.sim import bound, pool
from gpufrac.sim.replay import Arrivals, RunResult, draw_arrivals, nearest_point, replay, target_workload
from gpufrac.sim.trace import Trace
from gpufrac.sim.trace import load as load_trace

# Mean GPU allocation ratio at 100% arrival, default openb trace, seeds 42-51, inflation 1.3 (Weng et al.,
# ATC '23): beside a run only where it is that trace at that inflation (`publishes`).
PUBLISHED_INFLATION = 1.3
PUBLISHED_AT_100 = {
    "random": 86.30,
    "dotprod": 90.62,
    "clustering": 91.65,
    "packing": 91.78,
    "bestfit": 92.86,
    "fgd": 95.23,
}
PAPER_POLICIES = tuple(PUBLISHED_AT_100)  # the policies the paper compares, in its order


MAX_SEEDS = 1000  # each seed is one replay per policy: a thousand is days of CPU already


def parse_seeds(text: str) -> list[int]:
    """`42-51`, `1,2,7` or a mix: the seeds in the order given, without repeats, at most `MAX_SEEDS`.

    Ranges are counted before they are expanded, so `1-99999999999` is refused, not built."""
    seeds: dict[int, None] = {}
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise UserError(
                f"--seeds {_quoted(text)}: expected numbers and ranges such as 42-51 or 1,2,7"
            ) from None
        if last < first:
            raise UserError(f"--seeds {_quoted(text)}: the range {part.strip()} runs backwards")
        if len(seeds) + last - first >= MAX_SEEDS:
            raise UserError(f"--seeds {_quoted(text)}: more than {MAX_SEEDS} seeds; ask for fewer")
        seeds.update(dict.fromkeys(range(first, last + 1)))
    return list(seeds)


def parse_policies(text: str) -> list[str]:
    return parse_names(text, POLICIES, option="--policies")


def parse_names(text: str, known: Iterable[str], *, option: str) -> list[str]:
    """Names separated by commas, each one of `known`, in the order given."""
    known = list(known)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise UserError(
            f"{option} {_quoted(text)}: unknown {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(known)}"
        )
    return names


def _quoted(text: str) -> str:
    """What the person typed, on one line and not too long, for a message."""
    return json.dumps(text if len(text) <= 80 else text[:77] + "...", ensure_ascii=False)


# What a moved pod loses, in seconds of its GPUs: a restart and a model load, for an inference replica or a
# notebook (the pods that opt in). Moved GPU-seconds are this times the GPUs the moved pods held.
RESTART_SECONDS = 120


# Each move budget and each reserve replays every policy on every seed once more, and is one more row per
# policy: a handful compare; more is a sweep of its own, better run as several.
MAX_VARIANTS = 10


def parse_move_budgets(text: str) -> list[float]:
    """`0`, `5` or `0,2,5`: moves allowed per 100 arrivals, each a variant of every policy."""
    return _parse_variants(text, "--move-budget", "moves per 100 arrivals", "0,5")


def parse_reserves(text: str) -> list[float]:
    """`0`, `18` or `0,18`: the percent of the cluster's GPUs kept empty for whole-GPU pods
    (`placement.reserve`), each a variant of every policy."""
    return _parse_variants(text, "--whole-gpu-reserve", "percents of the cluster's GPUs", "0,18")


def check_variants(budgets: Sequence[float], reserves: Sequence[float]) -> None:
    """Every move budget is replayed with every reserve: at most `MAX_VARIANTS` of them together."""
    if len(budgets) * len(reserves) > MAX_VARIANTS:
        raise UserError(
            f"--move-budget and --whole-gpu-reserve: {len(budgets)} x {len(reserves)} variants, at most "
            f"{MAX_VARIANTS} (each replays every policy on every seed again); compare fewer at a time"
        )


def _parse_variants(text: str, option: str, what: str, example: str) -> list[float]:
    """Numbers from 0 to 100 separated by commas, without repeats, at most `MAX_VARIANTS`."""
    try:
        # Without repeats as the tables name them (`RunResult.label`): 18 and 18.0000001 would be one row.
        values = list({f"{float(part):g}": float(part) for part in text.split(",")}.values())
    except ValueError:
        values = []
    if not values or not all(math.isfinite(value) and 0 <= value <= 100 for value in values):
        raise UserError(
            f"{option} {_quoted(text)}: expected {what} between 0 and 100, or several separated by commas, "
            f"such as {example}"
        )
    if len(values) > MAX_VARIANTS:
        raise UserError(
            f"{option} {_quoted(text)}: {len(values)} values, at most {MAX_VARIANTS} (each replays every "
            "policy on every seed again); compare fewer at a time"
        )
    return values


def publishes(trace: Trace, inflation: float) -> bool:
    """Whether the paper's figures are for runs of `trace` at `inflation`: the default openb pod list on its
    GPU nodes, by content (the bundled copy, or `--traces default` from the openb files), at 1.3. On another
    trace or inflation they were beside numbers they do not describe."""
    if inflation != PUBLISHED_INFLATION:
        return False
    bundled = _bundled()
    return trace.pods == bundled.pods and trace.nodes == bundled.nodes


@functools.cache
def _bundled() -> Trace:
    return load_trace()


@dataclass(frozen=True, slots=True)
class Sweep:
    """One trace's part of a sweep: its runs (policy, then move budget, then reserve, then seed) and its
    bound per seed."""

    runs: list[RunResult] = field(default_factory=list)
    bounds: dict[int, bound.Bound] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Replay:
    trace: str
    policy: str
    seed: int
    inflation: float
    move_budget: float
    reserve: float


@dataclass(frozen=True, slots=True)
class _Bound:
    trace: str
    seed: int
    inflation: float


def _run_job(shared: Mapping[str, tuple[Trace, Workload]], job: _Replay | _Bound) -> RunResult | bound.Bound:
    trace, workload = shared[job.trace]
    if isinstance(job, _Bound):
        return bound.at_report_point(trace, seed=job.seed, inflation=job.inflation)
    return replay(
        trace,
        policy=job.policy,
        seed=job.seed,
        inflation=job.inflation,
        move_budget=job.move_budget,
        reserve=job.reserve,
        workload=workload,
        arrivals=_arrivals_of(trace, job),
    )


# The arrivals a process drew last, by trace, seed and inflation: a seed's replays are consecutive jobs.
# Emptied before and after each sweep, so that no sweep (nor a worker forked from this process) reads
# another's trace of the same name.
_drawn: dict[tuple[str, int, float], Arrivals] = {}


def _arrivals_of(trace: Trace, job: _Replay) -> Arrivals:
    key = (job.trace, job.seed, job.inflation)
    if key not in _drawn:
        _drawn.clear()
        _drawn[key] = draw_arrivals(trace, seed=job.seed, inflation=job.inflation)
    return _drawn[key]


def run_sweep(
    traces: Sequence[Trace],
    *,
    policies: Sequence[str],
    seeds: Sequence[int],
    inflation: float,
    move_budgets: Sequence[float] = (0.0,),
    reserves: Sequence[float] = (0.0,),
    workers: int | None = None,
    with_bounds: bool = True,
    on_done: Callable[[RunResult | bound.Bound], None] | None = None,
) -> dict[str, Sweep]:
    """Every policy with every move budget and reserve on every seed of every trace, and (`with_bounds`)
    each seed's bound, as jobs of one worker pool that receives the traces once.

    One pool for the whole sweep, the longest traces first and the bounds (a fraction of a replay each)
    last: a pool per trace left a worker idle while the other finished each trace's last replay, and the
    bounds were solved one by one in this process while both waited."""
    by_length = sorted(traces, key=lambda each: len(each.pods), reverse=True)
    # A seed's replays one after another, so that each worker draws its arrivals once (`_arrivals_of`).
    jobs: list[_Replay | _Bound] = [
        _Replay(each.name, policy, seed, inflation, budget, reserve)
        for each in by_length
        for seed in seeds
        for policy in policies
        for budget in move_budgets
        for reserve in reserves
    ]
    if with_bounds:
        jobs += [_Bound(each.name, seed, inflation) for each in by_length for seed in seeds]
    # Every replay of a trace measures against its workload: made once.
    shared = {each.name: (each, target_workload(each)) for each in traces}
    sweeps = {each.name: Sweep() for each in traces}
    _drawn.clear()
    try:
        for job, done in pool.run_jobs(shared, _run_job, jobs, workers=workers):
            if isinstance(done, bound.Bound):
                sweeps[job.trace].bounds[job.seed] = done
            else:
                sweeps[job.trace].runs.append(done)
            if on_done:
                on_done(done)
    finally:
        _drawn.clear()
    order = {key: at for at, key in enumerate(itertools.product(policies, move_budgets, reserves, seeds))}
    for sweep in sweeps.values():
        sweep.runs.sort(key=lambda run: order[run.policy, run.move_budget, run.reserve, run.seed])
    return sweeps


def summarize(
    trace: Trace,
    seeds: Sequence[int],
    results: Sequence[RunResult],
    bounds: Mapping[int, bound.Bound],
) -> dict[str, Any]:
    """The JSON document `gpufrac simulate --format json` prints: per policy the paper's figures and the gap
    to the bound; the bound per seed, rounded up so that rounding never puts it under a policy; the
    inflation the runs used. The figures "at 100" are read at the arrival point nearest 100% that each run
    reached; where that is not 100 for every run (a low `--inflation`, a small trace), `read_at_arrival`
    lists the points read, so that no report passes them off as 100%."""
    capacity = trace.gpus * bound.MILLI
    inflation = results[0].inflation if results else None
    published = inflation is not None and publishes(trace, inflation)
    read = sorted({nearest_point(run.allocation, 100) for run in results if run.allocation})
    # In whole hundredths, so that the mean is rounded up once: in floats, 100 × 81.9 is a hair above 8190.
    hundredths = {seed: math.ceil(10_000 * bounds[seed].milli / capacity) for seed in seeds}
    per_seed = {seed: value / 100 for seed, value in hundredths.items()}
    bound_at_100 = -(-sum(hundredths.values()) // len(seeds)) / 100
    policies: dict[str, Any] = {}
    for policy in dict.fromkeys(result.label for result in results):
        runs = [result for result in results if result.label == policy]
        at_100 = [run.allocation.get(100, _nearest(run.allocation, 100)) for run in runs]
        arrivals = sorted(set().union(*(run.allocation for run in runs)))
        policies[policy] = {
            "allocation": {
                str(x): round(statistics.fmean(run.allocation[x] for run in runs if x in run.allocation), 2)
                for x in arrivals
            },
            "allocation_at_100": round(statistics.fmean(at_100), 2),
            "allocation_at_100_std": round(statistics.pstdev(at_100), 2),
            "unallocated_at_100": round(100 - statistics.fmean(at_100), 2),
            "fragmentation_at_100": round(
                statistics.fmean(
                    run.fragmentation.get(100, _nearest(run.fragmentation, 100)) for run in runs
                ),
                2,
            ),
            "failed_pods": round(statistics.fmean(run.failed_pods for run in runs), 1),
            "seconds": round(statistics.fmean(run.seconds for run in runs), 3),
        }
        policies[policy]["gap_to_bound"] = round(bound_at_100 - policies[policy]["allocation_at_100"], 2)
        if runs[0].move_budget:
            policies[policy] |= _moves_at_100(runs)
        if runs[0].reserve:
            policies[policy] |= _kept_out_at_100(runs)
        if published and policy in PUBLISHED_AT_100:
            policies[policy]["published_at_100"] = PUBLISHED_AT_100[policy]
    return {
        "trace": trace.name,
        "gpus": trace.gpus,
        "inflation": inflation,
        "seeds": list(seeds),
        **({} if read in ([], [100]) else {"read_at_arrival": read}),
        "policies": policies,
        "bound": {
            "allocation_at_100": bound_at_100,
            "per_seed": {str(seed): value for seed, value in per_seed.items()},
            "variables": max(bounds[seed].variables for seed in seeds),
            "constraints": max(bounds[seed].constraints for seed in seeds),
            "seconds": round(statistics.fmean(bounds[seed].seconds for seed in seeds), 3),
        },
    }


def _moves_at_100(runs: Sequence[RunResult]) -> dict[str, float]:
    """What moving cost by 100% arrival, as means over the runs."""
    tallies = [run.moves.get(100) or run.moves[nearest_point(run.moves, 100)] for run in runs]
    return {
        "move_budget": runs[0].move_budget,
        "moves_at_100": round(statistics.fmean(t.moves for t in tallies), 1),
        "moves_per_100_arrivals": round(statistics.fmean(100 * t.moves / t.arrivals for t in tallies), 2),
        "moved_gpu_seconds_at_100": round(statistics.fmean(RESTART_SECONDS * t.moved_gpus for t in tallies)),
    }


def _kept_out_at_100(runs: Sequence[RunResult]) -> dict[str, float]:
    """The large shares the whole-GPU reserve turned away by 100% arrival, a mean over the runs: what its
    allocation was bought with."""
    tallies = [run.failures.get(100) or run.failures[nearest_point(run.failures, 100)] for run in runs]
    return {
        "whole_gpu_reserve": runs[0].reserve,
        "kept_out_at_100": round(statistics.fmean(t.get(KEPT_WHOLE, 0) for t in tallies), 1),
    }


def _nearest(curve: dict[int, float], x: int) -> float:
    """A curve that never reached x% arrival (a small trace) reports its closest point instead."""
    return curve[nearest_point(curve, x)] if curve else 0.0
