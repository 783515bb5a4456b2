"""Seeds and policies from the command line, the policy × seed matrix, and the JSON summary's shape."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.placement.reserve import KEPT_WHOLE
from gpufrac.sim import bound, experiment, pool, replay, trace

from .json_contract import BOUND_KEYS, MOVE_KEYS, POLICY_KEYS, READ_ELSEWHERE_KEY, RESERVE_KEYS, SUMMARY_KEYS


@pytest.fixture(scope="module")
def tiny() -> trace.Trace:
    nodes = tuple(
        NodeSpec(f"n{i}", 32_000, 65_536, tuple(GpuSpec(g, f"n{i}-{g}", "T4", 16_000) for g in range(2)))
        for i in range(3)
    )
    pods = tuple(
        trace.TracePod(f"p{i}", 1_000 * (i % 3), 1_024, 1 if i % 4 else 2, 250 * (i % 4) or 1000, None)
        for i in range(12)
    )
    return trace.Trace("tiny", nodes, pods)


@pytest.mark.parametrize(
    ("text", "seeds"),
    [
        ("42-51", list(range(42, 52))),
        ("1,2,7", [1, 2, 7]),
        ("3-5,4", [3, 4, 5]),
        ("9, 2-3 ,9", [9, 2, 3]),
        ("7", [7]),
        ("5-5", [5]),
    ],
)
def test_parse_seeds(text: str, seeds: list[int]) -> None:
    assert experiment.parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x", "expected numbers and ranges"),
        ("", "expected numbers and ranges"),
        ("1,,2", "expected numbers and ranges"),
        ("-1", "expected numbers and ranges"),
        ("1-2-3", "expected numbers and ranges"),
        ("4.5", "expected numbers and ranges"),
        ("5-3", "the range 5-3 runs backwards"),
        ("1-99999999999", "more than 1000 seeds; ask for fewer"),
        ("0-999,1000", "more than 1000 seeds; ask for fewer"),
    ],
)
def test_bad_seeds_are_a_user_error(text: str, says: str) -> None:
    with pytest.raises(UserError, match=says) as raised:
        experiment.parse_seeds(text)
    assert f'--seeds "{text}"' in str(raised.value) and raised.value.exit_code == 2


def test_seeds_are_counted_before_they_are_built() -> None:
    assert len(experiment.parse_seeds("0-998,999")) == experiment.MAX_SEEDS
    with pytest.raises(UserError, match="expected numbers and ranges"):
        experiment.parse_seeds("9" * 5000)  # more digits than Python converts


@given(st.text(alphabet="0123456789-, x", max_size=40) | st.text(max_size=40))
def test_any_seeds_text_is_a_short_list_or_a_user_error(text: str) -> None:
    try:
        seeds = experiment.parse_seeds(text)
    except UserError as error:
        assert "\n" not in str(error) and len(str(error)) < 200
    else:
        assert 0 < len(seeds) <= experiment.MAX_SEEDS and len(set(seeds)) == len(seeds)


def test_parse_policies() -> None:
    assert experiment.parse_policies("fgd, bestfit") == ["fgd", "bestfit"]
    assert experiment.parse_policies("random,") == ["random"]
    with pytest.raises(UserError, match=r"unknown nope, zzz; known: .*fgd") as raised:
        experiment.parse_policies("fgd,nope,zzz")
    assert raised.value.exit_code == 2
    with pytest.raises(UserError, match=r"unknown \(none given\)"):
        experiment.parse_policies(" , ")


def test_the_paper_policies_are_registered() -> None:
    assert experiment.parse_policies(",".join(experiment.PAPER_POLICIES)) == list(experiment.PAPER_POLICIES)
    assert set(experiment.PUBLISHED_AT_100) == set(experiment.PAPER_POLICIES)


def outcome(result: replay.RunResult) -> tuple[object, ...]:
    return (
        result.policy,
        result.seed,
        result.allocation,
        result.fragmentation,
        result.failed_pods,
        result.pods,
    )


def replays_of(tiny: trace.Trace, **jobs: Any) -> list[replay.RunResult]:
    return experiment.run_sweep([tiny], with_bounds=False, **jobs)[tiny.name].runs


def summary_of(tiny: trace.Trace, seeds: list[int], results: list[replay.RunResult]) -> dict[str, Any]:
    bounds = {seed: bound.at_report_point(tiny, seed=seed, inflation=1.3) for seed in seeds}
    return experiment.summarize(tiny, seeds, results, bounds)


def test_a_sweep_runs_every_policy_on_every_seed_in_order(tiny: trace.Trace) -> None:
    seen: list[object] = []
    sweep = experiment.run_sweep(
        [tiny], policies=["fgd", "random"], seeds=[1, 2], inflation=1.3, workers=1, on_done=seen.append
    )[tiny.name]
    results = sweep.runs
    assert [(r.policy, r.seed) for r in results] == [("fgd", 1), ("fgd", 2), ("random", 1), ("random", 2)]
    # Run a seed at a time, so that its arrivals are drawn once; the bounds last: the shortest jobs.
    assert seen == [results[0], results[2], results[1], results[3], sweep.bounds[1], sweep.bounds[2]]
    alone = replay.replay(tiny, policy="random", seed=2, inflation=1.3)
    assert outcome(results[3]) == outcome(alone)


def test_a_seeds_arrivals_are_drawn_once_for_all_its_replays(
    tiny: trace.Trace, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[int] = []

    def counted(trace: trace.Trace, *, seed: int, inflation: float) -> replay.Arrivals:
        drawn.append(seed)
        return replay.draw_arrivals(trace, seed=seed, inflation=inflation)

    monkeypatch.setattr(experiment, "draw_arrivals", counted)
    experiment.run_sweep(
        [tiny],
        policies=["fgd", "random", "bestfit"],
        seeds=[1, 2],
        inflation=1.3,
        move_budgets=[0, 5],
        workers=1,
        with_bounds=False,
    )
    assert drawn == [1, 2]


def test_sweeps_of_traces_of_one_name_never_share_their_arrivals(tiny: trace.Trace) -> None:
    other = dataclasses.replace(tiny, pods=tiny.pods[:6])
    for first, second in ((tiny, other), (other, tiny)):
        jobs = {"policies": ["bestfit"], "seeds": [3], "inflation": 1.3, "workers": 1, "with_bounds": False}
        experiment.run_sweep([first], **jobs)
        (run,) = experiment.run_sweep([second], **jobs)[second.name].runs
        assert outcome(run) == outcome(replay.replay(second, policy="bestfit", seed=3, inflation=1.3))


def test_a_sweep_in_worker_processes_gives_the_same_results(tiny: trace.Trace) -> None:
    jobs = {"policies": ["bestfit", "clustering"], "seeds": [4, 5], "inflation": 1.1}
    serial = experiment.run_sweep([tiny], workers=1, **jobs)[tiny.name]
    pooled = experiment.run_sweep([tiny], workers=2, **jobs)[tiny.name]
    assert [outcome(r) for r in pooled.runs] == [outcome(r) for r in serial.runs]
    solved = {seed: dataclasses.replace(found, seconds=0) for seed, found in serial.bounds.items()}
    assert {seed: dataclasses.replace(found, seconds=0) for seed, found in pooled.bounds.items()} == solved


def test_summary_has_the_json_contracts_keys(tiny: trace.Trace) -> None:
    results = replays_of(tiny, policies=["fgd", "binpack"], seeds=[1, 2], inflation=1.3, workers=1)
    summary = summary_of(tiny, [1, 2], results)
    assert json.loads(json.dumps(summary)) == summary
    assert set(summary) - {READ_ELSEWHERE_KEY} == SUMMARY_KEYS
    assert summary["inflation"] == 1.3
    assert set(summary["bound"]) == BOUND_KEYS and list(summary["bound"]["per_seed"]) == ["1", "2"]
    assert (summary["trace"], summary["gpus"], summary["seeds"]) == ("tiny", 6, [1, 2])
    assert list(summary["policies"]) == ["fgd", "binpack"]
    for row in summary["policies"].values():
        assert set(row) == POLICY_KEYS  # no `published_at_100`: the paper's figures are the default trace's
        assert all(isinstance(x, str) and int(x) >= 0 for x in row["allocation"])
        assert row["unallocated_at_100"] == pytest.approx(100 - row["allocation_at_100"], abs=0.011)


def test_each_reserve_is_a_variant_with_the_shares_it_turned_away(tiny: trace.Trace) -> None:
    results = replays_of(tiny, policies=["fgd"], seeds=[1, 2], inflation=1.3, reserves=[0, 50], workers=1)
    assert [(r.reserve, r.seed) for r in results] == [(0, 1), (0, 2), (50, 1), (50, 2)]
    summary = summary_of(tiny, [1, 2], results)
    assert list(summary["policies"]) == ["fgd", "fgd +reserve 50%"]
    kept = summary["policies"]["fgd +reserve 50%"]
    assert set(kept) == POLICY_KEYS | RESERVE_KEYS
    at_100 = [run.failures[replay.nearest_point(run.failures, 100)] for run in results if run.reserve]
    turned_away = [dropped.get(KEPT_WHOLE, 0) for dropped in at_100]
    assert kept["kept_out_at_100"] == sum(turned_away) / 2 > 0


def test_each_move_budget_is_a_variant_with_what_moving_cost(tiny: trace.Trace) -> None:
    results = replays_of(tiny, policies=["fgd"], seeds=[1, 2], inflation=1.3, move_budgets=[0, 5], workers=1)
    assert [(r.move_budget, r.seed) for r in results] == [(0, 1), (0, 2), (5, 1), (5, 2)]
    summary = summary_of(tiny, [1, 2], results)
    assert list(summary["policies"]) == ["fgd", "fgd +moves 5"]
    assert set(summary["policies"]["fgd +moves 5"]) == POLICY_KEYS | MOVE_KEYS
    assert summary["policies"]["fgd +moves 5"]["moves_per_100_arrivals"] <= 5


VARIANTS = [
    (experiment.parse_move_budgets, "--move-budget"),
    (experiment.parse_reserves, "--whole-gpu-reserve"),
]


@pytest.mark.parametrize(("parse", "option"), VARIANTS)
@pytest.mark.parametrize("text", ["", "five", "-1", "101", "nan", "1,,2"])
def test_bad_variants_are_a_user_error(parse: Callable[[str], list[float]], option: str, text: str) -> None:
    with pytest.raises(UserError, match=option):
        parse(text)


@pytest.mark.parametrize(("parse", "option"), VARIANTS)
def test_variants_parse_in_order_without_repeats(parse: Callable[[str], list[float]], option: str) -> None:
    assert parse("0, 5,2.5,5") == [0, 5, 2.5]
    assert parse("18,18.0000001") == [18.0000001]  # one row of the tables: one variant


@pytest.mark.parametrize(("parse", "option"), VARIANTS)
def test_variants_are_counted(parse: Callable[[str], list[float]], option: str) -> None:
    """Each variant replays every policy on every seed again: `seq -s, 0 0.01 100` is a week of CPU."""
    ten = ",".join(str(value) for value in range(experiment.MAX_VARIANTS))
    assert len(parse(ten)) == experiment.MAX_VARIANTS
    assert len(parse(ten + ",0,1")) == experiment.MAX_VARIANTS  # repeats: once
    with pytest.raises(UserError, match=rf"{option} .*: 11 values, at most 10"):
        parse(ten + ",99")
    experiment.check_variants([0, 5], [0, 1, 2, 3, 4])
    with pytest.raises(UserError, match="2 x 6 variants"):
        experiment.check_variants([0, 5], [0, 1, 2, 3, 4, 5])


def test_workers_are_at_most_one_per_cpu_or_a_few(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker is a process with its own copy of the traces: `--workers 100000` forked one per job."""
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda _: {0, 1})
    assert pool.worker_limit() == pool.MIN_WORKER_LIMIT  # a small machine still runs `--workers 2` scripts
    pool.check_workers(pool.MIN_WORKER_LIMIT)
    with pytest.raises(UserError, match=r"--workers 9: at most 8 here"):
        pool.check_workers(9)
    monkeypatch.setattr(pool.os, "sched_getaffinity", lambda _: set(range(32)))
    pool.check_workers(32)
    with pytest.raises(UserError, match=r"--workers 100000: at most 32 here"):
        pool.check_workers(100_000)


