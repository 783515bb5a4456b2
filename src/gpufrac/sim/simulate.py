"""`gpufrac simulate`: load, replay with a progress bar, then print and write the results."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.sim import experiment, report, trace


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
    if not math.isfinite(inflation) or inflation <= 0:
        raise UserError(f"--inflation {inflation}: must be a positive number such as 1.3")
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers}: must be at least 1")
    chosen = list(POLICIES) if policies == "all" else experiment.parse_policies(policies)
    seed_list = experiment.parse_seeds(seeds)
    loaded = trace.load(nodes, pods)
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]replaying[/bold] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=output_format == "json",
    ) as progress:
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
    if out is not None:
        try:
            written = report.write(out, summary, results)
        except OSError as error:
            raise UserError(f"--out {out}: cannot write the report ({error.strerror})") from None
        console.print(f"wrote {', '.join(path.name for path in written)} to {out}")
    if output_format == "json":
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        Console().print(report.summary_table(summary))
