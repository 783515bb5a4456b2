"""The MPS supervisor against a fake nvidia-cuda-mps-control that records what it is told."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpufrac.node import mps, procfs
from gpufrac.node.mps import DaemonSpec, Supervisor

FAKE = Path(__file__).with_name("fake-mps-control")


class Daemon:
    """One fake daemon's directories, and what the test can see of it."""

    def __init__(self, root: Path) -> None:
        # A short path: unix socket paths are limited to 107 bytes.
        self.spec = DaemonSpec(
            name="sm-sharing",
            pipe_directory=root / "pipe",
            log_directory=root / "log",
            active_thread_percentage=50,
            pinned_limit_mib=4096,
            devices=(0, 1),
        )

    def commands(self) -> list[str]:
        path = self.spec.pipe_directory / "commands.log"
        return path.read_text().splitlines() if path.exists() else []

    def pid(self) -> int | None:
        path = self.spec.pipe_directory / mps.PID_FILE
        return int(path.read_text()) if path.exists() else None

    def kill(self) -> None:
        pid = self.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        for _ in range(200):  # the fake daemon is reparented to init, which reaps it
            if not procfs.ProcFS().alive(pid):
                return
            time.sleep(0.01)


@pytest.fixture
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    made = Daemon(Path(tmp_path_factory.mktemp("mps")))
    yield made
    pid = made.pid()
    if pid is not None and procfs.ProcFS().alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_start_configures_the_daemon_in_its_own_directories(daemon: Daemon) -> None:
    sup = Supervisor([daemon.spec], program=str(FAKE))
    sup.step(now=0)
    assert sup.healthy("sm-sharing")
    assert daemon.commands() == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 4096M",
        "set_default_device_pinned_mem_limit 1 4096M",
        "get_server_list",
    ]
    assert (daemon.spec.log_directory / "control.log").read_text().startswith("started pid")
    assert sup.pids() == {daemon.pid()}
    sup.step(now=1)  # healthy: only checked
    assert daemon.commands()[-1] == "get_server_list" and sup.daemons["sm-sharing"].starts == 1

    sup.stop()
    assert daemon.commands()[-1] == "quit"
    assert daemon.pid() is None


def test_a_dead_daemon_is_restarted_after_a_backoff_and_configured_again(daemon: Daemon) -> None:
    sup = Supervisor([daemon.spec], program=str(FAKE), delay=lambda failures: 10.0 * failures)
    sup.step(now=0)
    first = daemon.pid()
    daemon.kill()

    sup.step(now=100)
    assert not sup.healthy("sm-sharing")
    sup.step(now=109)  # backoff: 10 s after the first failure
    assert not sup.healthy("sm-sharing") and sup.daemons["sm-sharing"].starts == 1
    sup.step(now=110)
    assert sup.healthy("sm-sharing") and daemon.pid() not in (None, first)
    state = sup.daemons["sm-sharing"]
    assert (state.starts, state.restarts, state.failures) == (2, 1, 0)
    assert daemon.commands().count("set_default_active_thread_percentage 50") == 2
    sup.stop()


def test_failed_starts_back_off_longer_each_time(daemon: Daemon) -> None:
    daemon.spec.pipe_directory.mkdir(parents=True)
    (daemon.spec.pipe_directory / "fail-start").touch()
    sup = Supervisor([daemon.spec], program=str(FAKE))  # the real backoff: 1, 2, 4 s
    starts = []
    for now in range(0, 8):
        before = sup.daemons["sm-sharing"].starts
        sup.step(now=now)
        if sup.daemons["sm-sharing"].starts > before:
            starts.append(now)
    assert starts == [0, 1, 3, 7]
    assert "told to fail" in sup.daemons["sm-sharing"].last_error

    (daemon.spec.pipe_directory / "fail-start").unlink()
    sup.step(now=14)
    assert not sup.healthy("sm-sharing")  # still waiting: 8 s after the fourth failure
    sup.step(now=15)
    assert sup.healthy("sm-sharing")
    sup.stop()


def test_a_running_daemon_is_adopted_not_started_twice(daemon: Daemon) -> None:
    Supervisor([daemon.spec], program=str(FAKE)).step(now=0)
    pid = daemon.pid()
    again = Supervisor([daemon.spec], program=str(FAKE))  # the agent restarted; the daemon did not
    again.step(now=0)
    assert again.healthy("sm-sharing") and daemon.pid() == pid
    assert again.daemons["sm-sharing"].starts == 0
    again.stop()


