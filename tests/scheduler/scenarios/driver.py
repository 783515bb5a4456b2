"""Scenario tables for the scheduler's multi-tenant decisions, in the manner of KAI Scheduler's scenario
tests: queues, nodes, running pods, pod groups and pending pods in; which pods bind (and where), which are
evicted (and why), and which wait (and what they are told) out.

A table is data (`Scenario`s). `check` plays one against a real `Scheduler` on a fake API server, as the
scheduler runs in a cluster: it lists the nodes, Queues, PodGroups and pods, then runs scheduling rounds,
between which the clock moves on `TICK` seconds and the watch reports what the round did (bound pods start
running, evicted pods are gone), until a round changes nothing. So every decision is the one the scheduler
makes, not the one a unit under it would make: the order of queues, the eviction plan, the room kept, the
gang held. Time is the scenario's too: pods age `TICK` seconds a round (the minimum runtime, gang timeouts).
Evicted pods are not recreated; where their controller's replacement matters, a scenario lists it as a pod
that arrives later.

Units are the scenario's: GPU memory in MiB (GPUs of `GPU_MIB` unless a node says otherwise), whole GPUs as a
count, times in seconds. Queue and PodGroup specs are written as the API objects' `spec` (`gpus: {quota: 1,
overQuotaWeight: 2, limit: 3}`, `parentQueue`, `minMember`), so they read as the manifests would.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufrac import contract
from gpufrac.contract import keys, podgroups, queues
from gpufrac.scheduler.config import SchedulerConfig
from gpufrac.scheduler.loop import Scheduler
from gpufrac.scheduler.mover import MOVE, PREEMPT, RECLAIM
from gpufrac.scheduler.queue import SchedulingQueue

from ...kubeapi.apiobjects import NAMESPACE, container, inventory, key, node, pod
from ...kubeapi.fakeapi import FakeApi, FakeClock, api_error

GPU_MIB = 10_000
TS, SM = contract.ComputeMode.TIME_SLICING.value, contract.ComputeMode.SM_SHARING.value
HOSTNAME, ZONE = "kubernetes.io/hostname", "topology.kubernetes.io/zone"
ANY = "*"  # binds somewhere
PREEMPTED, RECLAIMED, MOVED = PREEMPT.reason, RECLAIM.reason, MOVE.reason
EPOCH = 1_714_564_800.0  # 2024-05-01T12:00:00Z, the wall clock when a scenario starts
# Between rounds: past the longest a parked pod waits (a 30 s backoff, then 60 s without news), so each round
# tries every pod that waits.
TICK = 91.0
MOST_ROUNDS = 20
# The controller of a pod that may be moved (a bare pod would be lost).
OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": True}
# The scheduler as the chart runs it, with queues and gangs on; a scenario's `settings` change it.
DEFAULTS: Mapping[str, Any] = {"queues": True, "gangs": True}


@dataclass(frozen=True)
class Node:
    """A node with `gpus` GPUs of `mib` MiB each, its agent ready."""

    gpus: int = 1
    mib: int = GPU_MIB  # each GPU's memory
    cpu: str = "16"
    mem: str = "64Gi"
    cordoned: bool = False
    zone: str = ""  # its `topology.kubernetes.io/zone` label, if any (every node has its hostname's)


@dataclass(frozen=True)
class Neighbourly:
    """What a pod says of the pods around it, each a label `key=value`: its own `labels`, a required
    `anti`-affinity and `affinity` to pods so labelled (on the same node, or in the same zone with
    `by_zone`), and a `spread` of pods so labelled over nodes (maxSkew 1, DoNotSchedule)."""

    labels: str = ""  # comma-separated
    anti: str = ""
    affinity: str = ""
    spread: str = ""
    by_zone: bool = False


@dataclass(frozen=True)
class Run:
    """A pod running when the scenario starts. `on` is `node:gpu[,gpu...]` (or `node` for a pod without
    GPUs): with `mib`, a share of that much on each GPU named; without, those GPUs whole."""

    on: str
    mib: int | None = None
    queue: str = ""
    priority: int = 0
    age: float = 3600.0  # seconds it has been running
    mode: str = TS
    group: str = ""
    cpu: str = "100m"
    mem: str | None = None
    budget: bool = False  # a PodDisruptionBudget refuses its eviction
    terminating: bool = False  # being deleted: it holds what it holds until gone
    overdue: float = 0.0  # with `terminating`, seconds since it was to be gone (its deletionTimestamp)
    movable: bool = False  # its tenant consented to moves, and a controller recreates it
    scheduler: str = "gpufrac"
    rules: Neighbourly = Neighbourly()


@dataclass(frozen=True)
class Ask:
    """A pod to schedule: a share of `mib` on `devices` GPUs, or `gpus` whole GPUs, or neither. Pods are
    created in table order, in round `arrives` (0: before the scheduler starts)."""

    mib: int | None = None
    gpus: int = 0
    devices: int = 1
    queue: str = ""
    priority: int = 0
    mode: str = TS
    group: str = ""
    cpu: str = "100m"
    mem: str | None = None
    arrives: int = 0
    never_preempts: bool = False  # `preemptionPolicy: Never`
    unreadable: bool = False  # a topology spread constraint the API server would refuse (maxSkew 0)
    rules: Neighbourly = Neighbourly()


@dataclass(frozen=True)
class Scenario:
    """One table row. `binds`: pod -> `node`, `node:gpu[,gpu...]` or `ANY`; `evicted`: pod -> `PREEMPTED`,
    `RECLAIMED` or `MOVED`; `waiting`: pod -> a part of one of the messages it was given ("" for any).
    Every pending pod is in `binds` or `waiting`; a running pod not in `evicted` must stay. `rounds`: play
    exactly that many (for timeouts), instead of until a round changes nothing."""

    name: str
    nodes: Mapping[str, Node]
    pending: Mapping[str, Ask]
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    groups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    running: Mapping[str, Run] = field(default_factory=dict)
    binds: Mapping[str, str] = field(default_factory=dict)
    evicted: Mapping[str, str] = field(default_factory=dict)
    waiting: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    rounds: int | None = None
    xfail: str = ""  # a known bug: the reason, for xfail(strict=True)


def pods(prefix: str, count: int, **ask: Any) -> dict[str, Ask]:
    """`count` pods alike, `<prefix>1` to `<prefix><count>`, created in that order."""
    return {f"{prefix}{i}": Ask(**ask) for i in range(1, count + 1)}


def cases(scenarios: Iterable[Scenario]) -> list[Any]:
    """One test id per scenario, named by it."""
    found = []
    for scenario in scenarios:
        marks = [pytest.mark.xfail(strict=True, reason=scenario.xfail)] if scenario.xfail else []
        found.append(pytest.param(scenario, id=scenario.name, marks=marks))
    names = [case.id for case in found]
    assert len(names) == len(set(names)), "scenario names must be distinct"
    return found


@dataclass
class ScenarioApi(FakeApi):
    """The fake API server, also taking Evictions (429 for a pod under a budget), and keeping what the
    scheduler told each pod: the reasons of the eviction Events, and its PodScheduled messages."""

    budgets: set[str] = field(default_factory=set)
    evicting: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)
    messages: dict[str, list[str]] = field(default_factory=dict)

    async def create(
        self, obj: Any, name: str | None = None, *, namespace: str | None = None, dry_run: bool = False
    ) -> Any:
        kind = obj.kind or type(obj).__name__
        if kind == "Eviction":
            self._record("create", kind, name, obj, dry_run=dry_run)
            if name in self.budgets:
                raise api_error(429, "TooManyRequests", "Cannot evict pod as it would violate the budget")
            if not dry_run:
                self.evicting.append(name or "")
            return obj
        if kind == "Event" and obj.reason in (PREEMPTED, RECLAIMED, MOVED):
            self.reasons.setdefault(obj.involvedObject.name, obj.reason)
        return await super().create(obj, name, namespace=namespace, dry_run=dry_run)

    async def patch(self, resource: type[Any], name: str, obj: Any, **settings: Any) -> None:
        await super().patch(resource, name, obj, **settings)
        for condition in obj.get("status", {}).get("conditions", []):
            self.messages.setdefault(name, []).append(condition.get("message", ""))


async def check(scenario: Scenario) -> None:
    """Play the scenario and compare what happened with what it expects, as one dict (a readable diff)."""
    _consistent(scenario)
    api, made = await play(scenario)
    bound = {
        name: _where(made, body)
        for (kind, _, name), body in api.objects.items()
        if kind == "Pod" and name in scenario.pending and body["spec"].get("nodeName")
    }
    got = {
        "binds": {name: _as_expected(at, scenario.binds.get(name)) for name, at in bound.items()},
        "evicted": {name: api.reasons.get(name, "") for name in api.evicting},
        "waiting": {
            name: _told(api.messages.get(name, []), scenario.waiting.get(name))
            for name in scenario.pending
            if name not in bound
        },
    }
    want = {
        "binds": dict(scenario.binds),
        "evicted": dict(scenario.evicted),
        "waiting": dict(scenario.waiting),
    }
    assert got == want


async def play(scenario: Scenario) -> tuple[ScenarioApi, Scheduler]:
    """Run the scheduler on the scenario until a round changes nothing (or for `scenario.rounds`)."""
    clock = FakeClock()
    start = clock.now
    api = ScenarioApi(budgets={name for name, run in scenario.running.items() if run.budget})
    config = SchedulerConfig(**{**DEFAULTS, **scenario.settings})
    made = Scheduler(api, config, queue=SchedulingQueue(clock=clock), clock=clock)
    made.mover.wall_clock = lambda: EPOCH + clock.now - start
    made.on_nodes_listed([_node(name, spec) for name, spec in scenario.nodes.items()])
    if config.queues:
        made.on_queues_listed([_queue(name, spec) for name, spec in scenario.queues.items()])
    if config.gangs:
        made.on_pod_groups_listed([_pod_group(name, spec) for name, spec in scenario.groups.items()])
    created = {name: _pending(name, ask, order) for order, (name, ask) in enumerate(scenario.pending.items())}
    listed = [
        _running(
            name, run, run.queue or scenario.groups.get(run.group, {}).get("queue") or queues.DEFAULT_QUEUE
        )
        for name, run in scenario.running.items()
    ]
    listed += [created[name] for name, ask in scenario.pending.items() if ask.arrives == 0]
    for body in listed:
        api.put(body)
    made.on_pods_listed(listed)
    last_arrival = max((ask.arrives for ask in scenario.pending.values()), default=0)
    seen: tuple[Any, ...] | None = None
    told = set(scenario.running)  # bound pods the watch has reported running
    for round_ in range(scenario.rounds or MOST_ROUNDS):
        for name, ask in scenario.pending.items():
            if ask.arrives == round_ and round_ > 0:
                api.put(created[name])
                made.on_pod_event("ADDED", created[name])
        await made.schedule_pending()
        await made.wait_for_binds()
        _watch(api, made, told, now=EPOCH + clock.now - start)
        clock.advance(TICK)
        state = _state(api, made)
        if scenario.rounds is None and round_ >= last_arrival and state == seen:
            return api, made
        seen = state
    if scenario.rounds is None:
        raise AssertionError(f"still changing after {MOST_ROUNDS} rounds: {seen}")
    return api, made


def _watch(api: ScenarioApi, made: Scheduler, told: set[str], *, now: float) -> None:
    """What the watch reports after a round: pods bound in it now run; pods evicted in it are gone."""
    for (kind, _, name), body in list(api.objects.items()):
        if kind == "Pod" and body["spec"].get("nodeName") and name not in told:
            told.add(name)
            body["status"] = {"phase": "Running", "startTime": _stamp(now)}
            made.on_pod_event("MODIFIED", copy.deepcopy(body))
    for name in api.evicting:
        body = api.objects.pop(("Pod", NAMESPACE, name), None)
        if body is not None:
            made.on_pod_event("DELETED", body)


def _state(api: ScenarioApi, made: Scheduler) -> tuple[Any, ...]:
    """What a round can change: pods bound and evicted, members held, rooms kept, plans under way."""
    held = {uid for gang in made.gangs.gangs.values() for uid in gang.held}
    bound = {
        name
        for (kind, _, name), body in api.objects.items()
        if kind == "Pod" and body["spec"].get("nodeName")
    }
    return (bound, set(api.evicting), held, set(made.cache.kept_rooms), set(made.mover.plans))


# ---- the API objects a scenario stands for ----------------------------------------------------------------


def _node(name: str, spec: Node) -> dict[str, Any]:
    return node(
        name,
        labels={HOSTNAME: name, **({ZONE: spec.zone} if spec.zone else {})},
        gpus=spec.gpus,
        memory=spec.mib,
        cpu=spec.cpu,
        mem=spec.mem,
        cordoned=spec.cordoned,
        agent=inventory(name, spec.gpus, memory=spec.mib),
    )


# A scenario's queue fields that are the Queue's spec's own; the others are its resources.
QUEUE_SPEC_FIELDS = ("parentQueue", "priority", "preemptMinRuntime", "reclaimMinRuntime")


def _queue(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """A Queue: its own fields (`QUEUE_SPEC_FIELDS`) and the resources (gpus, gpuMemory, cpu, memory) as its
    spec has them."""
    own = {key: value for key, value in spec.items() if key in QUEUE_SPEC_FIELDS}
    body = {key: value for key, value in spec.items() if key not in QUEUE_SPEC_FIELDS}
    return {"kind": queues.KIND, "metadata": {"name": name}, "spec": {**own, "resources": body}}


def _pod_group(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": podgroups.KIND, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": dict(spec)}


def _labelled(body: dict[str, Any], queue: str, group: str, rules: Neighbourly) -> dict[str, Any]:
    labels = {queues.QUEUE_LABEL: queue} if queue else {}
    if group:
        labels[podgroups.POD_GROUP_LABEL] = group
    labels.update(_label(pair) for pair in rules.labels.split(",") if pair)
    body["metadata"]["labels"] = labels
    key = ZONE if rules.by_zone else HOSTNAME

    def terms(selector: str) -> list[dict[str, Any]]:
        return [{"labelSelector": {"matchLabels": dict([_label(selector)])}, "topologyKey": key}]

    affinity = {
        kind: {"requiredDuringSchedulingIgnoredDuringExecution": terms(selector)}
        for kind, selector in (("podAntiAffinity", rules.anti), ("podAffinity", rules.affinity))
        if selector
    }
    if affinity:
        body["spec"]["affinity"] = affinity
    if rules.spread:
        body["spec"]["topologySpreadConstraints"] = [
            {
                "maxSkew": 1,
                "topologyKey": key,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": dict([_label(rules.spread)])},
            }
        ]
    return body


def _label(pair: str) -> tuple[str, str]:
    name, _, value = pair.partition("=")
    return name, value


def _running(name: str, run: Run, queue: str) -> dict[str, Any]:
    """A bound pod as the API returns it, with the annotations a bind in `queue` would have written."""
    node_name, _, indices = run.on.partition(":")
    devices = tuple(f"GPU-{node_name}-{index}" for index in indices.split(",") if index)
    if run.mib is not None:
        mode = contract.ComputeMode(run.mode)
        share = contract.SharePlacement("main", devices, run.mib, run.mib, mode)
        placed = contract.PodPlacement(shares=(share,))
        notes = {keys.GPU_MEMORY: f"{run.mib}Mi", keys.container_key("main", keys.COMPUTE_MODE): run.mode}
    else:
        placed = contract.PodPlacement(
            whole=(contract.WholeGpuPlacement("main", devices),) if devices else ()
        )
        notes = {}
    body = pod(
        name,
        annotations=notes,
        containers=[container(cpu=run.cpu, mem=run.mem, whole=0 if run.mib else len(devices))],
        scheduler=run.scheduler,
        node_name=node_name,
        phase="Running",
        priority=run.priority,
        created=_stamp(EPOCH - run.age - 1),
    )
    rendered = contract.render_annotations(placed)
    if rendered:
        rendered[keys.BOUND_UID_ANNOTATION] = key(name)
        rendered[keys.BOUND_QUEUE_ANNOTATION] = queue
    if run.mode == SM and run.mib is not None:
        rendered[keys.FAULT_DOMAIN_ANNOTATION] = NAMESPACE
    body["metadata"]["annotations"].update(rendered)
    body["status"]["startTime"] = _stamp(EPOCH - run.age)
    if run.terminating:
        body["metadata"]["deletionTimestamp"] = _stamp(EPOCH - run.overdue)
    if run.movable:
        body["metadata"]["annotations"][keys.MOVABLE_ANNOTATION] = "true"
        body["metadata"]["ownerReferences"] = [OWNER]
    return _labelled(body, run.queue, run.group, run.rules)


def _pending(name: str, ask: Ask, order: int) -> dict[str, Any]:
    """A pod waiting to be scheduled, created `order` seconds into the scenario's table (ages break ties)."""
    notes: dict[str, str] = {}
    if ask.mib is not None:
        notes[keys.GPU_MEMORY] = f"{ask.mib}Mi"
        notes[keys.container_key("main", keys.COMPUTE_MODE)] = ask.mode
        if ask.devices > 1:
            notes[keys.NUM_DEVICES] = str(ask.devices)
    body = pod(
        name,
        annotations=notes,
        containers=[container(cpu=ask.cpu, mem=ask.mem, whole=ask.gpus)],
        priority=ask.priority,
        created=_stamp(EPOCH + ask.arrives * TICK + order),
    )
    if ask.never_preempts:
        body["spec"]["preemptionPolicy"] = "Never"
    if ask.unreadable:
        body["spec"]["topologySpreadConstraints"] = [{"maxSkew": 0, "topologyKey": "kubernetes.io/hostname"}]
    return _labelled(body, ask.queue, ask.group, ask.rules)


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- outcomes ---------------------------------------------------------------------------------------------


