"""`gpufrac report`: read the cluster, then the usage sources, then write the report; progress on stderr."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from gpufrac.errors import UserError
from gpufrac.report import analysis, collect, render
from gpufrac.sim import output


def run(*, kubeconfig: Path | None, out: Path, metrics: Sequence[str], prometheus: str | None) -> None:
    output.check_out(out)
    for url in metrics:
        collect.check_url(url, option="--metrics")
    if prometheus is not None:
        collect.check_url(prometheus, option="--prometheus")
    console = Console(stderr=True)
    sources = [*metrics, *([prometheus] if prometheus else [])]
    with output.progress(console, "report", transient=True) as progress:
        task = progress.add_task("reading nodes and pods", total=len(sources) + 2)
        nodes, pods = collect.read_cluster(kubeconfig)
        usage = analysis.Usage()
        with collect.http_client() as http:
            for url in metrics:
                progress.update(task, advance=1, description=f"scraping {url}")
                usage += collect.scrape(url, http)
            if prometheus:
                progress.update(task, advance=1, description=f"querying {prometheus}")
                usage += collect.query_prometheus(prometheus, http)
        progress.update(task, advance=1, description="rendering")
        figures = analysis.figures(nodes, pods, usage)
        try:
            written = render.write(out, figures)
        except OSError as error:
            raise UserError(f"--out {out}: cannot write the report ({error.strerror or error})") from None
        progress.update(task, advance=1, description="done")
    for source in usage.sources:
        if source.problem:
            console.print(
                f"warning: {source.url}: not read ({source.problem}); its shares are not measured",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    if not sources:
        console.print("no --metrics or --prometheus given: memory used is not measured")
    console.print(f"wrote {', '.join(path.name for path in written)} to {out}", markup=False)
    Console(width=160).print(render.summary_table(figures))
    if sources and all(source.problem for source in usage.sources):
        raise UserError(
            f"none of the {len(sources)} --metrics/--prometheus source(s) could be read, so memory used is "
            "not measured in the report; check their URLs and that the agents' exporters answer",
            exit_code=1,
        )
