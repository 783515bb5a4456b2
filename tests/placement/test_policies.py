"""The engine and each policy on hand-worked scenarios whose answer can be reasoned out on paper."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import NodeSpec, Placement, PodDemand, Unschedulable
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import Mebibytes, Portion, ShareRequest, WholeGpuRequest
from gpufrac.placement.engine import decide
from gpufrac.placement.fit import find_fit
from gpufrac.placement.framework import POLICIES, Policy
from gpufrac.placement.pickers import RandomGpu
from gpufrac.placement.policies import fgd_stranding
from gpufrac.placement.policies.fgd import fgd_score
from gpufrac.placement.policies.fgd_stranding import STRANDING_WEIGHT, cpu_per_gpu, model_need
from gpufrac.placement.workload import Shape, Workload

from ..cluster.builders import SM, TS, node, share_at, share_pod, whole_at, whole_pod
from .builders import DEFAULT_WORKLOAD, DETERMINISTIC, feasible_nodes, place, policy, refused, workload

ALL = sorted(POLICIES)


def scores(
    state: ClusterState, pod: PodDemand, chosen: str | Policy, *, target: Workload = DEFAULT_WORKLOAD
) -> list[int]:
    fit = find_fit(state, pod)
    scorer = (policy(chosen, target=target) if isinstance(chosen, str) else chosen).scorer
    return [int(score) for score in scorer.score(state, fit)]


def prefer_last(state: ClusterState) -> None:
    """Reverse the tie order, so that a node that wins first in line can only have won on its score."""
    count = len(state.names)
    state.tie_rank[:count] = np.arange(count)[::-1]


# ---- the engine, whatever the policy ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_unschedulable_counts_nodes_by_their_first_failing_reason(name: str) -> None:
    state = ClusterState([node(f"n{i}", 1) for i in range(5)])
    for i in range(3):
        state.apply(share_at(f"ts{i}", f"n{i}", (0,), 12_000))
    for i in (3, 4):
        state.apply(share_at(f"sm{i}", f"n{i}", (0,), 4_000, mode=SM))
    outcome = refused(state, share_pod("p", 500), policy(name))
    assert outcome.reasons == {"not enough GPU memory": 3, "GPU mode is sm-sharing": 2}
    assert outcome.message == "0/5 nodes are available: 3 not enough GPU memory, 2 GPU mode is sm-sharing"


@pytest.mark.parametrize(
    ("spec", "pod", "reason"),
    [
        (node("n", cpu=1_000), share_pod("p", 100, cpu=2_000), "not enough CPU"),
        (node("n", cpu=1_000, model="A100"), share_pod("p", 100, cpu=2_000, models=["T4"]), "not enough CPU"),
        (node("n", mem=1_000), share_pod("p", 100, mem=2_000), "not enough memory"),
        (node("n", 1), whole_pod("p", 2), "too few GPUs"),
        (node("n", 0), share_pod("p", 100), "too few GPUs"),
        (node("n", 2), share_pod("p", 100, devices=3), "too few GPUs"),
        (node("n", model="T4"), share_pod("p", 100, models=["A100", "V100"]), "GPU model not allowed"),
        (node("n", unhealthy=(0, 1)), share_pod("p", 100), "no healthy free GPU"),
        (node("n", unhealthy=(0,)), whole_pod("p", 2), "not enough free GPUs"),
        (node("n", 2, unhealthy=(0,)), share_pod("p", 100, devices=2), "not enough GPU memory"),
        (
            node("n", 1),
            PodDemand("p", shares=(ShareRequest("main", Mebibytes(100), Mebibytes(16_001)),)),
            "not enough GPU memory",
        ),
        (node("n", 1, memory=500), share_pod("p", 1), "not enough GPU memory"),  # resolves to 0 MiB
    ],
)
def test_each_filter_names_its_reason(spec: NodeSpec, pod: PodDemand, reason: str) -> None:
    state = ClusterState([spec])
    assert refused(state, pod, policy("bestfit")).reasons == {reason: 1}


def test_whole_gpus_skip_gpus_held_whole_and_count_them_as_not_free() -> None:
    state = ClusterState([node("n", 2)])
    state.apply(whole_at("w", "n", (0, 1)))
    assert refused(state, share_pod("p", 100), policy("bestfit")).reasons == {"no healthy free GPU": 1}


@pytest.mark.parametrize("name", ALL)
def test_gpu_model_constraints_are_respected(name: str) -> None:
    state = ClusterState(
        [node("t4", 4, model="T4"), node("a100", 4, model="A100"), node("v100", 4, model="V100")]
    )
    for pod in (share_pod("s", 300, models=["A100"]), whole_pod("w", 2, models=["A100", "H100"])):
        assert place(state, pod, policy(name)).node == "a100"
    assert refused(state, whole_pod("x", 2, models=["A100"]), policy(name)).reasons == {
        "GPU model not allowed": 2,
        "not enough free GPUs": 1,
    }


@pytest.mark.parametrize("name", ALL)
def test_cpu_and_memory_must_fit(name: str) -> None:
    state = ClusterState([node("small-cpu", cpu=2_000), node("small-mem", mem=1_024), node("roomy")])
    for pod in (share_pod("s", 100, cpu=4_000, mem=2_048), PodDemand("c", cpu_milli=4_000, memory_mib=2_048)):
        placement = place(state, pod, policy(name))
        assert placement.node == "roomy"
        assert (placement.cpu_milli, placement.memory_mib) == (4_000, 2_048)
    assert PodDemand("c").wants_gpu is False
    assert place(state, PodDemand("cpu-only"), policy(name)).assignments == ()


def test_portions_resolve_to_the_floor_of_the_gpu_they_land_on() -> None:
    share = ShareRequest("main", Portion(Fraction(1, 3)), Portion(Fraction(1, 2)))
    state = ClusterState([node("n16", 1, memory=16_384), node("n24", 1, memory=24_000)])
    for name, expected in (("n16", (5_461, 8_192)), ("n24", (8_000, 12_000))):
        pod = PodDemand(f"on-{name}", shares=(share,))
        state.tie_rank[: len(state.names)] = [0, 1] if name == "n16" else [1, 0]
        (assignment,) = place(state, pod, policy("binpack")).assignments
        assert (assignment.request_mib, assignment.limit_mib) == expected
        state.release(pod.name)
    mib = ShareRequest("main", Mebibytes(5_000), Mebibytes(6_000))
    (assignment,) = place(state, PodDemand("mib", shares=(mib,)), policy("binpack")).assignments
    assert (assignment.request_mib, assignment.limit_mib) == (5_000, 6_000)


@pytest.mark.parametrize("name", ALL)
def test_a_cluster_without_gpus_still_places_cpu_only_pods(name: str) -> None:
    state = ClusterState([node("a", 0), node("b", 0)])
    assert state.width == 0
    assert place(state, PodDemand("c", cpu_milli=100), policy(name)).assignments == ()
    assert refused(state, share_pod("s", 100), policy(name)).reasons == {"too few GPUs": 2}


@pytest.mark.parametrize("name", ALL)
def test_a_multi_device_share_lands_on_distinct_usable_gpus(name: str) -> None:
    state = ClusterState([node("n", 4)])
    state.apply(whole_at("w", "n", (0,)))
    state.apply(share_at("sm", "n", (2,), 1_000, mode=SM))
    (assignment,) = place(state, share_pod("p", 500, devices=2), policy(name)).assignments
    assert assignment.gpus == (1, 3)
    assert (assignment.request_mib, assignment.mode) == (8_000, TS)
    assert violations(state) == []


@pytest.mark.parametrize("name", ALL)
def test_whole_gpus_take_empty_gpus_exclusively(name: str) -> None:
    state = ClusterState([node("n", 4)])
    state.apply(share_at("s", "n", (1,), 1_000))
    (assignment,) = place(state, whole_pod("w", 2), policy(name)).assignments
    assert len(set(assignment.gpus)) == 2 and 1 not in assignment.gpus
    assert assignment.mode is None and assignment.request_mib == assignment.limit_mib == 16_000
    if name != "random":
        assert assignment.gpus == (0, 2)  # the lowest-index empty GPUs
    assert refused(state, whole_pod("x", 2), policy(name)).reasons == {"not enough free GPUs": 1}


@pytest.mark.parametrize("name", DETERMINISTIC)
@pytest.mark.parametrize("pod", [share_pod("s", 300), whole_pod("w"), PodDemand("c", cpu_milli=100)])
def test_ties_go_to_the_lowest_tie_rank(name: str, pod: PodDemand) -> None:
    state = ClusterState([node("a"), node("b"), node("c")])
    state.tie_rank[:3] = [2, 0, 1]
    assert decide(state, pod, policy(name)).node == "b"
    state.tie_rank[:3] = [1, 2, 0]
    assert decide(state, pod, policy(name)).node == "c"


@pytest.mark.parametrize("name", ALL)
def test_a_policy_reads_only_what_it_declares(name: str) -> None:
    """Without `needs_workload` the target workload changes no placement; if `deterministic`, nor does the
    seed: callers such as the scheduler and the planner rely on these declarations."""
    pods = [share_pod(f"s{i}", 150 + 100 * i, cpu=1_000 * i) for i in range(7)] + [whole_pod("w", cpu=500)]
    whole_tasks = workload((Shape(cpu_milli=0, gpus=1, milli=1000), 1.0))

    def placements(seed: int, target: Workload) -> list[Placement]:
        state = ClusterState([node("a", 4), node("b", 2), node("c", 3, cpu=8_000)])
        chosen = policy(name, seed=seed, target=target)
        return [place(state, pod, chosen) for pod in pods]

    first = placements(0, DEFAULT_WORKLOAD)
    if not POLICIES[name].needs_workload:
        assert placements(0, whole_tasks) == first
    if POLICIES[name].deterministic:
        assert placements(1, DEFAULT_WORKLOAD) == first


# ---- each policy ---------------------------------------------------------------------------------------


def test_bestfit_scores_the_leftover_and_prefers_the_fuller_node() -> None:
    state = ClusterState([node("fresh", 4)])
    # 1 - 0.5 * 56000/128000 - 0.5 * 3500/8000 = 0.5625
    assert scores(state, share_pod("p", 500, cpu=8_000), "bestfit") == [56]
    state = ClusterState([node("half", 1), node("empty", 1)])
    state.apply(share_at("h", "half", (0,), 8_000))
    prefer_last(state)
    # leftover GPU 250 vs 750 milli: 100 * (1 - 0.25 - 0.5 * 250/8000) = 73.4, and 70.3
    assert scores(state, share_pod("p", 250), "bestfit") == [73, 70]
    assert place(state, share_pod("p", 250), policy("bestfit")).node == "half"


def test_bestfit_gpu_picker_fills_the_partly_used_gpu() -> None:
    state = ClusterState([node("n", 3)])
    state.apply(share_at("a", "n", (2,), 4_000))
    state.apply(share_at("b", "n", (1,), 9_000))
    (assignment,) = place(state, share_pod("p", 250), policy("bestfit")).assignments
    assert assignment.gpus == (1,)  # 7000 MiB free: the least left over, 3000 MiB


def test_dotprod_is_the_scaled_dot_product_and_the_smallest_wins() -> None:
    state = ClusterState([node("eight", 8), node("four", 4)])
    # four: 1 - ((64000/128000)(16000/128000) + (4000/8000)(500/8000)) / 2 = 0.953125
    # eight: 1 - (0.0625 + (8000/8000)(500/8000)) / 2 = 0.9375
    assert scores(state, share_pod("p", 500, cpu=16_000), "dotprod") == [93, 95]
    assert place(state, share_pod("p", 500, cpu=16_000), policy("dotprod")).node == "four"


def test_packing_prefers_partly_used_gpu_then_empty_gpu_on_used_node_then_idle_node() -> None:
    state = ClusterState([node("idle"), node("used-node"), node("partly-used")])
    state.apply(whole_at("w", "used-node", (0,)))
    state.apply(share_at("s", "partly-used", (0,), 8_000))
    pod = share_pod("p", 500)
    # bands: partly used [50, 100] (100 - 50% free / 10), empty GPU on a used node [33, 50], idle [0, 33]
    assert scores(state, pod, "packing") == [31, 49, 95]
    chosen = place(state, pod, policy("packing"))
    assert (chosen.node, chosen.assignments[0].gpus) == ("partly-used", (0,))
    # Both used nodes now offer only an empty GPU (49 each): the tie order takes used-node, whose
    # half-used GPU then wins the next pod; once the used nodes are full, the idle node is last.
    expected = ["used-node", "used-node", "partly-used", "partly-used", "idle"]
    assert [place(state, share_pod(f"q{i}", 500), policy("packing")).node for i in range(5)] == expected


def test_packing_only_counts_a_partly_used_gpu_the_pod_can_join() -> None:
    # The sm-sharing GPU on "other-mode" has room but the wrong mode: the pod would go to its empty GPU,
    # so that node belongs in the "empty GPU on a used node" band, below a genuinely partly used GPU.
    state = ClusterState([node("other-mode"), node("same-mode")])
    state.apply(share_at("sm", "other-mode", (0,), 4_000, mode=SM))
    state.apply(share_at("ts", "same-mode", (0,), 3_200))
    assert scores(state, share_pod("p", 500), "packing") == [49, 92]
    chosen = place(state, share_pod("p", 500), policy("packing"))
    assert (chosen.node, chosen.assignments[0].gpus) == ("same-mode", (0,))


def test_packing_whole_gpus_prefer_a_used_node_and_ignore_cpu_only_pods() -> None:
    state = ClusterState([node("idle", 4), node("used", 4)])
    state.apply(share_at("s", "used", (0,), 1_000))
    assert scores(state, whole_pod("w", 2), "packing") == [29, 48]
    assert scores(state, PodDemand("c"), "packing") == [0, 0]


def _clustering_cluster() -> ClusterState:
    state = ClusterState([node(name, 4) for name in ("shares-only", "mixed", "empty", "whole-only")])
    state.apply(share_at("s1", "shares-only", (0,), 8_000))
    state.apply(share_at("s2", "mixed", (0,), 8_000))
    state.apply(whole_at("w1", "mixed", (1,)))
    state.apply(whole_at("w2", "whole-only", (0,)))
    state.apply(Placement("cpu", "empty", cpu_milli=1_000))  # a CPU-only pod tags nothing
    prefer_last(state)
    return state


def test_clustering_bands_put_a_share_with_shares() -> None:
    state = _clustering_cluster()
    # band (75 same only, 50 same among others, 25 no GPU pods, 0 others) + 25 * (8000 - free) // 8000
    assert scores(state, share_pod("p", 250), "clustering") == [75 + 14, 50 + 17, 25 + 12, 0 + 15]
    assert place(state, share_pod("p", 250), policy("clustering")).node == "shares-only"


def test_clustering_bands_put_a_whole_gpu_with_whole_gpus_of_its_size() -> None:
    state = _clustering_cluster()
    assert scores(state, whole_pod("w"), "clustering") == [0 + 14, 50 + 17, 25 + 12, 75 + 15]
    assert scores(state, whole_pod("w", 2), "clustering") == [0 + 14, 0 + 17, 25 + 12, 0 + 15]
    chosen = place(state, whole_pod("w"), policy("clustering"))
    assert (chosen.node, chosen.assignments[0].gpus) == ("whole-only", (1,))
    assert scores(state, PodDemand("c"), "clustering") == [0, 0, 0, 0]


def test_clustering_sees_a_node_change_after_its_pods_leave() -> None:
    state = _clustering_cluster()
    chosen = policy("clustering")
    fit = find_fit(state, share_pod("p", 250))
    assert chosen.scorer.score(state, fit)[0] == 89
    state.release("s1")
    fit = find_fit(state, share_pod("p", 250))
    assert chosen.scorer.score(state, fit)[0] == 25 + 12


def test_fgd_score_is_50_when_fragmentation_does_not_move() -> None:
    assert fgd_score(np.array([0.0, 200.0, -500.0, 500.0, -1e5, 1e5])).tolist() == [50, 45, 62, 37, 100, 0]


def test_fgd_picks_the_gpu_that_leaves_the_least_fragmentation() -> None:
    # Against 0.5-GPU tasks, 0.5 on the 0.7-free GPU strands 0.2 (Δ = 200); on the empty GPU, nothing.
    state = ClusterState([node("n", 2)])
    state.apply(share_at("s", "n", (0,), 4_800))
    assert place(state, share_pod("fgd", 500), policy("fgd")).assignments[0].gpus == (1,)
    state.release("fgd")
    assert place(state, share_pod("bestfit", 500), policy("bestfit")).assignments[0].gpus == (0,)


def test_fgd_picks_the_node_whose_fragmentation_grows_least() -> None:
    state = ClusterState([node("strands", 1), node("empty", 1)])
    state.apply(share_at("s", "strands", (0,), 4_800))
    assert scores(state, share_pod("p", 500), "fgd") == [45, 50]
    assert place(state, share_pod("p", 500), policy("fgd")).node == "empty"


def test_fgd_fills_a_half_used_gpu_when_whole_gpu_tasks_are_expected() -> None:
    whole_tasks = workload((Shape(cpu_milli=0, gpus=1, milli=1000), 1.0))
    state = ClusterState([node("empty", 1), node("half", 1)])
    state.apply(share_at("s", "half", (0,), 8_000))
    # half: 500 stranded before, 0 after (Δ = -500); empty: 0 before, 500 after (Δ = +500)
    assert scores(state, share_pod("p", 500), "fgd", target=whole_tasks) == [37, 62]
    assert place(state, share_pod("p", 500), policy("fgd", target=whole_tasks)).node == "half"


def test_fgd_keeps_cpu_for_the_expected_tasks() -> None:
    # A CPU-only pod on "tight" would leave too little CPU for the workload's 8-core tasks, stranding its GPU.
    tasks = workload((Shape(cpu_milli=8_000, gpus=1, milli=500), 1.0))
    state = ClusterState([node("tight", 1, cpu=10_000), node("roomy", 1)])
    assert scores(state, PodDemand("c", cpu_milli=4_000), "fgd", target=tasks) == [26, 50]
    assert place(state, PodDemand("c", cpu_milli=4_000), policy("fgd", target=tasks)).node == "roomy"


def test_fgd_whole_and_multi_device_pods() -> None:
    state = ClusterState([node("n", 4)])
    state.apply(share_at("s", "n", (0,), 12_000))
    assert place(state, whole_pod("w", 2), policy("fgd")).assignments[0].gpus == (1, 2)
    state.release("w")
    # best fit over the fitting GPUs: GPU 0 has 4000 MiB free, the empty ones tie and go in index order
    assert place(state, share_pod("m", 250, devices=3), policy("fgd")).assignments[0].gpus == (0, 1, 2)


def test_fgd_memo_follows_the_state() -> None:
    chosen = policy("fgd")
    state = ClusterState([node("a", 1), node("b", 1)])
    assert scores(state, share_pod("p", 300), chosen) == [50, 50]
    assert place(state, share_pod("p1", 300), chosen).node == "a"
    # A second 0.3 on "a" would leave 0.4, too little for a 0.5 task: Δ = 400.
    assert scores(state, share_pod("p", 300), chosen) == [40, 50]
    assert place(state, share_pod("p2", 300), chosen).node == "b"
    state.release("p1")
    assert scores(state, share_pod("p", 300), chosen) == [50, 40]


def test_random_only_picks_feasible_nodes_and_gpus_and_is_seeded() -> None:
    state = ClusterState([node(f"n{i}", 2, cpu=1_000 if i % 3 else 64_000) for i in range(10)])
    for i in (0, 3, 6, 9):
        state.apply(share_at(f"sm{i}", f"n{i}", (0,), 1_000, mode=SM))
    pod = share_pod("p", 500, cpu=2_000)

    def draws(seed: int) -> list[tuple[str, tuple[int, ...]]]:
        chosen = policy("random", seed=seed)
        outcomes = [decide(state, pod, chosen) for _ in range(40)]
        return [(o.node, o.assignments[0].gpus) for o in outcomes]

    first = draws(7)
    assert {node for node, _ in first} == {"n0", "n3", "n6", "n9"}
    assert {gpus for _, gpus in first} == {(1,)}
    assert draws(7) == first
    assert draws(8) != first


def test_random_one_gpu_share_draws_as_choice_without_replacement() -> None:
    """The picker's shortcut for one GPU takes the GPU `choice(pool, 1, replace=False)` would, leaving the
    stream where it would: published random runs replay unchanged."""
    state = ClusterState([node("n", 8)])
    for gpu in (1, 4, 6):
        state.apply(share_at(f"s{gpu}", "n", (gpu,), 14_000))
    pod = share_pod("p", 250)
    usable = find_fit(state, pod).usable(0).nonzero()[0]
    assert list(usable) == [0, 2, 3, 5, 7]
    for seed in range(50):
        picker = RandomGpu(np.random.default_rng(seed))
        reference = np.random.default_rng(seed)
        for _ in range(20):
            drawn = int(reference.choice(usable, 1, replace=False)[0])
            assert picker.pick(state, find_fit(state, pod), 0) == (drawn,)
        assert picker.rng.bit_generator.state == reference.bit_generator.state


def test_random_whole_gpus_are_empty_and_distinct() -> None:
    state = ClusterState([node("n", 8)])
    state.apply(share_at("s", "n", (3,), 1_000))
    chosen = policy("random", seed=1)
    seen = set()
    for _ in range(20):
        gpus = decide(state, whole_pod("w", 3), chosen).assignments[0].gpus
        assert len(set(gpus)) == 3 and 3 not in gpus
        seen.add(gpus)
    assert len(seen) > 1


def _two_shared_nodes() -> ClusterState:
    state = ClusterState([node("fuller"), node("emptier")])
    state.apply(share_at("a", "fuller", (0,), 8_000))
    state.apply(share_at("b", "emptier", (0,), 4_000))
    return state


def test_binpack_picks_the_most_requested_node_and_the_best_fitting_gpu() -> None:
    state = _two_shared_nodes()
    prefer_last(state)
    # requested after: fuller (8000 + 4000)/32000 = 0.375, emptier (4000 + 4000)/32000 = 0.25
    assert scores(state, share_pod("p", 250), "binpack") == [37, 25]
    chosen = place(state, share_pod("p", 250), policy("binpack"))
    assert (chosen.node, chosen.assignments[0].gpus) == ("fuller", (0,))


def test_spread_picks_the_least_requested_node_and_the_emptiest_gpu() -> None:
    state = _two_shared_nodes()
    assert scores(state, share_pod("p", 250), "spread") == [62, 75]
    chosen = place(state, share_pod("p", 250), policy("spread"))
    assert (chosen.node, chosen.assignments[0].gpus) == ("emptier", (1,))


def test_binpack_counts_whole_gpus_at_their_size() -> None:
    state = ClusterState([node("idle", 4), node("busy", 4)])
    state.apply(whole_at("w", "busy", (0,)))
    assert scores(state, whole_pod("p", 2), "binpack") == [50, 75]
    assert scores(state, whole_pod("p", 2), "spread") == [50, 25]


# ---- property: the filters are complete --------------------------------------------------------------------

nodes = st.builds(
    lambda gpus, memory, model, cpu, sick: (gpus, memory, model, cpu, sick),
    st.integers(0, 4),
    st.sampled_from([16_000, 24_576]),
    st.sampled_from(["T4", "A100"]),
    st.sampled_from([2_000, 64_000]),
    st.sets(st.integers(0, 3), max_size=2),
)


@st.composite
def pods(draw: st.DrawFn, name: str) -> PodDemand:
    cpu = draw(st.sampled_from([0, 1_000, 4_000]))
    models = draw(st.sampled_from([None, frozenset({"A100"})]))
    kind = draw(st.sampled_from(["share", "whole", "cpu"]))
    if kind == "whole":
        return PodDemand(
            name, cpu_milli=cpu, whole=(WholeGpuRequest("main", draw(st.integers(1, 3))),), models=models
        )
    if kind == "cpu":
        return PodDemand(name, cpu_milli=cpu)
    milli = draw(st.integers(1, 1000))
    return share_pod(
        name,
        milli,
        cpu=cpu,
        limit=draw(st.integers(milli, 1000)),
        mode=draw(st.sampled_from([TS, SM])),
        devices=draw(st.integers(1, 3)),
        models=models,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(nodes, min_size=1, max_size=4),
    st.lists(pods("p"), max_size=8),
    pods("probe"),
    st.sampled_from(ALL),
)
def test_a_pod_is_unschedulable_exactly_when_no_node_can_take_it(
    specs: list[tuple[int, int, str, int, set[int]]], history: list[PodDemand], probe: PodDemand, name: str
) -> None:
    state = ClusterState(
        node(f"n{i}", gpus, memory=memory, model=model, cpu=cpu, unhealthy=sick)
        for i, (gpus, memory, model, cpu, sick) in enumerate(specs)
    )
    chosen = policy(name)
    for i, pod in enumerate(history):
        outcome = decide(state, dataclasses.replace(pod, name=f"p{i}"), chosen)
        if not isinstance(outcome, Unschedulable):
            state.apply(outcome)
    expected = feasible_nodes(state, probe)
    outcome = decide(state, probe, chosen)
    if isinstance(outcome, Unschedulable):
        assert expected == set()
        assert sum(outcome.reasons.values()) == len(specs)
    else:
        assert outcome.node in expected
        state.apply(outcome)
        assert violations(state) == []


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_sm_sharing_shares_share_a_gpu_only_within_one_fault_domain(name: str) -> None:
    """One MPS server per GPU merges its clients' fault domains: another tenant's sm-sharing share goes to
    another GPU, or nowhere; time-slicing shares and the same tenant's are not held back."""
    state = ClusterState([node("n", 2)])
    chosen = policy(name)
    a1 = place(state, dataclasses.replace(share_pod("a1", 250, mode=SM), fault_domain="team-a"), chosen)
    b1 = place(state, dataclasses.replace(share_pod("b1", 250, mode=SM), fault_domain="team-b"), chosen)
    assert a1.assignments[0].gpus != b1.assignments[0].gpus
    a2 = place(state, dataclasses.replace(share_pod("a2", 250, mode=SM), fault_domain="team-a"), chosen)
    assert a2.assignments[0].gpus == a1.assignments[0].gpus
    outcome = refused(
        state, dataclasses.replace(share_pod("c1", 250, mode=SM), fault_domain="team-c"), chosen
    )
    assert outcome.reasons == {"sm-sharing GPUs hold another fault domain's shares": 1}
    assert violations(state) == []