@pytest.fixture
def started(daemon: Daemon) -> Iterator[tuple[Supervisor, int]]:
    """A supervisor with its daemon started, and the daemon's pid; the daemon is killed after the test
    whatever the pid file says then."""
    sup = Supervisor([daemon.spec], program=str(FAKE))
    sup.step(now=0)
    pid = daemon.pid()
    assert sup.healthy("sm-sharing") and pid is not None
    yield sup, pid
    if procfs.ProcFS().alive(pid):
        os.kill(pid, signal.SIGKILL)


def _quit(daemon: Daemon, sup: Supervisor, pid: int) -> None:
    """`stop()` quits the very daemon started, which then ends."""
    sup.stop()
    assert daemon.commands()[-1] == "quit"
    for _ in range(500):
        if not procfs.ProcFS().alive(pid):
            return
        time.sleep(0.01)
    pytest.fail(f"daemon {pid} did not quit")


def test_a_tenant_deleting_the_pid_file_neither_downs_the_daemon_nor_starts_another(
    daemon: Daemon, started: tuple[Supervisor, int]
) -> None:
    """The pipe directory is mounted writable into sm-sharing containers."""
    sup, pid = started
    for now in (10.0, 20.0, 30.0):
        (daemon.spec.pipe_directory / mps.PID_FILE).unlink(missing_ok=True)
        sup.step(now=now)
        assert sup.healthy("sm-sharing") and sup.pids() == {pid}
    assert sup.daemons["sm-sharing"].starts == 1
    assert (daemon.spec.log_directory / "control.log").read_text().count("started pid") == 1
    _quit(daemon, sup, pid)


def test_a_pid_file_rewritten_by_a_tenant_does_not_change_the_daemons_pid(
    daemon: Daemon, started: tuple[Supervisor, int]
) -> None:
    sup, pid = started
    with subprocess.Popen(["sleep", "60"]) as other:  # a live process, not MPS
        try:
            (daemon.spec.pipe_directory / mps.PID_FILE).write_text(f"{other.pid}\n")
            sup.step(now=10)
            assert sup.healthy("sm-sharing") and sup.pids() == {pid}
            _quit(daemon, sup, pid)
        finally:
            other.kill()


def test_an_answering_daemon_without_a_pid_file_is_adopted_not_started_again(
    daemon: Daemon, started: tuple[Supervisor, int]
) -> None:
    """The tenant deleted the pid file, then the agent restarted."""
    _, pid = started
    (daemon.spec.pipe_directory / mps.PID_FILE).unlink()
    again = Supervisor([daemon.spec], program=str(FAKE))
    again.step(now=0)
    assert again.healthy("sm-sharing") and again.daemons["sm-sharing"].starts == 0
    assert (daemon.spec.log_directory / "control.log").read_text().count("started pid") == 1
    _quit(daemon, again, pid)


def test_a_missing_program_fails_cleanly(daemon: Daemon) -> None:
    sup = Supervisor([daemon.spec], program=str(daemon.spec.pipe_directory / "no-such-program"))
    sup.step(now=0)
    assert not sup.healthy("sm-sharing") and "No such file" in sup.daemons["sm-sharing"].last_error
    sup.stop()


@pytest.mark.parametrize(
    "plant",
    [
        pytest.param(lambda path: path.write_text("\u00b2"), id="a digit int() refuses"),
        pytest.param(lambda path: path.write_text("9" * 5000), id="5000 digits"),
        pytest.param(os.mkfifo, id="a pipe no one writes"),
    ],
)
def test_a_pid_file_a_tenant_planted_is_no_pid(tmp_path: Path, plant: Callable[[Path], object]) -> None:
    """The pid file is in the pipe directory, which sm-sharing tenants mount and can write: what it holds
    must not fail the supervisor's step (and the agent's tick with it, so the watchdog never judges again)
    nor hang it. The daemon counts as not running, and a start is tried."""
    spec = DaemonSpec("sm-sharing", pipe_directory=tmp_path / "pipe", log_directory=tmp_path / "log")
    spec.pipe_directory.mkdir()
    pid_file = spec.pipe_directory / mps.PID_FILE
    plant(pid_file)
    sup = Supervisor([spec], program=str(tmp_path / "no-such-program"))
    stepped = threading.Thread(target=sup.step, args=(0,), daemon=True)
    stepped.start()
    stepped.join(timeout=10)
    if stepped.is_alive():
        os.close(os.open(pid_file, os.O_WRONLY))  # the writer the read waits for, so the thread ends
        stepped.join()
        pytest.fail("the supervisor's step hung on the pid file")
    assert "No such file" in sup.daemons["sm-sharing"].last_error


def test_backoff() -> None:
    assert [mps.backoff(n) for n in (1, 2, 3, 4, 7, 8, 20, 2000)] == [1, 2, 4, 8, 60, 60, 60, 60]
    assert DaemonSpec("x", Path("p"), Path("l")).commands() == []
