"""Supervising MPS control daemons: start, configure, health-check, restart with backoff, stop.

One daemon per compute mode that needs one; today that is sm-sharing, whose pipe directory is the one the
webhook mounts into sm-sharing containers and the scheduler names in `CUDA_MPS_PIPE_DIRECTORY`
(`contract.DEFAULT_MPS_PIPE_DIRECTORY`). Each daemon gets its own pipe and log directories.

`nvidia-cuda-mps-control -d` forks the daemon and returns; the daemon writes its pid to
`<pipe dir>/nvidia-cuda-mps-control.pid`. Commands go to the running daemon through the same program, one
per line on its stdin (`set_default_active_thread_percentage 100`, `set_default_device_pinned_mem_limit 0
8192M`, `get_server_list`, `quit`). A daemon is healthy when it answers `get_server_list`; one that answers
where the supervisor would start one (the agent restarted, the daemon did not) is adopted, never started
twice.

The pid file is in the pipe directory, which sm-sharing tenants mount and can write, so it is no witness of
health: its pid is taken when the supervisor starts or adopts a daemon and kept for as long as that process
lives, and the file is read again only after. A tenant deleting or rewriting it neither makes a live,
answering daemon look down (the node not Ready) nor has a second one started beside it, orphaning the first.

`step(now)` does one round and never sleeps: a daemon that died, or failed to start, is started again at the
earliest `backoff(failures)` seconds later, so tests drive restarts with a clock of their own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufrac import reading, retrying
from gpufrac.errors import UserError
from gpufrac.node import procfs

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"
COMMAND_TIMEOUT_S = 10.0
PID_WAIT_S = 5.0
MAX_PID_FILE_BYTES = 64  # a pid has at most 7 digits (Linux's pid_max is 2**22)


@dataclass(frozen=True)
class DaemonSpec:
    """One control daemon. `pinned_limit_mib` sets `set_default_device_pinned_mem_limit` on each of
    `devices` (ordinals as the daemon sees them); None leaves the default to each client's environment."""

    name: str
    pipe_directory: Path
    log_directory: Path
    active_thread_percentage: int | None = None
    pinned_limit_mib: int | None = None
    devices: Sequence[int] = ()

    def commands(self) -> list[str]:
        """The configuration sent after every start."""
        lines = []
        if self.active_thread_percentage is not None:
            lines.append(f"set_default_active_thread_percentage {self.active_thread_percentage}")
        if self.pinned_limit_mib is not None:
            lines += [
                f"set_default_device_pinned_mem_limit {d} {self.pinned_limit_mib}M" for d in self.devices
            ]
        return lines


def backoff(failures: int, *, initial: float = 1.0, ceiling: float = 60.0) -> float:
    """Seconds before start number `failures + 1`: 1, 2, 4, ... up to a minute."""
    return retrying.doubling(max(0, failures - 1), first=initial, ceiling=ceiling)


@dataclass
class DaemonState:
    spec: DaemonSpec
    healthy: bool = False
    pid: int | None = None
    failures: int = 0  # starts that failed, or daemons that died, since the last healthy check
    not_before: float = 0.0
    starts: int = 0
    restarts: int = 0
    last_error: str = ""
    configured: list[str] = field(default_factory=list)