def test_summary_averages_over_seeds(tiny: trace.Trace) -> None:
    base = replay.replay(tiny, policy="fgd", seed=1)
    runs = [
        dataclasses.replace(
            base, allocation={99: 88.0, 100: 90.0}, fragmentation={100: 4.0}, failed_pods=10, seconds=1.0
        ),
        dataclasses.replace(
            base,
            seed=2,
            allocation={100: 92.0, 101: 93.0},
            fragmentation={100: 6.0},
            failed_pods=11,
            seconds=2.0,
        ),
    ]
    summary = summary_of(tiny, [1, 2], runs)
    row = summary["policies"]["fgd"]
    assert row.pop("gap_to_bound") == round(summary["bound"]["allocation_at_100"] - 91.0, 2)
    assert row == {
        "allocation": {"99": 88.0, "100": 91.0, "101": 93.0},
        "allocation_at_100": 91.0,
        "allocation_at_100_std": 1.0,
        "unallocated_at_100": 9.0,
        "fragmentation_at_100": 5.0,
        "failed_pods": 10.5,
        "seconds": 1.5,
    }


def test_the_papers_figures_stand_beside_the_default_trace_at_1_3_only(tiny: trace.Trace) -> None:
    """They are means over the default openb trace at inflation 1.3: beside any other pod list, node list or
    inflation they read as what that run should have reached."""
    bundled = trace.load()
    assert experiment.publishes(bundled, 1.3)
    assert experiment.publishes(dataclasses.replace(bundled, name="default"), 1.3)  # --traces default
    assert not experiment.publishes(bundled, 0.5) and not experiment.publishes(bundled, 2.0)
    assert not experiment.publishes(dataclasses.replace(bundled, pods=bundled.pods[1:]), 1.3)
    assert not experiment.publishes(dataclasses.replace(bundled, nodes=bundled.nodes[1:]), 1.3)
    assert not experiment.publishes(tiny, 1.3)
    base = replay.replay(tiny, policy="fgd", seed=1)
    runs = {
        inflation: [
            dataclasses.replace(base, policy=policy, inflation=inflation) for policy in ("fgd", "spread")
        ]
        for inflation in (1.3, 0.5)
    }
    found = {1: bound.Bound(9_000_000.0, 9_000_000, 100, 1, 1, 0.0)}
    at_paper = experiment.summarize(bundled, [1], runs[1.3], found)["policies"]
    assert at_paper["fgd"]["published_at_100"] == experiment.PUBLISHED_AT_100["fgd"]
    assert "published_at_100" not in at_paper["spread"]  # not one of the paper's policies
    assert all(
        "published_at_100" not in row
        for row in experiment.summarize(bundled, [1], runs[0.5], found)["policies"].values()
    )
    assert "published_at_100" not in summary_of(tiny, [1], runs[1.3][:1])["policies"]["fgd"]