def test_fgd_stranding_avoids_a_node_whose_cpu_would_strand_its_free_gpus() -> None:
    # Against whole-GPU tasks of 8 cores, "tight" keeps enough CPU for one of them after a 2-core pod, so
    # FGD's fragmentation does not move on either node and the tie order sends the pod to "tight". But then
    # 15 cores feed only 1.875 of its 2 free GPUs: 125 milli-GPU stranded, which fgd-stranding avoids.
    tasks = workload((Shape(cpu_milli=8_000, gpus=1, milli=1000), 1.0))
    state = ClusterState([node("tight", 2, cpu=17_000), node("roomy", 2)])
    pod = PodDemand("c", cpu_milli=2_000)
    assert scores(state, pod, "fgd", target=tasks) == [50, 50]
    assert place(state, pod, policy("fgd", target=tasks)).node == "tight"
    state.release("c")
    stranding = int(fgd_score(np.array(STRANDING_WEIGHT * 125)))
    assert stranding < 50
    assert scores(state, pod, "fgd-stranding", target=tasks) == [stranding, 50]
    assert place(state, pod, policy("fgd-stranding", target=tasks)).node == "roomy"


def test_fgd_stranding_breaks_score_ties_by_the_least_leftover_on_the_gpu() -> None:
    # Against 0.1-GPU tasks nothing fragments, so FGD takes the first GPU; the tie-break takes the fuller one.
    tasks = workload((Shape(cpu_milli=0, gpus=1, milli=100), 1.0))
    state = ClusterState([node("n", 2)])
    state.apply(share_at("s", "n", (1,), 8_000))
    assert place(state, share_pod("fgd", 300), policy("fgd", target=tasks)).assignments[0].gpus == (0,)
    state.release("fgd")
    chosen = policy("fgd-stranding", target=tasks)
    assert place(state, share_pod("p", 300), chosen).assignments[0].gpus == (1,)


