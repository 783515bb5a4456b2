"""Random sequences of node changes, placements and releases, for every policy: no invariant ever breaks.

After every step the invariants are recomputed from the placements alone, and `ClusterState`'s running
totals must agree with that recomputation. The engine must never propose a placement that `apply` refuses,
and an arbitrary (possibly invalid) placement is either refused with nothing changed or keeps every
invariant.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from gpufrac.cluster.invariants import violations
from gpufrac.cluster.model import Assignment, GpuSpec, NodeSpec, Placement, PodDemand, Unschedulable
from gpufrac.cluster.state import MODE_CODE, ClusterState, PlacementRefused
from gpufrac.contract.model import (
    ComputeMode,
    Mebibytes,
    MemoryAmount,
    Portion,
    ShareRequest,
    WholeGpuRequest,
)
from gpufrac.placement.engine import decide
from gpufrac.placement.filters import FILTERS, Candidates
from gpufrac.placement.fit import find_fit, fit_memo, verdict_memo
from gpufrac.placement.framework import POLICIES, PerNode, PolicyContext
from gpufrac.placement.workload import Workload

NODE_NAMES = [f"node-{i}" for i in range(5)]
MODELS = ["T4", "A100"]

# Other resources (`Scalars`): a node offers some of them, a pod asks for some, in every combination.
FPGA, DISK = "example.com/fpga", "ephemeral-storage"
scalars = st.sampled_from([(), ((FPGA, 1),), ((DISK, 30_000),), ((DISK, 30_000), (FPGA, 2))])

nodes = st.builds(
    lambda name, gpus, memory, model, cpu, healthy, max_pods, offered: NodeSpec(
        name,
        cpu_milli=cpu,
        memory_mib=64_000,
        gpus=tuple(
            GpuSpec(i, f"{name}-{i}", model, memory, healthy=(i != 0 or healthy)) for i in range(gpus)
        ),
        max_pods=max_pods,
        scalars=tuple((resource, 2 * amount) for resource, amount in offered),
    ),
    st.sampled_from(NODE_NAMES),
    st.integers(0, 4),
    st.sampled_from([16_000, 24_576, 40_000]),
    st.sampled_from(MODELS),
    st.sampled_from([4_000, 16_000, 64_000]),
    st.booleans(),
    st.sampled_from([None, 0, 2, 110]),
    scalars,
)

amounts: st.SearchStrategy[MemoryAmount] = st.one_of(
    st.integers(1, 41_000).map(Mebibytes),
    st.integers(1, 999).map(lambda milli: Portion(Fraction(milli, 1000))),
)


@st.composite
def shares(draw: st.DrawFn, container: str) -> ShareRequest:
    request = draw(amounts)
    limit = request
    if draw(st.booleans()):
        if isinstance(request, Mebibytes):
            limit = Mebibytes(request.value + draw(st.integers(0, 8_000)))
        else:
            limit = Portion(min(Fraction(1), request.value + Fraction(draw(st.integers(0, 500)), 1000)))
    return ShareRequest(
        container,
        request=request,
        limit=limit,
        mode=draw(st.sampled_from(list(ComputeMode))),
        num_devices=draw(st.integers(1, 2)),
    )


@st.composite
def pods(draw: st.DrawFn) -> PodDemand:
    kind = draw(st.sampled_from(["cpu", "whole", "share", "multi", "mixed"]))
    whole = draw(st.integers(1, 3)) if kind in ("whole", "mixed") else 0
    count = {"share": 1, "multi": 2, "mixed": 1}.get(kind, 0)
    return PodDemand(
        name="",  # named by the machine, which knows which names are taken
        cpu_milli=draw(st.sampled_from([0, 1_000, 8_000])),
        memory_mib=draw(st.sampled_from([0, 4_096, 32_768])),
        whole=(WholeGpuRequest("main", whole),) if whole else (),
        shares=tuple(draw(shares(f"c{i}")) for i in range(count)),
        models=draw(st.sampled_from([None, frozenset({"T4"}), frozenset(MODELS)])),
        scalars=draw(scalars),
    )


WORKLOAD = Workload.from_pods(
    [
        PodDemand(
            "a",
            cpu_milli=1_000,
            shares=(ShareRequest("c", Portion(Fraction(1, 2)), Portion(Fraction(1, 2))),),
        ),
        PodDemand("b", cpu_milli=8_000, whole=(WholeGpuRequest("main", 1),)),
        PodDemand("c", cpu_milli=1_000),
    ]
)


def recomputed_totals(state: ClusterState) -> dict[str, np.ndarray]:
    """The arrays `apply`/`release` maintain, rebuilt from scratch from the placements."""
    free = state.gpu_mem.copy()
    modes = np.zeros_like(state.gpu_mode)
    tenants = np.zeros_like(state.gpu_tenants)
    cpu, memory = state.cpu_cap.copy(), state.mem_cap.copy()
    left = {f"scalar {name}": cap.copy() for name, cap in state.scalar_cap.items()}
    for placement in state.placements.values():
        row = state.index[placement.node]
        cpu[row] -= placement.cpu_milli
        memory[row] -= placement.memory_mib
        for name, amount in placement.scalars:
            left[f"scalar {name}"][row] -= amount
        for assignment in placement.assignments:
            for gpu in assignment.gpus:
                tenants[row, gpu] += 1
                if assignment.mode is None:
                    free[row, gpu] = 0
                else:
                    free[row, gpu] -= assignment.request_mib
                    modes[row, gpu] = MODE_CODE[assignment.mode]
    return {
        "gpu_free": free,
        "gpu_mode": modes,
        "gpu_tenants": tenants,
        "cpu_free": cpu,
        "mem_free": memory,
        **left,
    }


def kept_total(state: ClusterState, key: str) -> np.ndarray:
    """The running total `recomputed_totals` names `key`."""
    if key.startswith("scalar "):
        return state.scalar_free[key.removeprefix("scalar ")]
    return np.asarray(getattr(state, key))


class EngineMachine(RuleBasedStateMachine):
    policy_name = ""  # set per policy below

    @initialize(seed=st.integers(0, 2**16))
    def start(self, seed: int) -> None:
        self.state = ClusterState()
        context = PolicyContext(rng=np.random.default_rng(seed), workload=WORKLOAD)
        self.policy = POLICIES[self.policy_name](context)
        self.names = iter(range(10**9))
        self.fits = fit_memo()
        self.verdicts = verdict_memo()

    def fresh_name(self) -> str:
        return f"pod-{next(self.names)}"

    @rule(node=nodes)
    def add_node(self, node: NodeSpec) -> None:
        row = self.state.index.get(node.name)
        if row is not None and self.state.pods_on[row]:
            self.state.remove_node(node.name)
        self.state.add_node(node)

    @precondition(lambda self: self.state.names)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(self.state.names))
        released = self.state.remove_node(name)
        assert all(placement.node == name for placement in released)
        assert not any(placement.node == name for placement in self.state.placements.values())

    @precondition(lambda self: self.state.names)
    @rule(data=st.data(), healthy=st.booleans())
    def set_health(self, data: st.DataObject, healthy: bool) -> None:
        row = data.draw(st.sampled_from([r for r, active in enumerate(self.state.active) if active] or [0]))
        if self.state.gpu_count[row]:
            gpu = data.draw(st.integers(0, int(self.state.gpu_count[row]) - 1))
            self.state.set_gpu_health(self.state.names[row], gpu, healthy=healthy)

    @rule(pod=pods())
    def place(self, pod: PodDemand) -> None:
        self.check_memo(pod)
        self.check_scores(pod)
        outcome = decide(self.state, dataclasses.replace(pod, name=self.fresh_name()), self.policy)
        if isinstance(outcome, Placement):
            self.state.apply(outcome)  # the engine never proposes what apply refuses
            assert outcome.node in self.state.names
        else:
            assert isinstance(outcome, Unschedulable)
            assert sum(outcome.reasons.values()) <= int(self.state.active.sum())

    def check_scores(self, pod: PodDemand) -> None:
        """A policy's scores, kept per node since many changes ago, are what a policy new to this cluster
        gives, scoring every node afresh (a random policy draws its scores, so only the others)."""
        if not POLICIES[self.policy_name].deterministic:
            return
        fit = find_fit(self.state, pod)
        if len(fit.rows):
            fresh = POLICIES[self.policy_name](PolicyContext(rng=np.random.default_rng(0), workload=WORKLOAD))
            scorer = fresh.scorer.scorer if isinstance(fresh.scorer, PerNode) else fresh.scorer
            kept = self.policy.scorer.score(self.state, fit)
            assert np.array_equal(kept, scorer.score(self.state, fit))

    def check_memo(self, pod: PodDemand) -> None:
        """The filters' memo, last used many changes ago, gives what filtering every node afresh gives."""
        fast = find_fit(self.state, pod, memo=self.fits, verdicts=self.verdicts)
        slow = find_fit(self.state, pod)
        assert list(fast.rejected.items()) == list(slow.rejected.items())
        assert np.array_equal(fast.rows, slow.rows)
        # The feasible nodes are those every filter that applies passes, whatever shortcut finds them.
        rows = self.state.active_rows()
        every = Candidates(self.state, pod, rows)
        passed = np.logical_and.reduce([f.passes(every) for f in FILTERS if f.applies(pod)])
        assert np.array_equal(slow.rows, rows[passed])
        assert sum(slow.rejected.values()) == len(rows) - len(slow.rows)
        everywhere = slow.on(slice(None))
        assert np.array_equal(fast.usable(slice(None)), everywhere.usable)  # as the memo keeps it
        for at in range(len(fast.rows)):  # one node's arrays, as pickers ask for them, are the same
            assert np.array_equal(fast.usable(at), everywhere.usable[at])
            for name in ("share_ok", "empty", "request_mib", "limit_mib"):
                assert np.array_equal(getattr(fast.on(at), name), getattr(everywhere, name)[at]), name

    @precondition(lambda self: self.state.names)
    @rule(data=st.data())
    def arbitrary_placement(self, data: st.DataObject) -> None:
        """A placement made up without the engine: refused with nothing changed, or sound."""
        node = data.draw(st.sampled_from(self.state.names))
        gpus = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
        mode = data.draw(st.sampled_from([None, *ComputeMode]))
        request = data.draw(st.integers(0, 45_000))
        limit = request + data.draw(st.integers(-10, 5_000))
        placement = Placement(
            pod=self.fresh_name(),
            node=node,
            cpu_milli=data.draw(st.sampled_from([0, 2_000, 70_000])),
            assignments=(Assignment("main", tuple(gpus), request, limit, mode),),
            scalars=data.draw(scalars),
        )
        before = recomputed_totals(self.state)
        try:
            self.state.apply(placement)
        except PlacementRefused:
            after = recomputed_totals(self.state)
            assert all(np.array_equal(before[key], after[key]) for key in before)

    @precondition(lambda self: self.state.placements)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        pod = data.draw(st.sampled_from(sorted(self.state.placements)))
        self.state.release(pod)

    @invariant()
    def invariants_hold(self) -> None:
        assert violations(self.state) == []

    @invariant()
    def bookkeeping_matches(self) -> None:
        expected = recomputed_totals(self.state)
        active = self.state.active
        for key, array in expected.items():
            assert np.array_equal(kept_total(self.state, key)[active], array[active]), key
        usable = np.where(self.state.open_gpus(), self.state.free_milli(), 0)
        assert np.array_equal(self.state.usable_free_milli(), usable)  # the memo agrees with a fresh count


def stateful_test(policy: str) -> type:
    machine = type(f"EngineMachine_{policy}", (EngineMachine,), {"policy_name": policy})
    test: type = machine.TestCase
    test.settings = settings(
        max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    return test


# One test per policy, so every policy is driven through the same kind of random sequences.
globals().update({f"TestEngine_{name}": stateful_test(name) for name in sorted(POLICIES)})
