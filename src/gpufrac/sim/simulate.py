"""`gpufrac simulate`: load, replay with a progress bar, bound each run, then print and write the results.

One trace (`--nodes`/`--pods`, or the bundled default) gives one trace's report; `--traces` replays several
of the paper's openb variants from one directory and writes one report over all of them; `--tenants` replays
one trace in time as several teams' queues instead (`sim/tenants`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.table import Table

from gpufrac.errors import UserError
from gpufrac.placement.framework import POLICIES
from gpufrac.sim import experiment, output, pool, replay, report, trace
from gpufrac.sim.tenants import command

T = TypeVar("T")

# Past a few times the cluster the replay measures nothing new, and its pod list grows without end.
MAX_INFLATION = 10.0
# The 17 pod lists the paper's figures use, in its order; `--traces all` replays these.
PAPER_TRACES = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)


def run(
    *,
    nodes: Path | None,
    pods: Path | None,
    traces: str | None,
    trace_dir: Path | None,
    policies: str | None,
    seeds: str | None,
    inflation: float | None,
    workers: int | None,
    out: Path | None,
    output_format: str,
    move_budget: str | None = None,
    reserve: str | None = None,
    tenants: Path | None = None,
) -> None:
    output.check_out(out)
    if tenants is not None:
        given = {"--traces": traces, "--trace-dir": trace_dir, "--inflation": inflation}
        given |= {"--move-budget": move_budget, "--whole-gpu-reserve": reserve, "--workers": workers}
        for option, value in given.items():
            if value is not None:
                raise UserError(f"{option}: not read with --tenants (one replay in time); drop one of them")
        command.run(
            tenants=tenants,
            nodes=nodes,
            pods=pods,
            policy=_one(experiment.parse_policies(_given(policies, "binpack")), "--policies", "binpack"),
            seed=_one(experiment.parse_seeds(_given(seeds, "42")), "--seeds", "42"),
            out=out,
            output_format=output_format,
        )
        return
    inflation = 1.3 if inflation is None else inflation
    if not math.isfinite(inflation) or not 0 < inflation <= MAX_INFLATION:
        raise UserError(
            f"--inflation {inflation}: must be a number above 0 and at most {MAX_INFLATION}, such as 1.3 "
            "(the replay creates pods until their requests reach this many times the cluster's GPUs)"
        )
    if traces is not None and pods is not None:
        raise UserError(
            "--traces and --pods: give one or the other (--traces reads pod lists from --trace-dir)"
        )
    if traces is None and trace_dir is not None:
        raise UserError("--trace-dir: only read with --traces, e.g. --traces all")
    pool.check_workers(workers)
    policies = _given(policies, "all")
    chosen = list(POLICIES) if policies == "all" else experiment.parse_policies(policies)
    seed_list = experiment.parse_seeds(_given(seeds, "42-44"))
    budgets = experiment.parse_move_budgets(_given(move_budget, "0"))
    reserves = experiment.parse_reserves(_given(reserve, "0"))
    experiment.check_variants(budgets, reserves)
    loaded = [trace.load(nodes, pods)] if traces is None else load_traces(traces, trace_dir, nodes)
    if not loaded[0].gpus:  # the traces share one node list
        raise UserError(
            "the node list has no GPUs: the replay reports the share of the cluster's GPUs that pods are "
            "given, so at least one node needs a GPU"
        )
    for each in loaded:  # here, not in a worker: a pod list of tiny requests would draw millions of pods
        replay.check_arrivals(each, inflation=inflation)
    console = Console(stderr=True)
    with output.progress(console, "replaying", transient=output_format == "json") as progress:
        # Each seed's bound is one step besides its replays: an LP, well under a second.
        steps = len(loaded) * len(seed_list) * (len(chosen) * len(budgets) * len(reserves) + 1)
        what = loaded[0].name if len(loaded) == 1 else f"{len(loaded)} traces"
        task = progress.add_task(f"{what}: {len(chosen)} policies × {len(seed_list)} seeds", total=steps)
        sweeps = experiment.run_sweep(
            loaded,
            policies=chosen,
            seeds=seed_list,
            inflation=inflation,
            move_budgets=budgets,
            reserves=reserves,
            workers=workers,
            on_done=lambda _: progress.advance(task),
        )
    summaries = {
        each.name: experiment.summarize(each, seed_list, sweeps[each.name].runs, sweeps[each.name].bounds)
        for each in loaded
    }
    runs = {name: sweep.runs for name, sweep in sweeps.items()}
    table: Callable[[dict[str, Any]], Table]
    write: Callable[[Path, dict[str, Any]], list[Path]]
    if traces is None:  # one trace: its own report, as before `--traces` existed
        (document,) = summaries.values()
        table, write = (
            report.summary_table,
            lambda folder, summary: report.write(folder, summary, *runs.values()),
        )
    else:
        document = report.overview(summaries)
        table, write = (
            report.traces_table,
            lambda folder, overview: report.write_traces(folder, overview, runs),
        )
    output.deliver(document, table=table, write=write, out=out, output_format=output_format, console=console)


def _given(value: str | None, default: str) -> str:
    """An option's value, or its default when it was not given. An empty value is not the default: it is
    refused by the option's parser, so that an unset variable in a script does not run the whole sweep."""
    return default if value is None else value


def _one(values: list[T], option: str, example: str) -> T:
    """The one value a tenant replay takes from an option that lists several in the sweep."""
    if len(values) != 1:
        raise UserError(f"{option}: --tenants replays one at a time; give one, e.g. {option} {example}")
    return values[0]


def parse_traces(text: str) -> list[str]:
    """`all` (the paper's 17), or names such as `default,cpu050`: openb_pod_list_<name>.csv each."""
    if text.strip() == "all":
        return list(PAPER_TRACES)
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    bad = [name for name in names if not re.fullmatch(r"[a-z0-9]+", name)]
    if bad or not names:
        raise UserError(
            f"--traces {text!r}: expected all, or names such as default,cpu050 (openb_pod_list_NAME.csv); "
            f"the paper's: {', '.join(PAPER_TRACES)}"
        )
    return names


def load_traces(text: str, trace_dir: Path | None, nodes: Path | None) -> list[trace.Trace]:
    """Every named pod list from `trace_dir` (default: the bundled data, which holds only `default`) on the
    node list from `--nodes` or the same directory; a missing file stops before any replay starts."""
    names = parse_traces(text)
    with resources.as_file(resources.files("gpufrac") / "data") as bundled:
        folder = trace_dir or bundled
        node_path = nodes or folder / trace.BUNDLED_NODES
        paths = {name: folder / f"openb_pod_list_{name}.csv" for name in names}
        expected = [*paths.values()] if nodes else [node_path, *paths.values()]  # --nodes: reading says
        missing = [path.name for path in expected if not path.is_file()]
        if missing:
            where = "the bundled data, which holds only default" if trace_dir is None else str(folder)
            raise UserError(
                f"--traces: {', '.join(missing)} not found in {where}; pass --trace-dir DIR, a directory "
                "with the openb CSVs (openb_node_list_gpu_node.csv, openb_pod_list_<name>.csv)"
            )
        node_list = tuple(trace.load_nodes(node_path))
        models = trace.models_of(node_list)
        return [
            trace.Trace(name, node_list, tuple(trace.load_pods(path, models=models)))
            for name, path in paths.items()
        ]