def test_a_run_that_never_reached_100_percent_reports_its_nearest_point(tiny: trace.Trace) -> None:
    base = replay.replay(tiny, policy="bestfit", seed=1)
    short = dataclasses.replace(base, allocation={98: 80.0, 102: 85.0, 90: 70.0}, fragmentation={})
    summary = summary_of(tiny, [1], [short])
    row = summary["policies"]["bestfit"]
    assert row["allocation_at_100"] == 80.0  # 98 and 102 are as near; the lower wins
    assert row["fragmentation_at_100"] == 0.0
    assert summary[READ_ELSEWHERE_KEY] == [98]  # and the document says where it was read
    reached = dataclasses.replace(short, allocation={98: 80.0, 100: 82.0})
    assert summary_of(tiny, [1], [short, reached])[READ_ELSEWHERE_KEY] == [98, 100]
    assert READ_ELSEWHERE_KEY not in summary_of(tiny, [1], [reached])


def test_the_bound_of_a_full_cluster_is_100_percent_not_more() -> None:
    """200 GPUs and one-GPU pods: the pods read at 100% arrival ask 201 GPUs, and all 200 can be taken. The
    LP's answer, raised a hair against its tolerances, made the bound 100.01%."""
    nodes = tuple(
        NodeSpec(f"n{i}", 10**6, 10**7, tuple(GpuSpec(g, f"n{i}-{g}", "T4", 16_000) for g in range(50)))
        for i in range(4)
    )
    whole = trace.Trace("whole", nodes, (trace.TracePod("w", 1_000, 1_024, 1, 1_000, None),))
    found = bound.at_report_point(whole, seed=1, inflation=1.3)
    assert (found.arrived_milli, found.milli) == (201_000, 200_000)
    run = replay.replay(whole, policy="bestfit", seed=1)
    summary = experiment.summarize(whole, [1], [run], {1: found})
    assert summary["bound"]["allocation_at_100"] == summary["bound"]["per_seed"]["1"] == 100.0
    assert summary["policies"]["bestfit"]["gap_to_bound"] >= 0


