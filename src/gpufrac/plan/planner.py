"""The whole plan: every strategy × seed searched for GPUs needed and measured, plus the timed replay.

Jobs run in a process pool (each worker receives the inputs once); the result is a plain JSON-ready
summary, which the table, `plan.json`, the charts and `plan.html` are all drawn from.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufrac.cluster.model import NodeSpec, PodDemand
from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.plan import inputs, mig, search, timed
from gpufrac.plan.measures import Measures, measure
from gpufrac.plan.strategies import STRATEGIES, Options, Strategy
from gpufrac.sim import experiment, pool
from gpufrac.sim.trace import Trace, TracePod

ORDER = tuple(STRATEGIES)  # registration order: how `all` runs them and the report lists them
HOURS_PER_MONTH = 730  # 8760 hours a year / 12


# A GPU-hour costs a few currency units; past a million, GPUs x price x 730 hours reaches Infinity, which
# --format json cannot carry (its `Infinity` is not JSON).
MAX_PRICE_PER_GPU_HOUR = 1e6
# Far past any time-slicing config, a replica of the smallest GPU (16 GB) still 16 MiB; past it, a replica
# rounds to 0 MiB and every pod "fits on no node", and an int beyond C's long aborted the run.
MAX_REPLICAS = 1000


@dataclass(frozen=True, slots=True)
class Settings:
    strategies: tuple[str, ...] = ORDER
    seeds: tuple[int, ...] = (42,)
    policy: str = "bestfit"
    replicas: int = 4
    trusted_share: float = 0.5
    fault_domains: int = 8
    price_per_gpu_hour: float = 2.0
    gpu_model: str | None = None
    reference_gb: float | None = None
    timed: bool = True
    workers: int | None = None

    def check(self) -> None:
        if not self.strategies:
            raise UserError("--strategies: name at least one strategy")
        if not self.seeds:
            raise UserError("--seeds: give at least one seed")
        if self.policy not in POLICIES or not POLICIES[self.policy].deterministic:
            known = ", ".join(name for name, kind in POLICIES.items() if kind.deterministic)
            raise UserError(
                f'--policy "{self.policy}": the planner needs a deterministic policy; known: {known}'
            )
        if not 1 <= self.replicas <= MAX_REPLICAS:
            raise UserError(f"--replicas {self.replicas}: must be 1 to {MAX_REPLICAS} replicas per GPU")
        if not 0 <= self.trusted_share <= 1:
            raise UserError(f"--trusted-share {self.trusted_share}: must be a portion between 0 and 1")
        if not 1 <= self.fault_domains <= 10_000:
            raise UserError(f"--fault-domains {self.fault_domains}: must be 1 to 10000 tenants")
        if not 0 <= self.price_per_gpu_hour <= MAX_PRICE_PER_GPU_HOUR:  # NaN fails both
            raise UserError(
                f"--price-per-gpu-hour {self.price_per_gpu_hour}: must be a price, 0 or more, at most "
                f"{MAX_PRICE_PER_GPU_HOUR:g}"
            )
        pool.check_workers(self.workers)


def parse_strategies(text: str) -> tuple[str, ...]:
    """`all`, or known names separated by commas."""
    if text.strip() == "all":
        return ORDER
    return tuple(dict.fromkeys(experiment.parse_names(text, ORDER, option="--strategies")))


@dataclass(frozen=True, slots=True)
class Inputs:
    """What every job needs, prepared once: the cluster and the pods as the strategies receive them."""

    nodes: tuple[NodeSpec, ...]
    pods: tuple[PodDemand, ...]
    times: tuple[TracePod, ...]  # times[i] holds the creation and deletion time of pods[i]
    settings: Settings

    def strategy(self, name: str, seed: int) -> Strategy:
        settings = self.settings
        options = Options(
            pods=self.pods,
            seed=seed,
            policy=settings.policy,
            replicas=settings.replicas,
            trusted_share=settings.trusted_share,
            fault_domains=settings.fault_domains,
        )
        return STRATEGIES[name](options)


def prepare(trace: Trace, settings: Settings) -> Inputs:
    """Check the settings and the trace against each other and build the jobs' inputs; every bad input
    is refused here, before any long work."""
    settings.check()
    if not any(pod.num_gpu for pod in trace.pods):  # else every strategy needs 0 GPUs, or the GPUs of a node
        raise UserError(
            f"the pod list {trace.name} has no pod that asks for a GPU, so there are no GPUs to plan; give "
            "one with GPU pods (num_gpu above 0)"
        )
    if settings.timed:
        timed.require_times(trace.pods)
    nodes = tuple(inputs.retarget(trace.nodes, settings.gpu_model))
    pods = tuple(
        inputs.prepare_pods(
            [pod.demand() for pod in trace.pods],
            reference_gb=settings.reference_gb,
            drop_models=settings.gpu_model is not None,
        )
    )
    prepared = Inputs(nodes, pods, trace.pods, settings)
    for name in settings.strategies:
        search.allocated_per_shape(prepared.strategy(name, settings.seeds[0]), nodes, pods)
    return prepared


@dataclass(frozen=True, slots=True)
class StaticRun:
    strategy: str
    seed: int
    needed: search.Needed
    measures: Measures
    seconds: float
    cpu_seconds: float  # the worker's CPU time: what the job costs on an idle core


@dataclass(frozen=True, slots=True)
class TimedRun:
    strategy: str
    replay: timed.TimedReplay
    seconds: float
    cpu_seconds: float


@dataclass(frozen=True, slots=True)
class Job:
    kind: str  # "static" or "timed"
    strategy: str
    seed: int


def run_static(prepared: Inputs, strategy_name: str, seed: int) -> StaticRun:
    started, cpu = time.perf_counter(), time.process_time()
    strategy = prepared.strategy(strategy_name, seed)
    sequence = inputs.NodeSequence(prepared.nodes, seed)
    needed, packer = search.gpus_needed(
        strategy,
        sequence,
        inputs.pod_order(prepared.pods, seed),
        trim=POLICIES[prepared.settings.policy].scores_alone,
    )
    bought = {
        (node.name, gpu.index): gpu.memory_mib for node in sequence.prefix(needed.nodes) for gpu in node.gpus
    }
    measures = measure(packer.uses(), bought, {pod.name: pod for pod in prepared.pods})
    return StaticRun(
        strategy_name, seed, needed, measures, time.perf_counter() - started, time.process_time() - cpu
    )


def run_timed(prepared: Inputs, strategy_name: str, seed: int) -> TimedRun:
    started, cpu = time.perf_counter(), time.process_time()
    strategy = prepared.strategy(strategy_name, seed)
    cluster = inputs.NodeSequence(prepared.nodes, seed).prefix(len(prepared.nodes))
    replay = timed.replay(strategy.packer(cluster), prepared.times, prepared.pods)
    return TimedRun(strategy_name, replay, time.perf_counter() - started, time.process_time() - cpu)


def _run(prepared: Inputs, job: Job) -> StaticRun | TimedRun:
    if job.kind == "static":
        return run_static(prepared, job.strategy, job.seed)
    return run_timed(prepared, job.strategy, job.seed)


def jobs(settings: Settings) -> list[Job]:
    """The searches first (they take longest), then one timed replay per strategy with the first seed."""
    static = [Job("static", name, seed) for name in settings.strategies for seed in settings.seeds]
    replays = (
        [Job("timed", name, settings.seeds[0]) for name in settings.strategies] if settings.timed else []
    )
    return static + replays


def run(
    prepared: Inputs, *, on_done: Callable[[Job], None] | None = None
) -> tuple[list[StaticRun], list[TimedRun]]:
    static: list[StaticRun] = []
    replays: list[TimedRun] = []
    for job, result in pool.run_jobs(
        prepared, _run, jobs(prepared.settings), workers=prepared.settings.workers
    ):
        if isinstance(result, StaticRun):
            static.append(result)
        else:
            replays.append(result)
        if on_done is not None:
            on_done(job)
    return static, replays


@dataclass
class _Row:
    runs: list[StaticRun] = field(default_factory=list)
    replay: TimedRun | None = None


def summarize(
    trace: Trace, prepared: Inputs, static: Sequence[StaticRun], replays: Sequence[TimedRun]
) -> dict[str, Any]:
    """The JSON document `gpufrac plan --format json` prints and `plan.json` holds."""
    settings = prepared.settings
    rows = {name: _Row() for name in settings.strategies}
    for run in sorted(static, key=lambda run: run.seed):
        rows[run.strategy].runs.append(run)
    for replay in replays:
        rows[replay.strategy].replay = replay
    gpu_models = Counter(gpu.model for node in prepared.nodes for gpu in node.gpus)
    gpu_pods = [pod for pod in prepared.pods if pod.wants_gpu]
    return {
        "trace": trace.name,
        "cluster": {
            "nodes": len(prepared.nodes),
            "gpus": sum(gpu_models.values()),
            "gpu_models": dict(sorted(gpu_models.items())),
        },
        "pods": len(prepared.pods),
        "gpu_pods": len(gpu_pods),
        "settings": {
            "strategies": list(settings.strategies),
            "seeds": list(settings.seeds),
            "policy": settings.policy,
            "replicas": settings.replicas,
            "trusted_share": settings.trusted_share,
            "price_per_gpu_hour": settings.price_per_gpu_hour,
            "hours_per_month": HOURS_PER_MONTH,
            "gpu_model": settings.gpu_model,
            "reference_gb": settings.reference_gb,
            "timed": settings.timed,
        },
        "assumptions": assumptions(prepared),
        "strategies": {name: _strategy_summary(prepared, name, row) for name, row in rows.items()},
    }


def _strategy_summary(prepared: Inputs, name: str, row: _Row) -> dict[str, Any]:
    runs = row.runs
    gpus = [run.needed.gpus for run in runs]
    price = prepared.settings.price_per_gpu_hour

    def mean(field_name: str) -> float | None:
        values = [getattr(run.measures, field_name) for run in runs]
        present = [value for value in values if value is not None]
        return round(statistics.fmean(present), 4) if present else None

    bounds = Counter(run.needed.bound for run in runs)
    summary: dict[str, Any] = {
        "summary": prepared.strategy(name, prepared.settings.seeds[0]).summary,
        "gpus_needed": round(statistics.fmean(gpus), 1),
        "gpus_needed_min": min(gpus),
        "gpus_needed_max": max(gpus),
        "nodes_needed": round(statistics.fmean(run.needed.nodes for run in runs), 1),
        "bound": bounds.most_common(1)[0][0],
        "cost_per_month": round(statistics.fmean(gpus) * price * HOURS_PER_MONTH, 2),
    }
    for field_name in Measures.__dataclass_fields__:
        if field_name != "gpus":
            summary[field_name] = mean(field_name)
    summary["blast_radius_max"] = max(run.measures.blast_radius_max for run in runs)
    summary["oversubscribed_pods"] = round(
        statistics.fmean(run.measures.oversubscribed_pods for run in runs), 1
    )
    summary["seconds"] = round(sum(run.seconds for run in runs), 2)
    summary["cpu_seconds"] = round(sum(run.cpu_seconds for run in runs), 2)
    if row.replay is not None:
        replay = row.replay.replay
        summary["timed"] = {
            "peak_gpus": replay.peak_gpus,
            "peak_time": replay.peak_time,
            "rejected_pods": replay.rejected,
            "seconds": round(row.replay.seconds, 2),
            "cpu_seconds": round(row.replay.cpu_seconds, 2),
            "series": [[round(t, 1), busy] for t, busy in replay.series],
        }
    summary["runs"] = [
        {
            "seed": run.seed,
            "gpus_needed": run.needed.gpus,
            "nodes_needed": run.needed.nodes,
            "bound": run.needed.bound,
            "bound_reason": run.needed.reason,
            "probes": [[probe.nodes, probe.placed, probe.reason] for probe in run.needed.probes],
            "measures": {key: _rounded(value) for key, value in asdict(run.measures).items()},
        }
        for run in runs
    ]
    return summary


def _rounded(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value


def assumptions(prepared: Inputs) -> list[str]:
    """What the numbers rest on, stated at the top of every report."""
    settings = prepared.settings
    models = sorted({node.model for node in prepared.nodes if node.gpus})
    if settings.reference_gb is None:
        memory = (
            "The trace gives no GPU memory sizes, so portions stand for memory: a pod asking for 0.5 GPU "
            "asks for half the memory of whichever GPU it lands on."
        )
    else:
        memory = (
            f"The trace gives no GPU memory sizes; each portion is read as a portion of a "
            f"{settings.reference_gb:g} GB GPU, a fixed amount of memory on any GPU (--reference-gb)."
        )
    if settings.gpu_model is None:
        cluster = (
            f"GPU models are the trace's own ({', '.join(models)}); none of them has MIG, so mig takes whole "
            "GPUs there, as whole-gpu does; --gpu-model asks the same question of another model."
            if not any(model in mig.MIG_MODELS for model in models)
            else f"GPU models are the trace's own ({', '.join(models)})."
        )
    else:
        gb = inputs.GPU_MEMORY_GB[settings.gpu_model]
        cluster = (
            f"Every node's GPUs are replaced by {settings.gpu_model} ({gb} GB; same GPU count, CPU and "
            "memory per node), and pods' GPU-model constraints are dropped (--gpu-model)."
        )
    lines = [
        memory,
        cluster,
        f"All {len(prepared.pods)} pods are placed at once (the trace read as a snapshot, as in Weng et al., "
        "ATC '23), in an order shuffled by the seed. The timed replay uses creation and deletion times "
        "instead, on the trace's own cluster.",
        "GPUs needed: the smallest number of leading nodes of the node list (shuffled by the seed, repeated "
        "when the trace's cluster is too small) on which every pod places; nodes come whole, so their idle "
        "GPUs count, and one node fewer fails.",
        f"Placement: gpufrac's engine with the {settings.policy} policy for every strategy except mig, whose "
        "slot packer scores nodes as bestfit does.",
        f"Cost: GPUs needed × {settings.price_per_gpu_hour:g} per GPU-hour × {HOURS_PER_MONTH} hours a "
        "month, GPUs alone (no hosts, power, licences or staff).",
    ]
    lines += [f"{name}: {prepared.strategy(name, settings.seeds[0]).summary}" for name in settings.strategies]
    return lines
