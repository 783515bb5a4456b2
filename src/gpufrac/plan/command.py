"""`gpufrac plan`: load, check every input, run the jobs with a progress bar, then print and write."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from gpufrac.plan import planner, report
from gpufrac.plan.planner import Job, Settings
from gpufrac.sim import experiment, output, trace


def run(
    *,
    nodes: Path | None,
    pods: Path | None,
    strategies: str,
    seeds: str,
    out: Path | None,
    output_format: str,
    **options: Any,
) -> None:
    """`options` are the other fields of `Settings`, as the command line gives them."""
    output.check_out(out)
    settings = Settings(
        strategies=planner.parse_strategies(strategies),
        seeds=tuple(experiment.parse_seeds(seeds)),
        **options,
    )
    settings.check()
    loaded = trace.load(nodes, pods)
    prepared = planner.prepare(loaded, settings)
    console = Console(stderr=True)
    todo = planner.jobs(settings)
    with output.progress(console, "planning", transient=output_format == "json") as progress:
        task = progress.add_task(f"{loaded.name}: searches and timed replays", total=len(todo))

        def done(job: Job) -> None:
            progress.update(task, advance=1, description=f"{loaded.name}: {job.kind} {job.strategy} done")

        static, replays = planner.run(prepared, on_done=done)
    output.deliver(
        planner.summarize(loaded, prepared, static, replays),
        table=report.summary_table,
        write=report.write,
        out=out,
        output_format=output_format,
        console=console,
    )