def _where(made: Scheduler, body: Mapping[str, Any]) -> str:
    """`node:gpus` of a bound pod, as the cache holds it."""
    placement = made.cache.state.placements.get(body["metadata"]["uid"])
    gpus = sorted({gpu for a in placement.assignments for gpu in a.gpus}) if placement else []
    node_name = body["spec"]["nodeName"]
    return f"{node_name}:{','.join(map(str, gpus))}" if gpus else node_name


def _as_expected(at: str, expected: str | None) -> str:
    """`at`, as precise as the scenario asked: any node, the node, or the node and its GPUs."""
    if expected == ANY:
        return ANY
    if expected is not None and ":" not in expected:
        return at.partition(":")[0]
    return at


def _told(messages: list[str], expected: str | None) -> str:
    """The part of a message the scenario looks for when one has it, else the last message."""
    if expected is not None and any(expected in message for message in messages):
        return expected
    return messages[-1] if messages else "(no message)"


def _consistent(scenario: Scenario) -> None:
    """Every pending pod has an outcome, and only pods of the scenario are named."""
    decided = set(scenario.binds) | set(scenario.waiting)
    assert decided == set(scenario.pending), "each pending pod binds or waits"
    assert not set(scenario.binds) & set(scenario.waiting), "a pod binds or waits, not both"
    assert set(scenario.evicted) <= set(scenario.running), "only running pods are evicted"
