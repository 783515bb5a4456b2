"""Random histories of odd clusters for every policy at once: GPUs of mixed sizes and health, nodes that
guarantee compute, sm-sharing shares with caps and fault domains, multi-container pods (`exact`), node
redefinitions that widen the state, and workload changes. After each step: every policy's placement is
accepted by `apply` and keeps the invariants, a policy's warm memos decide as a fresh policy does, and
defrag, preemption and tidy plans leave the state as found and can be carried out.

`test_stateful` drives one policy with simpler pods and checks the bookkeeping; this one looks for what the
policies, the planners and the memos get wrong together."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import GpuSpec, NodeSpec, Placement, PodDemand, Unschedulable
from gpufrac.cluster.state import ClusterState
from gpufrac.contract.model import ComputeMode, Mebibytes, Portion, ShareRequest, WholeGpuRequest
from gpufrac.placement.defrag import plan_room, tidy
from gpufrac.placement.engine import decide
from gpufrac.placement.framework import POLICIES, Policy, PolicyContext
from gpufrac.placement.preemption import plan_eviction
from gpufrac.placement.workload import Workload

from ..cluster.builders import assert_same, snapshot

NAMES = [f"n{i}" for i in range(6)]
MODELS = ["T4", "A100", "H100"]
SIZES = [1, 7, *[16_000, 24_576, 40_000, 81_920] * 4]  # mostly real GPUs, some almost without memory
ALLOWED = [None, None, None, frozenset({"T4"}), frozenset({"V100"}), frozenset(MODELS)]


@st.composite
def nodes(draw: st.DrawFn) -> NodeSpec:
    name = draw(st.sampled_from(NAMES))
    count = draw(st.sampled_from([0, 1, 2, 3, 4, 8, 9]))
    model = draw(st.sampled_from(MODELS))
    mixed = draw(st.booleans())
    base = draw(st.sampled_from(SIZES))
    gpus = tuple(
        GpuSpec(
            i,
            f"{name}-{i}",
            model,
            draw(st.sampled_from(SIZES)) if mixed else base,
            healthy=draw(st.booleans()) or draw(st.booleans()),
        )
        for i in range(count)
    )
    return NodeSpec(
        name,
        cpu_milli=draw(st.sampled_from([0, 4_000, 16_000, 64_000, 64_000, 64_000])),
        memory_mib=draw(st.sampled_from([0, 64_000, 64_000, 64_000])),
        gpus=gpus,
        compute_guarantee=draw(st.booleans()),
    )


@st.composite
def share(draw: st.DrawFn, container: str) -> ShareRequest:
    if draw(st.booleans()):
        request = draw(st.sampled_from([1, 90_000]) | st.integers(1, 20_000))
        limit = request + draw(st.sampled_from([0, 0, 1, 5_000, 50_000]))
        req, lim = Mebibytes(request), Mebibytes(limit)
    else:
        milli = draw(st.integers(1, 999))
        limit = min(1000, milli + draw(st.sampled_from([0, 0, 1, 300, 999])))
        req, lim = Portion(Fraction(milli, 1000)), Portion(Fraction(limit, 1000))
    mode = draw(st.sampled_from(list(ComputeMode)))
    cap = draw(st.sampled_from([None, 1, 30, 50, 100])) if mode is ComputeMode.SM_SHARING else None
    return ShareRequest(container, req, lim, mode, draw(st.sampled_from([1, 1, 2, 3])), cap)


@st.composite
def pods(draw: st.DrawFn) -> PodDemand:
    kind = draw(st.sampled_from(["cpu", "whole", "share", "share", "multi", "mixed", "wholes"]))
    whole: tuple[WholeGpuRequest, ...] = ()
    if kind in ("whole", "mixed"):
        whole = (WholeGpuRequest("w", draw(st.integers(1, 3))),)
    if kind == "wholes":
        whole = (WholeGpuRequest("w", draw(st.integers(1, 2))), WholeGpuRequest("v", draw(st.integers(1, 2))))
    count = {"share": 1, "multi": draw(st.integers(2, 3)), "mixed": 1}.get(kind, 0)
    return PodDemand(
        name="",
        cpu_milli=draw(st.sampled_from([0, 0, 1_000, 1_000, 8_000, 70_000])),
        memory_mib=draw(st.sampled_from([0, 0, 4_096, 70_000])),
        whole=whole,
        shares=tuple(draw(share(f"c{i}")) for i in range(count)),
        models=draw(st.sampled_from(ALLOWED)),
        fault_domain=draw(st.sampled_from(["", "a", "b"])),
        priority=draw(st.integers(0, 3)),
    )


WORKLOAD_PODS = st.lists(pods(), min_size=0, max_size=6)


def carry_out(state: ClusterState, leaving: Iterable[str], arriving: Iterable[Placement]) -> None:
    """On a copy of `state`: `leaving` released, then `arriving` applied; the invariants must hold."""
    copy = state.without(())
    for name in leaving:
        copy.release(name)
    for placement in arriving:
        copy.apply(placement)
    assert violations(copy) == []


class OddClusters(RuleBasedStateMachine):
    @initialize(
        seed=st.integers(0, 2**16),
        work=WORKLOAD_PODS,
        ranks=st.booleans(),
        first=st.lists(nodes(), min_size=2, max_size=5),
    )
    def start(self, seed: int, work: list[PodDemand], ranks: bool, first: list[NodeSpec]) -> None:
        self.state = ClusterState()
        for spec in first:
            self.state.add_node(spec)
        self.workload = Workload.from_pods(work, max_shapes=4)
        self.seed = seed
        self.ranks = ranks
        self.policies = {name: POLICIES[name](self.context()) for name in POLICIES}
        self.counter = 0
        self.demands: dict[str, PodDemand] = {}

    def context(self) -> PolicyContext:
        return PolicyContext(rng=np.random.default_rng(self.seed), workload=self.workload)

    def any_policy(self, data: st.DataObject) -> Policy:
        return self.policies[data.draw(st.sampled_from(sorted(POLICIES)))]

    def fresh(self) -> str:
        self.counter += 1
        return f"p{self.counter}"

    @rule(node=nodes())
    def add_node(self, node: NodeSpec) -> None:
        row = self.state.index.get(node.name)
        if row is not None and self.state.pods_on[row]:
            for p in self.state.remove_node(node.name):
                self.demands.pop(p.pod, None)
        self.state.add_node(node)
        if self.ranks:
            self.state.tie_rank[:] = np.random.default_rng(self.counter).permutation(len(self.state.tie_rank))

    @precondition(lambda self: self.state.names)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.state.names))
        for p in self.state.remove_node(name):
            self.demands.pop(p.pod, None)

    @precondition(lambda self: self.state.names)
    @rule(data=st.data(), healthy=st.booleans())
    def set_health(self, data: st.DataObject, healthy: bool) -> None:
        """Any GPU, or one that holds a pod: the planners must put back a pod whose GPU failed under it."""
        held = [
            (placement.node, gpu)
            for placement in self.state.placements.values()
            for assignment in placement.assignments
            for gpu in assignment.gpus
        ]
        if held and data.draw(st.booleans()):
            node, gpu = data.draw(st.sampled_from(sorted(held)))
            self.state.set_gpu_health(node, gpu, healthy=healthy)
            return
        row = data.draw(st.sampled_from(range(len(self.state.names))))
        if self.state.active[row] and self.state.gpu_count[row]:
            gpu = data.draw(st.integers(0, int(self.state.gpu_count[row]) - 1))
            self.state.set_gpu_health(self.state.names[row], gpu, healthy=healthy)

    @rule(work=WORKLOAD_PODS)
    def change_workload(self, work: list[PodDemand]) -> None:
        self.workload = Workload.from_pods(work, max_shapes=4)
        self.policies = {name: POLICIES[name](self.context()) for name in POLICIES}

    def rows(self, data: st.DataObject) -> np.ndarray | None:
        if data.draw(st.booleans()):
            return None
        active = np.flatnonzero(self.state.active)
        keep = data.draw(st.lists(st.booleans(), min_size=len(active), max_size=len(active)))
        return active[np.array(keep, bool)] if len(active) else active

    @rule(template=pods(), data=st.data())
    def place(self, template: PodDemand, data: st.DataObject) -> None:
        """A few pods of one kind, each decided by every policy, warm and cold; one policy's choice stays."""
        for _ in range(data.draw(st.integers(1, 4))):
            self.place_one(dataclasses.replace(template, name=self.fresh()), data)

    def place_one(self, pod: PodDemand, data: st.DataObject) -> None:
        rows = self.rows(data)
        chosen = data.draw(st.sampled_from(sorted(POLICIES)))
        applied = None
        for name, warm in self.policies.items():
            outcome = decide(self.state, pod, warm, rows=rows)
            if POLICIES[name].deterministic:
                cold = decide(self.state, pod, POLICIES[name](self.context()), rows=rows)
                assert cold == outcome, (name, cold, outcome)
            if isinstance(outcome, Placement):
                if rows is not None:
                    assert self.state.index[outcome.node] in rows
                self.state.apply(outcome)
                assert violations(self.state) == []
                self.state.release(outcome.pod)
                if name == chosen:
                    applied = outcome
            else:
                assert isinstance(outcome, Unschedulable)
        if applied is not None:
            self.state.apply(applied)
            self.demands[applied.pod] = pod

    @precondition(lambda self: self.state.placements)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        pod = data.draw(st.sampled_from(sorted(self.state.placements)))
        self.state.release(pod)
        self.demands.pop(pod, None)

    @precondition(lambda self: self.state.placements)
    @rule(pod=pods(), data=st.data())
    def make_room(self, pod: PodDemand, data: st.DataObject) -> None:
        pod = dataclasses.replace(pod, name=self.fresh())
        policy = self.any_policy(data)
        movable = {n: d for n, d in self.demands.items() if not d.whole and data.draw(st.booleans())}
        before = snapshot(self.state)
        room = plan_room(self.state, pod, policy, movable=movable, max_moves=data.draw(st.integers(0, 3)))
        assert_same(before, snapshot(self.state))
        assert violations(self.state) == []
        if room is not None:
            assert all(move.source.pod in movable for move in room.moves)
            sources = [move.source.pod for move in room.moves]
            carry_out(self.state, sources, [*(move.target for move in room.moves), room.placement])

    @precondition(lambda self: self.state.placements)
    @rule(pod=pods(), data=st.data())
    def evict(self, pod: PodDemand, data: st.DataObject) -> None:
        pod = dataclasses.replace(pod, name=self.fresh())
        policy = self.any_policy(data)
        victims = {n: d.priority for n, d in self.demands.items() if data.draw(st.booleans())}
        before = snapshot(self.state)
        most = data.draw(st.integers(1, 4))
        plan = plan_eviction(self.state, pod, policy, victims=victims, max_victims=most)
        assert_same(before, snapshot(self.state))
        if plan is not None:
            assert set(plan.victims) <= victims.keys()
            carry_out(self.state, plan.victims, [plan.placement])

    @precondition(lambda self: self.state.placements)
    @rule(data=st.data())
    def tidy_up(self, data: st.DataObject) -> None:
        policy = self.any_policy(data)
        movable = {n: d for n, d in self.demands.items() if not d.whole}
        before = snapshot(self.state)
        moves = tidy(self.state, policy, self.workload, movable=movable, max_moves=3)
        assert_same(before, snapshot(self.state))
        for move in moves:  # one by one: a later move may take what an earlier one left
            carry_out(self.state, [move.source.pod], [move.target])
            self.state.release(move.source.pod)
            self.state.apply(move.target)

    @invariant()
    def sound(self) -> None:
        assert violations(self.state) == []
        usable = np.where(self.state.open_gpus(), self.state.free_milli(), 0)
        assert np.array_equal(self.state.usable_free_milli(), usable)


TestOddClusters = OddClusters.TestCase
TestOddClusters.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)
