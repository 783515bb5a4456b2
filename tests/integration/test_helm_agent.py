"""The chart's node agent: a privileged hostPID DaemonSet wired to the MPS pipe directory the scheduler names,
running under exactly the RBAC the agent's integration tests run under. (test_helm_chart.py dry-runs every
rendered object, these included, against the apiserver.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac import contract
from gpufrac.errors import UserError

from ..contract.test_mps_directory import ACCEPTED, REFUSED
from .chart import helm_refusal, helm_template


def _daemonset(*values: str) -> dict[str, Any] | None:
    found = [d for d in helm_template(*values) if d["kind"] == "DaemonSet"]
    return found[0] if found else None


def test_the_agent_daemonset() -> None:
    daemonset = _daemonset()
    assert daemonset is not None and daemonset["metadata"]["name"] == "gpufrac-agent"
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["serviceAccountName"] == "gpufrac-agent"
    (container,) = pod["containers"]
    assert container["securityContext"]["privileged"] is True
    args = container["args"]
    # Safe defaults: report only, on nodes that opted in, beside whichever device plugin runs.
    assert args[:2] == ["agent", "--mode=report"] and "--proc-root=/host/proc" in args
    assert "--device-plugin=auto" in args and "--cuda-context-mib=512" in args
    assert not any(a.startswith("--native-label") for a in args)
    assert pod["nodeSelector"] == {"gpufrac.io/enabled": "true"}
    assert pod["priorityClassName"] == "system-node-critical"
    assert f"--mps-pipe-directory={contract.DEFAULT_MPS_PIPE_DIRECTORY}" in args
    node_name = next(e for e in container["env"] if e["name"] == "NODE_NAME")
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert (mounts["host-proc"], volumes["host-proc"]) == ("/host/proc", "/proc")
    assert mounts["mps-pipe"] == volumes["mps-pipe"] == contract.DEFAULT_MPS_PIPE_DIRECTORY
    # The kubelet's PodResources socket read-only, and its device-plugin folder (auto may mean managed).
    assert mounts["pod-resources"] == volumes["pod-resources"] == "/var/lib/kubelet/pod-resources"
    assert next(m for m in container["volumeMounts"] if m["name"] == "pod-resources")["readOnly"] is True
    assert mounts["device-plugins"] == volumes["device-plugins"] == "/var/lib/kubelet/device-plugins"


def test_agent_values() -> None:
    daemonset = _daemonset(
        "agent.mode=kill",
        "agent.mps.enabled=false",
        "agent.runtimeClassName=nvidia",
        "agent.devicePlugin=none",
        "agent.nativeLabel=example.com/fractions=ready",
    )
    assert daemonset is not None
    pod = daemonset["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--mode=kill" in args and "--mps-control=" in args and "--device-plugin=none" in args
    assert "--native-label=example.com/fractions=ready" in args
    assert not any(a.startswith("--mps-pipe-directory") for a in args)
    assert pod["runtimeClassName"] == "nvidia"
    assert {v["name"] for v in pod["volumes"]} == {"host-proc"}
    coexist = _daemonset("agent.devicePlugin=coexist")
    assert coexist is not None
    assert {v["name"] for v in coexist["spec"]["template"]["spec"]["volumes"]} == {
        "host-proc",
        "pod-resources",
        "mps-pipe",
        "mps-log",
    }
    limited = _daemonset("agent.mps.pinnedMemoryLimitMiB=2048")
    assert limited is not None
    assert "--mps-pinned-limit-mib=2048" in limited["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _daemonset("agent.enabled=false") is None
    for value, expected in (("gpu-node-critical", "gpu-node-critical"), ("", None)):  # GKE: another, or none
        named = _daemonset(f"agent.priorityClassName={value}")
        assert named is not None and named["spec"]["template"]["spec"].get("priorityClassName") == expected


@pytest.mark.parametrize("path", REFUSED + ACCEPTED)
def test_the_schema_takes_the_mps_pipe_directories_the_programs_take(path: str) -> None:
    """Both the agent and the webhook are given agent.mps.pipeDirectory; a value they refuse at startup
    (one not gpufrac's own, which tenants' sm-sharing pods would mount) must stop the release instead."""
    value = f"agent.mps.pipeDirectory={path}"
    try:
        contract.check_mps_directory(path, flag="--mps-pipe-directory")
    except UserError:
        assert "- agent.mps.pipeDirectory: " in helm_refusal(value)
    else:
        assert _daemonset(value) is not None