def test_fgd_stranding_leaves_holes_a_common_share_can_fill(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 320 share beside the 470 leaves 210 milli that only the rare 160s fit; beside the other 320 it
    # leaves 360, which the next 320 fills. FGD's scores tie (45), and the least leftover would take the
    # 470's GPU; the growth of the expected waste takes the other.
    tasks = workload(
        (Shape(cpu_milli=0, gpus=1, milli=470), 0.5),
        (Shape(cpu_milli=0, gpus=1, milli=320), 0.45),
        (Shape(cpu_milli=0, gpus=1, milli=160), 0.05),
    )
    waste = fgd_stranding.expected_waste(tasks)
    assert waste[210] > waste[530] and waste[360] < waste[680]
    assert waste[0] == waste[1000] == 0
    state = ClusterState([node("n", 2)])
    state.apply(share_at("a", "n", (0,), 7_520))  # 470 milli of 16,000 MiB: 530 free
    state.apply(share_at("b", "n", (1,), 5_120))  # 320: 680 free
    assert place(state, share_pod("fgd", 320), policy("fgd", target=tasks)).assignments[0].gpus == (0,)
    state.release("fgd")
    chosen = policy("fgd-stranding", target=tasks)
    assert place(state, share_pod("p", 320), chosen).assignments[0].gpus == (1,)
    state.release("p")
    monkeypatch.setattr(fgd_stranding, "HOLE_WEIGHT", 0.0)
    chosen = policy("fgd-stranding", target=tasks)
    assert place(state, share_pod("p", 320), chosen).assignments[0].gpus == (0,)


def test_fgd_stranding_feeds_gpus_at_the_workloads_weighted_median_cpu_per_gpu() -> None:
    tasks = workload(
        (Shape(cpu_milli=4_000, gpus=1, milli=500), 0.3),  # 8 cores per GPU
        (Shape(cpu_milli=12_000, gpus=2, milli=1000), 0.5),  # 6
        (Shape(cpu_milli=20_000, gpus=1, milli=1000), 0.1),  # 20
        (Shape(cpu_milli=2_000, gpus=0, milli=0), 0.1),  # no GPU: not counted
    )
    assert cpu_per_gpu(tasks) == 6_000
    assert cpu_per_gpu(tasks, percentile=70) == 8_000
    assert cpu_per_gpu(workload((Shape(cpu_milli=2_000, gpus=0, milli=0), 1.0))) == 0


# Half GPU pods of 8 cores a GPU, half CPU-only pods of 8 cores: 16 cores asked per GPU requested.
CPU_HEAVY = workload(
    (Shape(cpu_milli=8_000, gpus=1, milli=1000), 0.5), (Shape(cpu_milli=8_000, gpus=0, milli=0), 0.5)
)


def test_fgd_stranding_counts_cpu_only_pods_in_a_gpus_feed_when_cpu_is_oversubscribed() -> None:
    """40 cores for 2 GPUs: 32 cores asked at full GPU allocation, pressure 0.8, and a GPU is fed by the GPU
    pods' 8 cores. With another 2 GPUs on 16 cores, 64 are asked of 56 (pressure 8/7): the CPU-only pods'
    cores then come out of the GPUs' nodes, so a GPU needs their 8 too, times the pressure: 16 x 8/7."""
    state = ClusterState([node("a", 2, cpu=40_000)])
    assert fgd_stranding.cpu_pressure(CPU_HEAVY, state) == pytest.approx(0.8)
    assert fgd_stranding.feed_rate(CPU_HEAVY, state) == 8_000
    state.add_node(node("b", 2, cpu=16_000))
    assert fgd_stranding.cpu_pressure(CPU_HEAVY, state) == pytest.approx(8 / 7)
    assert fgd_stranding.feed_rate(CPU_HEAVY, state) == pytest.approx(16_000 * 8 / 7)
    assert fgd_stranding.cpu_pressure(workload((Shape(cpu_milli=8_000, gpus=0, milli=0), 1.0)), state) == 0
    no_cpu_for_gpus = workload(
        (Shape(cpu_milli=0, gpus=1, milli=1000), 0.5), (Shape(cpu_milli=80_000, gpus=0, milli=0), 0.5)
    )
    assert fgd_stranding.feed_rate(no_cpu_for_gpus, state) == 0


def test_fgd_stranding_rescores_every_node_when_a_node_change_changes_how_much_cpu_a_gpu_needs() -> None:
    """Node a keeps 24 of its 40 cores for its 2 free GPUs: fed at 8 cores a GPU, an 8-core CPU-only pod
    strands nothing there. Once node b is redefined with 8 cores instead of 64 (pressure past 1: 16 cores a
    GPU) it strands half a GPU more on a, and the score a policy kept for node a must not say otherwise."""
    state = ClusterState([node("a", 2, cpu=40_000), node("b", 2, cpu=64_000)])
    state.apply(Placement(pod="busy", node="a", cpu_milli=16_000, memory_mib=0))
    chosen = policy("fgd-stranding", target=CPU_HEAVY)
    cpu_only = PodDemand("c", cpu_milli=8_000)
    before = scores(state, cpu_only, chosen)
    state.add_node(node("b", 2, cpu=8_000))
    fresh = scores(state, cpu_only, "fgd-stranding", target=CPU_HEAVY)
    assert scores(state, cpu_only, chosen) == fresh
    assert fresh[0] < before[0]


def test_fgd_stranding_keeps_pods_that_may_run_anywhere_off_the_gpus_restricted_pods_need(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Half the workload's GPU demand may run only on T4s, which are a quarter of the GPUs: taking a T4 costs
    a pod that may run anywhere its milli-GPU times the T4s' need (2), so that steering by CPU (the T4s are
    CPU-rich on openb) does not spend them on it; on a V100 it costs nothing."""
    tasks = workload(
        (Shape(cpu_milli=0, gpus=1, milli=1000), 0.5),
        (Shape(cpu_milli=0, gpus=1, milli=1000, models=frozenset({"T4"})), 0.5),
    )
    state = ClusterState([node("t4", 1, model="T4"), *(node(f"v{i}", 1, model="V100") for i in range(3))])
    need = model_need(tasks, state)
    assert need[state.models.index("T4")] == pytest.approx(0.5 / 0.25)
    assert need[state.models.index("V100")] == 0
    anywhere = whole_pod("w")
    with_need = scores(state, anywhere, "fgd-stranding", target=tasks)
    monkeypatch.setattr(fgd_stranding, "MODEL_NEED_WEIGHT", 0.0)
    without = scores(state, anywhere, "fgd-stranding", target=tasks)
    assert with_need[1:] == without[1:]
    assert with_need[0] == int(fgd_score(np.array(4.0 * 2 * 1000))) < without[0]
    # A pod that must run on a T4 still gets it.
    monkeypatch.undo()
    assert place(state, whole_pod("t", models=["T4"]), policy("fgd-stranding", target=tasks)).node == "t4"
    # Without restricted pods in the workload, no model is needed.
    assert not model_need(workload((Shape(cpu_milli=0, gpus=1, milli=1000), 1.0)), state).any()


@pytest.mark.parametrize("name", ["fgd", "fgd-stranding"])
def test_fgd_scores_nodes_alike_once_and_as_it_scores_every_node(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the openb cluster, part filled, every shape of the trace gets the scores and GPUs that scoring every
    node gives, and the same again when the hash puts different nodes in one group."""
    from gpufrac.placement.policies import fgd
    from gpufrac.sim import trace
    from gpufrac.sim.replay import target_workload

    openb = trace.load()
    target = target_workload(openb)
    state = ClusterState(openb.nodes)
    filler = policy("bestfit")
    for pod in openb.pods[:1500]:
        outcome = decide(state, pod.demand(), filler)
        if isinstance(outcome, Placement):
            state.apply(outcome)
    shapes = {pod.demand().shares or pod.demand().whole: pod.demand() for pod in openb.pods}

    def scored(
        alike_from: int, groups: object = None, chunk: int = fgd.CHUNK
    ) -> list[tuple[list[int], list[int]]]:
        monkeypatch.setattr(fgd, "ALIKE_FROM", alike_from)
        monkeypatch.setattr(fgd, "CHUNK", chunk)
        if groups is not None:
            monkeypatch.setattr(fgd, "alike_rows", groups)
        chosen = policy(name, target=target).scorer
        assert isinstance(chosen, fgd.Fgd)
        out = []
        for pod in shapes.values():
            fit = find_fit(state, pod)
            positions = np.arange(len(fit.rows))
            scores, gpus = chosen._evaluate_alike(state, fit, positions)
            out.append((scores.tolist(), gpus.tolist()))
        return out

    one_by_one = scored(10**9)
    assert scored(1) == one_by_one
    assert scored(10**9, chunk=7) == one_by_one  # scored a few nodes at a time, as on a large cluster
    everything_alike = lambda table: (np.zeros(1, np.int64), np.zeros(len(table), np.int64))  # noqa: E731
    assert scored(1, everything_alike) == one_by_one


@pytest.mark.parametrize("name", ["fgd", "fgd-stranding"])
def test_a_policy_that_measures_against_a_workload_decides_without_one(name: str) -> None:
    """A scheduler's first pass has no pods to gather a workload from: every pod still gets a place."""
    state = ClusterState([node("n", 2, model="T4")])
    chosen = policy(name, target=Workload((), np.zeros(0)))
    for pod in (share_pod("s", 300), whole_pod("w", 1), PodDemand("c", cpu_milli=1_000)):
        place(state, pod, chosen)
