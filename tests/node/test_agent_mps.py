"""The MPS daemons are the agent's own processes, but the file that names them lies in the pipe directory,
which the webhook mounts, writable, into every sm-sharing container: what a tenant writes there never
exempts its own GPU processes from the watchdog."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from gpufrac.node import mps, procfs
from gpufrac.node.agent import SM_SHARING_DAEMON, Agent, Settings
from gpufrac.node.nvml import FakeBackend
from gpufrac.node.watchdog import Kind, Mode
from gpufrac.testing.fakehost import FakeHost, RecordingKiller, container_id

from .fake_kube import FakeNodeClient

AGENT, TENANT = container_id(9), container_id(1)


def agent_on(tmp_path: Path, *, own_container: str | None) -> tuple[Agent, FakeHost, Path]:
    """An agent in `own_container` (None: on the host) supervising an MPS daemon that answers (`true`), on a
    node whose one GPU holds process 101 of a tenant's container, which has no contract."""
    host = FakeHost(tmp_path / "host")
    host.add_gpus(1, memory_mib=16384)
    host.add_process(101, container=TENANT)
    pipes = tmp_path / "pipes"
    spec = mps.DaemonSpec(SM_SHARING_DAEMON, pipe_directory=pipes, log_directory=tmp_path / "log")
    true = shutil.which("true")
    assert true is not None
    supervisor = mps.Supervisor([spec], program=true, proc=procfs.ProcFS(host.proc))
    node: dict[str, Any] = {"metadata": {"name": "n1", "labels": {}, "annotations": {}}, "status": {}}
    agent = Agent(
        Settings(node_name="n1", mode=Mode.REPORT, proc_root=host.proc),
        client=FakeNodeClient(node, []),
        nvml=FakeBackend(host.nvml_file),
        killer=RecordingKiller(),
        supervisor=supervisor,
        own_container=own_container,
    )
    return agent, host, pipes / mps.PID_FILE


@pytest.mark.parametrize("own_container", [AGENT, None])
async def test_a_pid_file_naming_a_tenant_process_does_not_exempt_it(
    tmp_path: Path, own_container: str | None
) -> None:
    agent, host, pid_file = agent_on(tmp_path, own_container=own_container)
    host.add_process(50, container=own_container)  # the agent's daemon: still its own
    host.add_process(51, container=own_container, ppid=50)  # the MPS server the daemon started
    pid_file.parent.mkdir(parents=True)
    pid_file.write_text("50")
    host.write({0: [(51, 300), (101, 4000)]})
    report = await agent.tick()
    assert [(f.kind, [p.pid for p in f.processes]) for f in report.findings] == [(Kind.NO_CONTRACT, [101])]

    pid_file.write_text("101")  # the tenant, who read its host pid from NVML in its container
    report = await agent.tick()
    assert (Kind.NO_CONTRACT, [101]) in [(f.kind, [p.pid for p in f.processes]) for f in report.findings]
