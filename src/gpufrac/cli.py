"""The `gpufrac` command: one subcommand per job.

Each subcommand lives in the module that owns the job and is imported lazily, so `gpufrac validate` never
pays for matplotlib and a broken optional piece cannot break the others.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

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


def main() -> None:
    app(prog_name="gpufrac")


if __name__ == "__main__":
    sys.exit(main())
