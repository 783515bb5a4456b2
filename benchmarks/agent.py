"""Node agent CPU time per interval, with 8 GPUs and 200 GPU processes (issue: node agent).

Each tick does all the agent's work: sample the (fake) NVML, read 200 processes' cgroup and stat from a fake
/proc, publish the inventory, map processes to 100 pods' containers through their contracts, judge every
share and update the metrics. The Kubernetes API is an in-memory stand-in serving the 100 pods as lightkube
objects, so the figure is the agent's own CPU, not the apiserver's or the network's.

Prints CPU time per tick (mean, median, max over the ticks) for:
- steady: the scenario file unchanged between ticks (the fake backend does not read it again);
- changing: the file rewritten before every tick, so each tick also parses 200 processes of YAML, which
  costs more than NVML's own calls would; an upper bound.

Run: .venv/bin/python benchmarks/agent.py [--ticks 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

from gpufrac import contract
from gpufrac.contract import ComputeMode, PodPlacement, SharePlacement
from gpufrac.node.agent import Agent, DryRunKiller, Settings
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.watchdog import Mode
from gpufrac.testing.fakehost import FakeHost, container_id

GPUS = 8
PODS = 100
PROCESSES_PER_POD = 2


class StandInClient:
    """Answers the calls a tick makes: get and patch the Node (its status, the Ready condition, is not kept),
    list the node's pods, create Events and evictions (kept in `created`)."""

    def __init__(self, node: str, pods: list[Pod]) -> None:
        self.node = Node(metadata=ObjectMeta(name=node, labels={}, annotations={}))
        self.pods = pods
        self.created: list[Any] = []

    async def get(self, kind: type, name: str, **_: Any) -> Any:
        assert kind is Node
        return self.node

    async def patch(self, kind: type, name: str, patch: dict[str, Any], **_: Any) -> Any:
        if kind is Node.Status:
            return self.node
        meta = self.node.metadata
        assert meta is not None and meta.labels is not None and meta.annotations is not None
        meta.labels.update(patch["metadata"].get("labels", {}))
        meta.annotations.update(patch["metadata"].get("annotations", {}))
        return self.node

    async def list(self, kind: type, **_: Any) -> AsyncIterator[Pod]:
        for pod in self.pods:
            yield pod

    async def create(self, obj: Any, *_: Any, **__: Any) -> Any:
        self.created.append(obj)
        return obj


def share_pod(n: int, name: str, gpu: str, *, request: int, limit: int, priority: int = 0) -> Pod:
    """A running pod whose container `app` (container ID number `n`) holds a time-slicing share of `gpu`."""
    placement = PodPlacement((SharePlacement("app", (gpu,), request, limit, ComputeMode.TIME_SLICING),))
    status = {
        "name": "app",
        "containerID": f"containerd://{container_id(n)}",
        "image": "busybox",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
    }
    return Pod.from_dict(
        {
            "metadata": {
                "name": name,
                "namespace": "bench",
                "uid": f"uid-{name}",
                "annotations": contract.render_annotations(placement),
            },
            "spec": {"containers": [{"name": "app", "image": "busybox"}], "priority": priority},
            "status": {"containerStatuses": [status]},
        }
    )


def scenario(root: Path) -> tuple[FakeHost, list[Pod]]:
    host = FakeHost(root)
    host.add_gpus(GPUS)
    pods = []
    for n in range(PODS):
        pods.append(share_pod(n + 1, f"pod-{n}", host.uuid(n % GPUS), request=4096, limit=8192))
        for k in range(PROCESSES_PER_POD):
            host.add_process(10_000 + n * PROCESSES_PER_POD + k, container=container_id(n + 1))
    host.write(_processes())
    return host, pods


async def measure(ticks: int, *, changing: bool) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        host, pods = scenario(Path(folder))
        agent = Agent(
            Settings(node_name="bench-node", mode=Mode.KILL, proc_root=host.proc),
            client=StandInClient("bench-node", pods),  # type: ignore[arg-type]
            nvml=FakeBackend(host.nvml_file),
            killer=DryRunKiller(),
        )
        await agent.tick()  # the first tick publishes the inventory
        spent = []
        for _ in range(ticks):
            if changing:
                host.write(_processes())
            started = time.process_time()
            report = await agent.tick()
            spent.append(time.process_time() - started)
            assert report.findings == () and len(report.usages) == PODS
        return spent


def _processes() -> dict[int, list[tuple[int, int]]]:
    """Per GPU, its processes as (pid, used MiB): two of each pod's container, within the limit."""
    processes: dict[int, list[tuple[int, int]]] = {index: [] for index in range(GPUS)}
    for n in range(PODS):
        for k in range(PROCESSES_PER_POD):
            processes[n % GPUS].append((10_000 + n * PROCESSES_PER_POD + k, 1000 + k))
    return processes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ticks", type=int, default=50)
    args = parser.parse_args()
    print(
        f"node agent, {GPUS} GPUs, {PODS * PROCESSES_PER_POD} GPU processes in {PODS} pods,"
        f" {args.ticks} ticks"
    )
    for name, changing in (("steady", False), ("changing", True)):
        spent = asyncio.run(measure(args.ticks, changing=changing))
        ms = [s * 1000 for s in spent]
        mean, median = statistics.mean(ms), statistics.median(ms)
        print(
            f"  {name:9} CPU per tick: mean {mean:6.1f} ms, median {median:6.1f} ms, max {max(ms):6.1f} ms;"
            f" at a 10 s interval {mean / 100:.2f}% of one core"
        )


if __name__ == "__main__":
    main()
