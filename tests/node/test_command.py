"""gpufrac agent's flags: bad ones are one line and exit 2, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufrac.cli import app


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node-name", "n", "--nvml", "bogus"], "--nvml 'bogus': use 'real' or 'fake:FILE'"),
        (["--node-name", " "], "--node-name is empty"),
        (["--node-name", "n", "--interval", "0"], "--interval 0.0: must be more than 0 and at most 3600"),
        (["--node-name", "n", "--interval", "nan"], "--interval nan: must be more than 0"),
        (["--node-name", "n", "--kubeconfig", "no-such-file"], "--kubeconfig no-such-file: no such file"),
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