class Supervisor:
    def __init__(
        self,
        specs: Sequence[DaemonSpec],
        *,
        program: str = "nvidia-cuda-mps-control",
        env: Mapping[str, str] | None = None,
        proc: procfs.ProcFS | None = None,
        delay: Callable[[int], float] = backoff,
    ) -> None:
        self.program = program
        self.daemons = {spec.name: DaemonState(spec) for spec in specs}
        self._env = dict(os.environ if env is None else env)
        self._proc = proc or procfs.ProcFS()
        self._delay = delay

    def step(self, now: float) -> None:
        """Check every daemon; start the ones that are down and whose backoff has passed."""
        for state in self.daemons.values():
            if self._check(state):
                if not state.healthy:
                    log.info("MPS daemon %s is up (pid %s)", state.spec.name, state.pid)
                state.healthy, state.failures = True, 0
                continue
            if state.healthy:
                state.healthy = False
                state.failures += 1
                state.not_before = now + self._delay(state.failures)
                log.error(
                    "MPS daemon %s (pid %s) is down; restarting in %.0fs",
                    state.spec.name,
                    state.pid,
                    state.not_before - now,
                )
                continue
            if now >= state.not_before:
                self._start(state, now)

    def healthy(self, name: str) -> bool:
        state = self.daemons.get(name)
        return state is not None and state.healthy

    def send(self, name: str, command: str) -> tuple[bool, str]:
        """One command to the daemon `name`: (whether it answered, its answer or the error)."""
        return self._send(self.daemons[name].spec, [command])

    def pids(self) -> set[int]:
        """The control daemons' pids: they and their children (the MPS servers) are the agent's own."""
        return {state.pid for state in self.daemons.values() if state.pid is not None}

    def stop(self) -> None:
        """`quit` to every daemon, so MPS servers finish their clients and leave no stale pipes."""
        for state in self.daemons.values():
            if state.healthy or (state.pid is not None and self._proc.alive(state.pid)):
                ok, output = self._send(state.spec, ["quit"])
                log.info("MPS daemon %s: quit %s", state.spec.name, "sent" if ok else f"failed: {output}")
            state.healthy = False

    # --- one daemon ---------------------------------------------------------------------------------

    def _check(self, state: DaemonState) -> bool:
        """Whether the daemon answers; its pid, once the one known has ended, from the pid file (None where
        that names no live process: the file was deleted, or the daemon died)."""
        if state.pid is None or not self._proc.alive(state.pid):
            state.pid = self._live_pid(state.spec)
        ok, output = self._send(state.spec, ["get_server_list"])
        if not ok:
            state.last_error = output
        return ok

    def _start(self, state: DaemonState, now: float) -> None:
        spec = state.spec
        state.starts += 1
        if state.starts > 1:
            state.restarts += 1
        try:
            spec.pipe_directory.mkdir(parents=True, exist_ok=True)
            spec.log_directory.mkdir(parents=True, exist_ok=True)
            (spec.pipe_directory / PID_FILE).unlink(missing_ok=True)
            done = subprocess.run(
                [self.program, "-d"],
                env=self._environment(spec),
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            error = (
                "" if done.returncode == 0 else f"exit {done.returncode}: {_tail(done.stderr or done.stdout)}"
            )
        except (OSError, subprocess.SubprocessError) as exc:
            error = str(exc)
        if not error:
            state.pid = self._wait_for_pid(spec)  # this daemon's, not one still alive from before
            if state.pid is None:
                error = f"no {PID_FILE} in {spec.pipe_directory} after {PID_WAIT_S:.0f}s"
        if not error:
            ok, output = self._send(spec, spec.commands()) if spec.commands() else (True, "")
            if ok:
                state.configured = spec.commands()
                state.healthy = self._check(state)
                if state.healthy:
                    state.failures = 0
                    log.info("MPS daemon %s started (pid %s): %s", spec.name, state.pid, state.configured)
                    return
                error = f"started but not answering: {state.last_error}"
            else:
                error = f"configuration failed: {output}"
        state.failures += 1
        state.last_error = error
        state.not_before = now + self._delay(state.failures)
        log.error(
            "MPS daemon %s (%s -d) failed to start: %s; next try in %.0fs",
            spec.name,
            self.program,
            error,
            state.not_before - now,
        )

    def _send(self, spec: DaemonSpec, commands: Sequence[str]) -> tuple[bool, str]:
        """Each command through `<program>` on stdin; (all succeeded, output or the first error)."""
        outputs = []
        for command in commands:
            try:
                done = subprocess.run(
                    [self.program],
                    input=command + "\n",
                    env=self._environment(spec),
                    capture_output=True,
                    text=True,
                    timeout=COMMAND_TIMEOUT_S,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return False, f"{command}: {exc}"
            if done.returncode != 0:
                return False, f"{command}: exit {done.returncode}: {_tail(done.stderr or done.stdout)}"
            outputs.append(done.stdout.strip())
        return True, "\n".join(outputs)

    def _environment(self, spec: DaemonSpec) -> dict[str, str]:
        return {
            **self._env,
            "CUDA_MPS_PIPE_DIRECTORY": str(spec.pipe_directory),
            "CUDA_MPS_LOG_DIRECTORY": str(spec.log_directory),
        }

    def _wait_for_pid(self, spec: DaemonSpec) -> int | None:
        """The daemon forks away from `-d` and writes its pid file a moment later."""
        deadline = time.monotonic() + PID_WAIT_S
        while (pid := self._read_pid(spec)) is None:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
        return pid

    def _live_pid(self, spec: DaemonSpec) -> int | None:
        pid = self._read_pid(spec)
        return pid if pid is not None and self._proc.alive(pid) else None

    @staticmethod
    def _read_pid(spec: DaemonSpec) -> int | None:
        """The pid in the daemon's pid file, or None. The file is in the pipe directory, which sm-sharing
        tenants mount and can write, so it is read within bounds, never waited on (a pipe), and holds
        ASCII digits only (`isdigit` also holds for '²', which `int` refuses)."""
        try:
            text = reading.read_text(spec.pipe_directory / PID_FILE, limit=MAX_PID_FILE_BYTES).strip()
        except UserError:
            return None
        return int(text) if text.isascii() and text.isdigit() else None


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
