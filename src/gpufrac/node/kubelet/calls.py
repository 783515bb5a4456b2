"""What both APIs need before and after calling the kubelet over its unix sockets: the socket checked
first, so that a missing mount is one clear line at once rather than a call waiting out its deadline, and a
failed call told in one line rather than as grpc's multi-line error."""

from __future__ import annotations

import stat
from pathlib import Path

import grpc


def socket_problem(path: Path) -> str | None:
    """Why ``path`` cannot be the kubelet's socket (missing, or some other kind of file), or None."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "does not exist"
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    return None if stat.S_ISSOCK(mode) else "is not a unix socket"


def status(error: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    """The status code of a failed call, and its code and details on one line."""
    code = error.code() if isinstance(error, grpc.Call) else None
    details = " ".join(str(error.details() if isinstance(error, grpc.Call) else error).split())
    return code, f"{code.name if code else 'error'}: {details or 'no details'}"
