"""The `gpufrac` command: one subcommand per job.

Each subcommand lives in the module that owns the job and is imported lazily, so `gpufrac validate` never
pays for matplotlib and a broken optional piece cannot break the others.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console

from gpufrac.errors import UserError

app = typer.Typer(
    name="gpufrac",
    help="Fractional GPUs with enforceable memory boundaries for Kubernetes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)


@app.callback()
def _commands() -> None:
    """Keeps `gpufrac <command>` a group: without a callback, Typer runs a lone command as the program."""


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into `gpufrac: <message>` on stderr and its exit status, never a traceback."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except UserError as error:
            stderr.print(f"gpufrac: {error}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(error.exit_code) from None
        except KeyboardInterrupt:
            stderr.print("gpufrac: interrupted")
            raise typer.Exit(130) from None

    return wrapper


@app.command()
@one_line_errors
def validate(
    paths: Annotated[
        list[Path], typer.Argument(help="Manifest files, or folders searched for *.yaml and *.yml.")
    ],
    output_format: Annotated[
        Literal["text", "json"], typer.Option("--format", help="text lines or a JSON list.")
    ] = "text",
    strict: Annotated[bool, typer.Option(help="Exit 1 on warnings too.")] = False,
) -> None:
    """Check Kubernetes manifests against the GPU contract: exit 0 clean, 1 on problems, 2 if unreadable."""
    from gpufrac import validate as validation

    raise typer.Exit(validation.run(paths, output_format=output_format, strict=strict))


@app.command()
@one_line_errors
def simulate(
    nodes: Annotated[Path | None, typer.Option(help="Node list CSV (openb format); default bundled.")] = None,
    pods: Annotated[Path | None, typer.Option(help="Pod list CSV (openb format); default: bundled.")] = None,
    policies: Annotated[str, typer.Option(help="Comma-separated policies.")] = "all",
    seeds: Annotated[str, typer.Option(help="Seeds: ranges and lists, e.g. 42-51 or 1,5,9.")] = "42-44",
    inflation: Annotated[float, typer.Option(help="Replay until requests reach this × cluster GPUs.")] = 1.3,
    workers: Annotated[int, typer.Option(help="Worker processes (default: one per CPU).")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write results, plots and report.html here.")] = None,
    output_format: Annotated[Literal["table", "json"], typer.Option("--format")] = "table",
) -> None:
    """Replay a trace through every placement policy, as in the FGD paper (ATC '23)."""
    from gpufrac.sim import simulate as simulation

    simulation.run(
        nodes=nodes,
        pods=pods,
        policies=policies,
        seeds=seeds,
        inflation=inflation,
        workers=workers or None,
        out=out,
        output_format=output_format,
    )


def main() -> None:
    app(prog_name="gpufrac")


if __name__ == "__main__":
    main()
