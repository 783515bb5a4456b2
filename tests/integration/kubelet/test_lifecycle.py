"""`hack/test-cluster` with real nodes: a second cluster with a node runs beside the session's, and when
its owner process ends, however it ends, nothing of it is left on the machine; a node that cannot start
says why in one line.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .. import controlplane
from . import realnode


def processes_naming(folder: Path) -> list[int]:
    """The live processes whose command line names ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder).encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode == 0


def eventually(what: str, check: Callable[[], list[str]], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while left := check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} after {timeout:.0f}s: {left}")
        time.sleep(0.5)


def test_a_node_beside_the_sessions_leaves_nothing_behind_when_its_owner_ends(
    real_node: realnode.RealNode,
    control_plane: controlplane.ControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = tmp_path_factory.mktemp("cluster")
    owner = subprocess.Popen(["sleep", "600"])
    env = {**os.environ, "NODES": "1", "OWNER_PID": str(owner.pid), "CONTROLLERS": ""}
    try:
        started = subprocess.run(
            [str(controlplane.SCRIPT), "start", str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert started.returncode == 0, started.stderr
        kubectl = [str(real_node.kubectl_binary), f"--kubeconfig={folder / 'kubeconfig'}"]
        pod = f"""
apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  nodeName: node-1
  automountServiceAccountToken: false
  containers: [{{name: c, image: {realnode.BUSYBOX}, imagePullPolicy: Never, command: [sleep, "600"]}}]
"""
        for command, stdin in (
            (["create", "serviceaccount", "default"], None),
            (["apply", "-f", "-"], pod),
            (["wait", "--for=condition=Ready", "pod/p", "--timeout=120s"], None),
        ):
            done = subprocess.run(
                [*kubectl, *command], input=stdin, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, done.stderr
        node = folder / "nodes" / "node-1"
        settings = dict(line.split("=", 1) for line in (node / "node.env").read_text().splitlines())
        containers = os.listdir(node / "containerd" / "runc" / "k8s.io")
        assert len(containers) == 2  # the sandbox and the container
        assert link_exists(settings["BRIDGE"]) and link_exists(settings["VETH"])
    finally:
        owner.kill()
        owner.wait()

    eventually("processes of the cluster still run", lambda: [str(p) for p in processes_naming(folder)])
    eventually(
        "left behind",
        lambda: (
            [name for name in (settings["BRIDGE"], settings["VETH"]) if link_exists(name)]
            + [path for c in containers for path in glob.glob(f"/sys/fs/cgroup/*/k8s.io/{c}")]
            + [path for c in containers for path in glob.glob(f"/var/lib/cni/results/*-{c}-*")]
        ),
    )
    # The session's node was never disturbed.
    ready = real_node.kubectl(
        control_plane,
        "get",
        "node",
        real_node.name,
        "-o",
        'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
    )
    assert ready.stdout == "True"
    assert (real_node.device_plugin_dir / "kubelet.sock").exists()


def test_a_node_without_an_identity_says_so(control_plane: controlplane.ControlPlane) -> None:
    done = subprocess.run(
        [str(controlplane.SCRIPT), "node", str(control_plane.rundir), "stranger"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"test-cluster: node stranger: {control_plane.rundir}/tokens.csv has no system:node:stranger; "
        "start the cluster with NODES=N, or add its line before starting"
    ]
