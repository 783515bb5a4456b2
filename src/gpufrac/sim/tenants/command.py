"""`gpufrac simulate --tenants FILE`: deal the trace to the file's queues, replay it in time with a progress
bar, then print the fairness figures and write the report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from gpufrac.sim import output, trace
from gpufrac.sim.tenants import config, deal, figures, replay, report


def run(
    *,
    tenants: Path,
    nodes: Path | None,
    pods: Path | None,
    policy: str,
    seed: int,
    out: Path | None,
    output_format: str,
) -> None:
    rules = config.load(tenants)
    loaded = trace.load(nodes, pods)
    dealt = deal.deal(loaded, rules, seed)
    console = Console(stderr=True)
    with output.progress(console, "replaying", transient=output_format == "json") as progress:
        task = progress.add_task(
            f"{loaded.name}: {len(rules.leaves)} queues, pods arrived", total=len(dealt.pods)
        )
        result = replay.replay(
            dealt,
            rules,
            policy=policy,
            seed=seed,
            on_arrival=lambda done, _: progress.update(task, completed=done),
        )
    document = summary(loaded.name, rules, policy, seed, dealt, result)
    output.deliver(
        document,
        table=report.table,
        write=lambda folder, written: report.write(folder, written, result),
        out=out,
        output_format=output_format,
        console=console,
    )


def summary(
    name: str,
    rules: config.TenantsConfig,
    policy: str,
    seed: int,
    dealt: deal.Dealt,
    result: replay.TenantRun,
) -> dict[str, Any]:
    """The JSON document: what was replayed, under which rules, and each queue's figures."""
    return {
        "trace": name,
        "config": str(rules.path),
        "seed": seed,
        "policy": policy,
        "nodes": result.nodes,
        "gpus": result.gpus,
        "pods": len(dealt.pods),
        "days": round((result.end - float(result.times[0])) / report.DAY, 2) if result.times.size else 0.0,
        "rounds": result.rounds,
        "rules": {
            "min_runtime_seconds": rules.eviction.min_runtime,
            "grace_seconds": rules.eviction.grace,
            "max_victims": rules.eviction.max_victims,
            "gangs": {
                "fraction": rules.gangs.fraction,
                "size": rules.gangs.size,
                "timeout_seconds": rules.gangs.timeout,
            },
        },
        "queues": figures.summarize(result, rules),
    }
