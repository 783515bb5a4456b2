"""The real node of the integration tests: containerd, runc and a kubelet on this machine, registered with
the session's apiserver, started by ``hack/test-cluster node`` (see hack/README.md).

Pods bound to it really run, from the two local images (``BUSYBOX``, and the pause image for sandboxes),
so the tests can read a container's environment with ``kubectl exec``, find its processes in /proc and its
cgroups, and see an eviction end it. It has no GPU and no NVIDIA runtime.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from lightkube.resources.core_v1 import Node

from .. import controlplane

NAME = controlplane.REAL_NODE
BUSYBOX = "docker.io/local/busybox:1"


class NodeError(controlplane.ControlPlaneError):
    """The node could not be started; the message says why and where its logs are."""


@dataclass(frozen=True)
class RealNode:
    """A running node: its name, IP and folder, the kubelet's sockets, and kubectl of the same version."""

    name: str
    ip: str
    folder: Path
    podresources_socket: Path
    device_plugin_dir: Path
    kubectl_binary: Path
    start_seconds: float

    def kubectl(
        self, plane: controlplane.ControlPlane, *args: str, identity: str = "admin", stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as ``identity``; the result, whatever its exit status."""
        command = [str(self.kubectl_binary), f"--kubeconfig={plane.kubeconfig(identity)}", *args]
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=120, check=False)

    def container_pid(self, container_id: str) -> int:
        """The host pid of a container's first process, from runc's own record of the container."""
        runc = self.kubectl_binary.with_name("runc")
        root = self.folder / "containerd" / "runc" / "k8s.io"
        done = subprocess.run(
            [str(runc), "--root", str(root), "state", container_id],
            capture_output=True,
            text=True,
            check=True,
        )
        return int(json.loads(done.stdout)["pid"])


def start(plane: controlplane.ControlPlane) -> RealNode:
    """Start the node in the control plane's folder; raise NodeError with the script's reason.

    The control plane's ``stop`` stops it too, and so does the end of this process, however it ends.
    """
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(controlplane.SCRIPT), "node", str(plane.rundir), NAME],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        raise NodeError(
            f"hack/test-cluster node timed out after {e.timeout}s; see {plane.rundir}/nodes"
        ) from e
    if done.returncode != 0:
        raise NodeError(f"hack/test-cluster node failed (exit {done.returncode}):\n{done.stderr.strip()}")
    folder = plane.rundir / "nodes" / NAME
    env = dict(line.split("=", 1) for line in (folder / "node.env").read_text().splitlines() if "=" in line)
    bindir = subprocess.run(
        [str(controlplane.SCRIPT), "bindir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return RealNode(
        name=NAME,
        ip=env["NODE_IP"],
        folder=folder,
        podresources_socket=Path(env["PODRESOURCES_SOCKET"]),
        device_plugin_dir=Path(env["DEVICE_PLUGIN_DIR"]),
        kubectl_binary=Path(bindir) / "kubectl",
        start_seconds=time.monotonic() - started,
    )


def stop(plane: controlplane.ControlPlane) -> None:
    """Stop the node and delete its Node object (nothing else would: no node lifecycle controller)."""
    subprocess.run(
        [str(controlplane.SCRIPT), "stop", str(plane.rundir), NAME],
        check=False,
        capture_output=True,
        timeout=120,
    )
    with plane.sync_client() as admin:
        admin.delete(Node, NAME)
