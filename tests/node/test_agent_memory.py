"""What the agent remembers between ticks stays bounded by what is on the node now."""

from __future__ import annotations

from typing import Any

from gpufrac.node.agent import Agent, Settings
from gpufrac.node.watchdog import Container, PodRef


def broken(uid: str) -> dict[str, Container]:
    return {f"c-{uid}": Container(PodRef("ns", uid, uid), "app", problem="its GPU contract is broken")}


def test_pods_with_broken_contracts_are_forgotten_once_gone(caplog: Any) -> None:
    agent = Agent(Settings(node_name="n1"), client=None, nvml=None, killer=None)  # type: ignore[arg-type]
    for tick in range(1000):  # a tenant who keeps creating pods with broken contracts
        agent._log_broken_contracts(broken(f"uid-{tick}"))
    assert agent._broken_pods == {"uid-999"}
    caplog.clear()
    agent._log_broken_contracts(broken("uid-999"))
    assert caplog.records == []  # still broken: logged once, not every tick
