"""Writing a set of files all or none: a report's pages and charts, a certificate beside its key.

Every file goes to a fresh temporary file beside it first, and they are renamed over the real names only
once all are written, so a failure (a full disk, a folder where a file goes, a path under a file) leaves
every file as it was: never a new certificate without its key, never part of a new report beside part of an
old one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path


def write_all(files: Sequence[tuple[Path, bytes, int | None]]) -> None:
    """Write each `(path, content, mode)`, all or none. A mode is set before any byte is written, so a key
    is never readable by others even for a moment, nor where an old file was; None leaves the default."""
    partials: list[tuple[Path, Path]] = []
    try:
        for path, content, mode in files:
            if path.is_dir():  # found now, so that no rename below fails half way
                raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
            partial = path.with_name(f".{path.name}.partial")
            partials.append((partial, path))
            partial.unlink(missing_ok=True)  # a leftover, perhaps with looser permissions
            with partial.open("xb") as handle:
                if mode is not None:
                    partial.chmod(mode)
                handle.write(content)
    except OSError:
        for partial, _ in partials:
            partial.unlink(missing_ok=True)
        raise
    for partial, path in partials:
        os.replace(partial, path)
