"""`gpufrac report` end to end on a real kube-apiserver: fake GPU nodes, share and whole-GPU pods bound by the
in-process scheduler, one agent's /metrics served by the test and one agent unreachable; the page opened in
headless Chromium."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import lightkube

from ..report.browser import check_page
from ..report.fakemetrics import agent_body, serving, share_line
from . import controlplane, fakenodes
from .scheduling import gpu_pod, running_scheduler, wait_bound

MIB = 1024 * 1024


async def test_the_report_compares_the_cluster_with_whole_gpus(
    control_plane: controlplane.ControlPlane,
    admin_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    gpu_nodes: fakenodes.GpuNodes,
    namespace: str,
    tmp_path: Path,
) -> None:
    node = (await gpu_nodes.create(gpus=2, gpu_memory_mib=16384)).metadata.name
    limits = {"gpu-fraction": "0.25", "gpu-fraction.limit": "0.5"}
    quarters = [gpu_pod(f"q{i}", namespace, annotations=limits) for i in range(4)]
    half = gpu_pod("half", namespace, annotations={"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"})
    for pod in [*quarters, half]:
        await admin_client.create(pod)
    async with running_scheduler(scheduler_client, policy="binpack", require_ready=True):
        pods = await wait_bound(admin_client, namespace, 5)
    devices = {
        pod["metadata"]["name"]: pod["metadata"]["annotations"]["nvidia.com/container.main.gpus.devices"]
        for pod in pods
    }
    metrics = agent_body(
        share_line("q0", 1000 * MIB, gpu=devices["q0"], namespace=namespace),  # within its 4096 MiB guarantee
        share_line(
            "q1", 5000 * MIB, gpu=devices["q1"], namespace=namespace
        ),  # over 4096, within 8192: a burst
        share_line("half", 13000 * MIB, gpu=devices["half"], namespace=namespace),  # over 12288: a breach
    )
    out = tmp_path / "report"
    with serving({"/metrics": metrics}) as agent:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "gpufrac.cli", "report"),
                *("--kubeconfig", str(control_plane.kubeconfig())),
                "--out",
                str(out),
                "--metrics",
                f"{agent}/metrics",
                "--metrics",
                "http://127.0.0.1:1/metrics",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr
    assert "warning: http://127.0.0.1:1/metrics: not read" in done.stderr
    report = json.loads((out / "report.json").read_text())
    mine = [share for share in report["shares"] if share["node"] == node]
    statuses = {share["pod"].split("/")[1]: share["status"] for share in mine}
    assert statuses == {
        "q0": "within",
        "q1": "burst",
        "q2": "not measured",
        "q3": "not measured",
        "half": "breach",
    }
    assert report["usage"]["breaches"] == {"GPUMemoryLimitExceeded": 2.0}
    on_node = [gpu for gpu in report["gpus"] if gpu["node"] == node]
    assert sorted(len(gpu["tenants"]) for gpu in on_node) == sorted(Counter(devices.values()).values())
    # other tests' nodes may still hold pods: the cluster-wide figures grow by exactly this test's
    assert report["in_use"] >= 2 and report["without_sharing"] - report["in_use"] >= 3
    print(done.stdout)  # the terminal table, for the README's example
    dom = check_page(
        out / "index.html", tmp_path / "profile", tables={"densification", "shares", "gpus"}, images=3
    )
    assert f"{namespace}/half" in dom
