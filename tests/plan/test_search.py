"""The search for GPUs needed: its frontier, its probes, and the inputs it refuses."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import GpuSpec, NodeSpec
from gpufrac.errors import UserError
from gpufrac.plan import inputs, planner, search
from gpufrac.plan.engine_packer import EnginePacker
from gpufrac.plan.planner import Settings
from gpufrac.sim import trace

from . import traces
from .traces import share, whole


def mixed_pods(count: int, seed: int) -> list[traces.Pod]:
    rng = random.Random(seed)
    pods = []
    for i in range(count):
        kind = rng.random()
        if kind < 0.3:
            pods.append(whole(f"w{i}", rng.choice((1, 1, 2)), cpu=rng.choice((1000, 4000))))
        else:
            pods.append(
                share(f"s{i}", rng.choice((100, 250, 300, 470, 500, 810)), cpu=rng.choice((500, 2000)))
            )
    return pods


@pytest.fixture
def prepared(tmp_path: Path) -> planner.Inputs:
    files = traces.write(tmp_path, mixed_pods(60, seed=3), nodes=10, gpus=4, cpu=16_000)
    return planner.prepare(trace.load(*files), Settings(timed=False, workers=1))


@pytest.mark.parametrize("name", planner.ORDER)
def test_the_answer_passes_and_one_node_fewer_fails(prepared: planner.Inputs, name: str) -> None:
    strategy = prepared.strategy(name, 42)
    sequence = inputs.NodeSequence(prepared.nodes, 42)
    pods = inputs.pod_order(prepared.pods, 42)
    needed, packer = search.gpus_needed(strategy, sequence, pods)
    probes = {probe.nodes: probe for probe in needed.probes}
    assert not probes[needed.nodes - 1].passed
    # Probing again gives the same verdicts: nothing depends on earlier probes.
    assert search.probe(strategy, sequence.prefix(needed.nodes), pods)[0].passed
    assert not search.probe(strategy, sequence.prefix(needed.nodes - 1), pods)[0].passed
    assert needed.gpus == 4 * needed.nodes
    if isinstance(packer, EnginePacker):
        assert violations(packer.state) == []


def test_every_pod_of_the_workload_is_placed(prepared: planner.Inputs) -> None:
    strategy = prepared.strategy("fractions-mixed", 42)
    needed, packer = search.gpus_needed(
        strategy, inputs.NodeSequence(prepared.nodes, 42), inputs.pod_order(prepared.pods, 42)
    )
    gpu_pods = {pod.name for pod in prepared.pods if pod.wants_gpu}
    assert {use.pod for use in packer.uses()} == gpu_pods
    assert needed.bound in {"GPU", "CPU", "memory"}


def test_when_the_capacity_estimate_already_fits_the_search_steps_down(tmp_path: Path) -> None:
    # Two whole-GPU pods, nodes of one GPU: the totals say two nodes, two pass, one fails.
    files = traces.write(tmp_path, [whole("a"), whole("b")])
    row = traces.plan(files, strategies=("whole-gpu",), timed=False)["strategies"]["whole-gpu"]
    assert [probe[:2] for probe in row["runs"][0]["probes"]] == [[2, 2], [1, 1]]
    assert (row["bound"], row["runs"][0]["bound_reason"]) == ("GPU", "no healthy free GPU")


def test_one_node_enough_has_no_bound(tmp_path: Path) -> None:
    row = traces.plan(traces.write(tmp_path, [share("a", 100)]), timed=False)["strategies"]["whole-gpu"]
    assert (row["gpus_needed"], row["bound"]) == (1, "")


def test_a_pod_no_node_can_hold_is_refused_before_searching(tmp_path: Path) -> None:
    files = traces.write(tmp_path, [share("greedy", 100, cpu=64_000)])
    with pytest.raises(UserError, match=r"whole-gpu: pod greedy fits on no node even in an empty cluster"):
        traces.plan(files, timed=False)


def test_absolute_memory_too_large_for_the_gpu_is_refused(tmp_path: Path) -> None:
    # 0.9 of a 32 GB GPU is 28.8 GB: more than a T4's 16.
    files = traces.write(tmp_path, [share("big", 900)])
    with pytest.raises(UserError, match=r"fits on no node.*--gpu-model"):
        traces.plan(files, timed=False, reference_gb=32, strategies=("fractions-time-slicing",))
    # On an 80 GB GPU it is about a third.
    row = traces.plan(files, timed=False, reference_gb=32, gpu_model="H100-80GB", strategies=("mig",))[
        "strategies"
    ]["mig"]
    assert row["allocated_gpus"] == 0.5  # 28,800 MiB of 80,000 rounds up to 3g.40gb


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_workload_that_asks_for_no_gpu_is_refused(tmp_path: Path, gpus: int) -> None:
    """The plan counts the GPUs a workload needs: for a pod list with no GPU pod on GPU-less nodes it divided
    by the whole-GPU baseline's 0 GPUs (a traceback), and on GPU nodes it reported the GPUs of the one node
    the CPU pods took, as if they were needed."""
    files = traces.write(tmp_path, [traces.cpu_only("a"), traces.cpu_only("b")], gpus=gpus)
    with pytest.raises(UserError, match="the pod list pods has no pod that asks for a GPU"):
        traces.plan(files, timed=False)


def mixed_cluster(seed: int, nodes: int = 8, pods: int = 40) -> trace.Trace:
    """Nodes of four kinds (cores per GPU from 4,000 to 64,000; two models) and pods of five shapes, some
    tied to A10 and some CPU-heavy: clusters whose prefixes differ in CPU per GPU and in models."""
    rng = random.Random(seed)
    kinds = [(8_000, 2, "T4"), (96_000, 4, "T4"), (32_000, 8, "A10"), (64_000, 1, "A10")]
    specs = []
    for i in range(nodes):
        cpu, gpus, model = kinds[i] if i < len(kinds) else rng.choice(kinds)
        devices = tuple(GpuSpec(g, f"n{i}-{g}", model, 16_000) for g in range(gpus))
        specs.append(NodeSpec(f"n{i}", cpu, 256_000, devices))
    a10 = frozenset({"A10"})
    shapes = [(30_000, 1, 500, None), (4_000, 1, 1000, a10), (1_000, 2, 1000, None), (8_000, 1, 250, None)]
    shapes.append((60_000, 1, 1000, None))
    chosen = [
        trace.TracePod(f"p{i}", cpu, 1_000, gpus, milli, models)
        for i, (cpu, gpus, milli, models) in enumerate(rng.choices(shapes, k=pods))
    ]
    return trace.Trace("mixed", tuple(specs), tuple(chosen))


@pytest.mark.parametrize("seed", [4, 25])
def test_with_a_policy_that_reads_the_whole_cluster_the_answer_is_probed(seed: int) -> None:
    """fgd-stranding's scores read the whole cluster's CPU per GPU and its GPUs per model, so dropping the
    nodes a passing probe left empty changes its decisions: the search took that shorter prefix as passing
    unprobed, and the plan reported a cluster on which the pods do not all place."""
    prepared = planner.prepare(
        mixed_cluster(seed),
        Settings(policy="fgd-stranding", strategies=("whole-gpu",), timed=False, workers=1),
    )
    run = planner.run_static(prepared, "whole-gpu", 42)
    strategy = prepared.strategy("whole-gpu", 42)
    cluster = inputs.NodeSequence(prepared.nodes, 42).prefix(run.needed.nodes)
    assert search.probe(strategy, cluster, inputs.pod_order(prepared.pods, 42))[0].passed
