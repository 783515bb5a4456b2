"""Burst rules on scripted scenarios (issue 16): what the node agent does when shares above their request
leave a neighbour less than its guarantee, and the guaranteed memory each share could still get.

Each scenario is one GPU of a fake host (fake NVML and /proc) shared by a few pods. The agent ticks in kill
mode with a killer that only records; the processes it killed are then taken out of the scenario, as the
kernel would take them, and it ticks again. Per share: its priority, request, limit and use, what it did,
and the memory it could still reach of its request, min(request, used + free), before and after (free:
the GPU's allocatable memory, as the agent publishes it, less what every process uses). Then the Events.

Run: PYTHONPATH=src .venv/bin/python benchmarks/bursts.py
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

# Run as a script, this folder is on the path: the stand-in API client and the share pods are agent.py's.
from agent import StandInClient, share_pod
from gpufrac.node.agent import Agent, Settings, TickReport
from gpufrac.node.nvml import MIB, FakeBackend
from gpufrac.node.watchdog import Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id


@dataclass(frozen=True)
class Share:
    """A pod with one process on the GPU; MiB."""

    pod: str
    priority: int
    request: int
    limit: int
    used: int


@dataclass(frozen=True)
class Scenario:
    name: str
    memory_mib: int  # the GPU's total; 512 MiB less is allocatable (one CUDA context's allowance)
    shares: tuple[Share, ...]


THREE = (
    Share("batch", 0, 20000, 60000, 30000),
    Share("train", 100, 20000, 60000, 40000),
    Share("infer", 1000, 20000, 20000, 5000),
)
SCENARIOS = (
    Scenario(
        "two shares: a bursts into b's guarantee",
        16384,
        (Share("a", 0, 7936, 15872, 12000), Share("b", 0, 7936, 15872, 2000)),
    ),
    Scenario(
        "bursting with room left: no action",
        16384,
        (Share("a", 0, 4000, 15872, 10000), Share("b", 0, 4000, 15872, 1000)),
    ),
    Scenario("three shares with priorities: the lowest goes, though another is further over", 81920, THREE),
    Scenario(
        "three shares of one priority: the furthest over its request goes",
        81920,
        tuple(replace(share, priority=0) for share in THREE),
    ),
)


@dataclass
class Played:
    before: TickReport
    after: TickReport
    events: list[str]


async def play(scenario: Scenario) -> Played:
    """Tick, take out what was killed, tick again."""
    with tempfile.TemporaryDirectory() as folder:
        host = FakeHost(Path(folder))
        host.add_gpus(1, memory_mib=scenario.memory_mib)
        pods, running = [], {}
        for n, share in enumerate(scenario.shares, start=1):
            pods.append(
                share_pod(
                    n,
                    share.pod,
                    host.uuid(0),
                    request=share.request,
                    limit=share.limit,
                    priority=share.priority,
                )
            )
            host.add_process(100 + n, container=container_id(n))
            running[100 + n] = share.used
        host.write({0: list(running.items())})
        client = StandInClient("node", pods)
        killer = RecordingKiller()
        agent = Agent(
            Settings(node_name="node", mode=Mode.KILL, proc_root=host.proc),
            client=client,  # type: ignore[arg-type]
            nvml=FakeBackend(host.nvml_file),
            killer=killer,
        )
        before = await agent.tick()
        for pid in killer.calls:
            running.pop(pid, None)
        host.write({0: list(running.items())})
        after = await agent.tick()
        return Played(
            before, after, [f"{e.reason} on {e.involvedObject.name}: {e.message}" for e in client.created]
        )


def could_get(report: TickReport) -> dict[str, int]:
    """Pod -> MiB it could still reach of its request: min(request, used + free)."""
    (gpu,) = report.gpus
    free = gpu.usable_mib * MIB - sum(u.used_bytes for u in report.usages)
    return {
        u.container.pod.name: min(u.container.request_mib or 0, (u.used_bytes + free) // MIB)
        for u in report.usages
    }


def table(scenario: Scenario, played: Played) -> Table:
    out = Table(title=scenario.name, title_justify="left")
    for column in ("share", "priority", "request MiB", "limit MiB", "used MiB", "could get before", "action"):
        out.add_column(column, justify="left" if column in ("share", "action") else "right")
    out.add_column("could get after", justify="right")
    before, after = could_get(played.before), could_get(played.after)
    acted = {h.finding.container.pod.name: h for h in played.before.handled if h.finding.container}
    for share in scenario.shares:
        handled = acted.get(share.pod)
        action = f"{handled.action} ({handled.finding.kind.value})" if handled else "-"
        out.add_row(
            share.pod,
            str(share.priority),
            str(share.request),
            str(share.limit),
            str(share.used),
            str(before[share.pod]),
            action,
            str(after[share.pod]),
        )
    return out


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the agent's warnings say what the Events say
    console = Console(width=140)
    for scenario in SCENARIOS:
        played = asyncio.run(play(scenario))
        console.print(table(scenario, played))
        for line in played.events:
            console.print(f"  Event {line}", soft_wrap=True)
        again = [h.finding.detail for h in played.after.handled]
        console.print(f"  next tick: {'acted again on ' + '; '.join(again) if again else 'no action'}\n")


if __name__ == "__main__":
    main()
