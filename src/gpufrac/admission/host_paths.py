"""Host paths as the host resolves them, and which of them reach gpufrac's MPS pipe directory.

A `hostPath` volume is a path on the node, and the same directory has many spellings: `//run/x`, `/run/./x`,
`/run/y/../x`, `/run/x/`, and `/var/run/x` (`/var/run` is a link to `/run` on every distribution Kubernetes
runs on). The rules compare canonical paths only. The MPS pipe directory is reached by a volume at it or
below it, by one at any directory above it (the volume holds it), and through `/proc`, whose
`/proc/<pid>/root/` is the root directory of any process on the node.
"""

from __future__ import annotations

from gpufrac.contract.errors import brief

PROC = "/proc"


def canonical(path: str) -> str:
    """`path` resolved part by part as the node's kernel would: absolute, one slash between parts, no `.`
    or `..` (above `/` stays at `/`), no trailing slash, and `/var/run` followed to `/run` where it occurs,
    so that `/var/run/../proc` is `/proc`. (Links other than `/var/run` on the node cannot be seen from
    here.)"""
    parts: list[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part not in ("", "."):
            parts.append(part)
            if parts == ["var", "run"]:
                parts = ["run"]
    return "/" + "/".join(parts)


def is_within(path: str, directory: str) -> bool:
    """Whether canonical `path` is `directory` or below it."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def reaches(path: str, directory: str) -> str | None:
    """Why a host path volume at `path` reaches canonical `directory`, or None if it does not."""
    path = canonical(path)
    shown = brief(path)
    if is_within(path, directory):
        return f"mounts {shown} from the host, where gpufrac's MPS daemons listen"
    if is_within(directory, path):
        return f"mounts {shown} from the host, which holds {directory}, where gpufrac's MPS daemons listen"
    if is_within(path, PROC):
        return f"mounts {shown} from the host, through which /proc/<pid>/root reaches every file on the node"
    return None
