"""Which host directory may be the node's MPS pipe directory.

The agent's MPS daemons listen there and the webhook mounts it read-write into every sm-sharing container,
so whatever directory is named is handed to tenants: `/run` would give them the container runtime's socket,
`/` or `/proc` every file on the node. `gpufrac webhook --mps-host-directory` and `gpufrac agent
--mps-pipe-directory` refuse any but a directory of gpufrac's own at startup, by this one rule; the chart's
schema refuses the same values (tests/integration/test_helm_agent.py keeps the two in step).
"""

from __future__ import annotations

from gpufrac.contract.render import DEFAULT_MPS_PIPE_DIRECTORY
from gpufrac.errors import UserError

# Trees no part of which may be handed to a tenant, nor any directory that holds one (`/var/lib`): the
# kernel's views of processes, devices and itself, the node's configuration, and the kubelet's state (other
# pods' volumes, its device-plugin and pod-resources sockets).
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/var/lib/kubelet")


def check_mps_directory(path: str, *, flag: str) -> None:
    """Refuse (a UserError naming `flag`) a `path` that is not a directory of its own: one spelled plainly
    (absolute, no `//`, `.`, `..` or trailing `/`, so the rule judges the directory the kernel will mount),
    two levels deep or more (no top-level directory, `/run`, `/tmp`, `/var`, `/home`, shared whole), and
    neither within nor above one of `SYSTEM_TREES`. `/var/run` is read as `/run`, its target on every
    distribution Kubernetes runs on."""
    if not _is_dedicated(path):
        trees = ", ".join(SYSTEM_TREES)
        raise UserError(
            f"{flag} {path!r}: sm-sharing pods mount the MPS pipe directory read-write, so it must be "
            f"gpufrac's own, such as {DEFAULT_MPS_PIPE_DIRECTORY}: an absolute path spelled plainly, at "
            f"least two levels deep, and neither within nor above {trees}"
        )


def _is_dedicated(path: str) -> bool:
    parts = path.split("/")
    if parts[0] or any(part in ("", ".", "..") for part in parts[1:]):
        return False
    if parts[1:3] == ["var", "run"]:
        parts[1:3] = ["run"]
    plain = "/".join(parts)
    return len(parts) > 2 and not any(_within(plain, tree) or _within(tree, plain) for tree in SYSTEM_TREES)


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory + "/")
