"""`gpufrac simulate`: load, replay with a progress bar, then print and write the results."""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console

from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.sim import experiment, output, pool, report, trace

# Past a few times the cluster the replay measures nothing new, and its pod list grows without end.
MAX_INFLATION = 10.0


def run(
    *,
    nodes: Path | None,
    pods: Path | None,
    policies: str,
    seeds: str,
    inflation: float,
    workers: int | None,
    out: Path | None,
    output_format: str,
) -> None:
    if not math.isfinite(inflation) or not 0 < inflation <= MAX_INFLATION:
        raise UserError(
            f"--inflation {inflation}: must be a number above 0 and at most {MAX_INFLATION}, such as 1.3 "
            "(the replay creates pods until their requests reach this many times the cluster's GPUs)"
        )
    pool.check_workers(workers)
    chosen = list(POLICIES) if policies == "all" else experiment.parse_policies(policies)
    seed_list = experiment.parse_seeds(seeds)
    loaded = trace.load(nodes, pods)
    console = Console(stderr=True)
    with output.progress(console, "replaying", transient=output_format == "json") as progress:
        task = progress.add_task(
            f"{loaded.name}: {len(chosen)} policies × {len(seed_list)} seeds",
            total=len(chosen) * len(seed_list),
        )
        results = experiment.run_matrix(
            loaded,
            policies=chosen,
            seeds=seed_list,
            inflation=inflation,
            workers=workers,
            on_result=lambda _: progress.advance(task),
        )
    summary = experiment.summarize(loaded, seed_list, results)
    output.deliver(
        summary,
        table=report.summary_table,
        write=lambda folder, _: report.write(folder, summary, results),
        out=out,
        output_format=output_format,
        console=console,
    )
