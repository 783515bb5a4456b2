"""What the long commands (`gpufrac simulate`, `gpufrac plan`) share at their edge: a progress bar, and
delivering the result as a table or JSON plus report files.

Files are written to a temporary name and renamed, so an interrupted run never leaves a half-written
report that looks whole; plots travel as PNG bytes so that an HTML page can embed them and stay one file.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpufrac import writing
from gpufrac.errors import UserError

# Labels carry names from traces, tenant configs and the cluster (a trace file's name, a GPU a pod names); a
# `$` in one would be read as TeX, and an invalid formula aborts the drawing. No chart uses TeX.
matplotlib.rcParams["text.parse_math"] = False


def check_out(out: Path | None) -> None:
    """Refuse an `--out` that can never be a folder (a file or a link to nothing, or a path under one) before
    the long work that would be thrown away when it came to be written, not after."""
    if out is None:
        return
    # A link to nothing counts as there (`lexists`): no folder can be made where it is.
    existing = next((path for path in (out, *out.absolute().parents) if os.path.lexists(path)), None)
    if existing is not None and not existing.is_dir():
        what = "a file" if existing.exists() else "a link to nothing"
        where = "" if existing == out else f" ({existing} is {what})"
        raise UserError(f"--out {out}: {what}, not a folder{where}; pass a folder for the report")
    if existing is not None:
        try:  # a file made there and gone at once: what permissions, a read-only mount or /proc allow
            with tempfile.TemporaryFile(dir=existing):
                pass
        except OSError as error:
            where = "" if existing == out else f" in {existing}"
            reason = error.strerror or error
            raise UserError(
                f"--out {out}: cannot write{where} ({reason}); pass a folder you may write"
            ) from None


def write_files(out: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Each file in `out` (created if need be), all or none (`writing.write_all`); the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in files]
    writing.write_all([(path, content, None) for path, content in zip(paths, files.values(), strict=True)])
    return paths


def png(figure: Figure) -> bytes:
    """The figure as PNG bytes; the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def img(data: bytes, alt: str) -> str:
    """An <img> element carrying the PNG itself, so that the page needs no other file."""
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def progress(console: Console, verb: str, *, transient: bool) -> Progress:
    """`<verb> <task description> ━━━━ 3/12 0:00:41` on `console`; transient when stdout carries JSON."""
    return Progress(
        TextColumn(f"[bold]{verb}[/bold] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=transient,
        refresh_per_second=2,  # a bar of work that takes minutes: redrawing it more often only takes CPU
    )


def deliver(
    summary: dict[str, Any],
    *,
    table: Callable[[dict[str, Any]], Table],
    write: Callable[[Path, dict[str, Any]], list[Path]],
    out: Path | None,
    output_format: str,
    console: Console,
) -> None:
    """Write the report files to `out` if given (saying so on `console`), then print the summary to stdout:
    JSON, or the table, which a pipe or a file gets unsqueezed."""
    if out is not None:
        try:
            written = write(out, summary)
        except OSError as error:
            raise UserError(f"--out {out}: cannot write the report ({error.strerror})") from None
        console.print(f"wrote {', '.join(path.name for path in written)} to {out}")
    if output_format == "json":
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    screen = Console()
    if not screen.is_terminal:
        screen = Console(width=max(screen.width, 160))
    screen.print(table(summary))


def page(title: str, body: str) -> str:
    """A report page: one HTML file, its plots inside it (`img`)."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:right}}
td:first-child,th:first-child{{text-align:left}}img{{max-width:100%}}</style></head><body>
<h1>gpufrac simulation</h1>
{body}
</body></html>
"""
