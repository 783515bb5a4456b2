"""gpufrac agent's flags: bad ones are one line and exit 2, never a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufrac import cli
from gpufrac.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-name", "n", "--nvml", "bogus"], "--nvml 'bogus': use 'real' or 'fake:FILE'"),
        (["--node-name", " "], "--node-name is empty"),
        (["--node-name", "n", "--interval", "0"], "--interval 0.0: must be more than 0 and at most 3600"),
        (["--node-name", "n", "--interval", "nan"], "--interval nan: must be more than 0"),
        (["--node-name", "n", "--kubeconfig", "no-such-file"], "--kubeconfig no-such-file: no such file"),
        (["--node-name", "n", "--native-label", "novalue"], "--native-label 'novalue': give KEY=VALUE"),
        (["--node-name", "n", "--native-label", "=x"], "--native-label '=x': give KEY=VALUE"),
        (["--node-name", "n", "--proc-root", "no-such-folder"], "--proc-root no-such-folder: no such folder"),
        (
            ["--node-name", "n", "--mps-pipe-directory", "/var/run/"],
            "--mps-pipe-directory '/var/run': sm-sharing",
        ),
    ],
)
def test_bad_flags(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["agent", *args])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(f"gpufrac: {message}")


def test_a_busy_metrics_port(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["agent", "--node-name", "n", "--kubeconfig", str(kubeconfig), "--mps-control", ""]
        result = CliRunner().invoke(app, [*args, "--metrics-port", str(port), "--nvml", f"fake:{tmp_path}/x"])
    assert result.exit_code == 2
    assert f"gpufrac: --metrics-port {port}: cannot listen" in result.output


UNREACHABLE = (
    "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
    "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
    "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
)
ONE_GPU = "driver_version: '535.104.05'\ngpus: [{index: 0, uuid: GPU-0, model: T4, memory_mib: 16384}]\n"


@pytest.mark.parametrize(
    ("scenario", "says", "enforcement"),
    [
        (None, "No such file or directory", "none"),
        ("gpus: [\n", "not valid YAML", "none"),
        ("gpus: 5\n", "fake NVML file", "none"),
        ("gpus: [{index: 0}]\n", "fake NVML file", "none"),
        ("nvml_error: driver gone\n", "NVML unavailable: driver gone", "none"),
        ("a: &a [*a]\n", "inside its own anchor", "none"),
        (ONE_GPU, "cannot read Node n", "watchdog"),
        ("{}\n", "cannot read Node n", "none"),  # no GPUs: nothing is guarded, so nothing is claimed
    ],
    ids=[
        "missing",
        "not YAML",
        "gpus not a list",
        "gpu without uuid",
        "NVML error",
        "recursive",
        "API",
        "empty",
    ],
)
def test_once_exits_1_when_the_check_could_not_do_its_job(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, scenario: str | None, says: str, enforcement: str
) -> None:
    """NVML unreadable (or the fake scenario missing or malformed) or the API unreachable: the summary is
    printed, then one line says what failed, and the exit status is 1."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    nvml = tmp_path / "nvml.yaml"
    if scenario is not None:
        nvml.write_text(scenario)
    args = ["agent", "--node-name", "n", "--once", "--kubeconfig", str(kubeconfig), "--nvml", f"fake:{nvml}"]
    with pytest.raises(SystemExit) as exited:
        cli.main([*args, "--mps-control", "", "--log-level", "error"])
    out, err = capsys.readouterr()
    assert exited.value.code == 1
    assert json.loads(out)["enforcement"] == enforcement
    lines = [line for line in err.splitlines() if line.startswith("gpufrac: ")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith("gpufrac: the check did not do its job: ") and says in lines[0]