def test_the_bounds_mean_is_rounded_up_once_not_past_a_hundredth_it_already_is(tiny: trace.Trace) -> None:
    """The per-seed bounds are rounded up to hundredths, then their mean up again: in floats 100 × 81.9 is
    8190.000000000001, so a bound of 81.90 on every seed was reported as 81.91 (and every gap 0.01 wider)."""
    base = replay.replay(tiny, policy="fgd", seed=1)
    milli = 0.819 * tiny.gpus * bound.MILLI
    found = {seed: bound.Bound(milli, tiny.gpus * bound.MILLI, 12, 1, 1, 0.0) for seed in (1, 2)}
    runs = [dataclasses.replace(base, seed=seed) for seed in (1, 2)]
    summary = experiment.summarize(tiny, [1, 2], runs, found)["bound"]
    assert summary["per_seed"] == {"1": 81.9, "2": 81.9}
    assert summary["allocation_at_100"] == 81.9
    found[2] = dataclasses.replace(found[2], milli=0.8191 * tiny.gpus * bound.MILLI)
    assert experiment.summarize(tiny, [1, 2], runs, found)["bound"]["allocation_at_100"] == 81.91


def test_the_bound_is_above_every_policy_on_every_seed() -> None:
    """Short replays of every policy on a mixed trace (shares of every size, whole and multi-GPU pods, CPU
    heavy pods, two GPU models, pods tied to one): no run allocates more than its seed's bound."""
    nodes = tuple(
        NodeSpec(f"n{i}", cpu, 65_536, tuple(GpuSpec(g, f"n{i}-{g}", model, 16_000) for g in range(gpus)))
        for i, (cpu, gpus, model) in enumerate([(16_000, 2, "T4")] * 3 + [(32_000, 4, "P100")] * 2)
    )
    shapes = [(2_000, 1, 810), (4_000, 1, 470), (1_000, 1, 160), (12_000, 1, 1000), (8_000, 2, 1000)]
    pods = tuple(
        trace.TracePod(f"p{i}", cpu, 4_096, gpus, milli, frozenset({"P100"}) if i % 7 == 0 else None)
        for i, (cpu, gpus, milli) in enumerate(shapes * 6)
    )
    mixed = trace.Trace("mixed", nodes, pods)
    seeds = [1, 2, 3, 4, 5]
    sweep = experiment.run_sweep([mixed], policies=list(POLICIES), seeds=seeds, inflation=1.3, workers=1)
    results = sweep[mixed.name].runs
    summary = experiment.summarize(mixed, seeds, results, sweep[mixed.name].bounds)
    for run in results:
        reported = run.allocation.get(100, experiment._nearest(run.allocation, 100))
        assert reported <= summary["bound"]["per_seed"][str(run.seed)]
    for row in summary["policies"].values():
        assert row["gap_to_bound"] >= 0
