"""The Kubernetes-facing commands fail with one clear line when they cannot reach a cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
users: [{name: u, user: {token: t}}]
"""


def gpufrac(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("command", ["scheduler", "top"])
def test_a_missing_kubeconfig_is_one_line_naming_the_file(command: str, tmp_path: Path) -> None:
    result = gpufrac(command, "--kubeconfig", str(tmp_path / "absent"))
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == f"gpufrac: --kubeconfig {tmp_path / 'absent'}: no such file; pass a readable kubeconfig"
    )


@pytest.mark.parametrize("command", ["scheduler", "top"])
def test_an_unreachable_api_server_is_one_line_naming_the_server(command: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    result = gpufrac(command, "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("command", ["scheduler", "top"])
def test_a_server_that_is_not_kubernetes_is_one_line(
    command: str, not_kubernetes: str, tmp_path: Path
) -> None:
    """lightkube reads such answers with a KeyError (no Content-Type), an HTTPStatusError (HTML), or a
    DecodeError (a page, or JSON that is not an object): each must be the one line an unreachable server
    gets, not a traceback."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE.replace("https://127.0.0.1:1", not_kubernetes))
    result = gpufrac(command, "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]  # the scheduler logs its requests before it
    assert last.startswith(
        f"gpufrac: cannot reach the Kubernetes API server at {not_kubernetes} (it answered"
    )
    assert "not a Kubernetes API server" in last


def test_a_broken_kubeconfig_and_bad_options_are_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not: [a kubeconfig")
    broken = gpufrac("top", "--kubeconfig", str(kubeconfig))
    assert (
        broken.returncode == 2
        and "not a usable kubeconfig" in broken.stderr
        and "Traceback" not in broken.stderr
    )
    policy = gpufrac("scheduler", "--kubeconfig", str(kubeconfig), "--policy", "nope")
    assert policy.returncode == 2 and "--policy nope: unknown" in policy.stderr
    selector = gpufrac("scheduler", "--kubeconfig", str(kubeconfig), "--node-selector", "novalue")
    assert selector.returncode == 2 and "expected key=value pairs" in selector.stderr
    for option, value, said in [
        ("--namespace", "Not_A_Namespace", "--namespace 'Not_A_Namespace': not a namespace name"),
        ("--reservation-idle-seconds", "nan", "--reservation-idle-seconds nan: must be 0 to 3600"),
        ("--reservation-idle-seconds", "-1", "--reservation-idle-seconds -1.0: must be 0 to 3600"),
        ("--max-moves", "11", "--max-moves 11: must be 0 (never evict) to 10"),
        ("--min-runtime", "nan", "--min-runtime nan: must be 0 to 86400 seconds"),
        ("--whole-gpu-reserve", "nan", "--whole-gpu-reserve nan: must be 0 (off) to 100 percent"),
        ("--whole-gpu-reserve", "101", "--whole-gpu-reserve 101.0: must be 0 (off) to 100 percent"),
        ("--agent-heartbeat-timeout", "inf", "--agent-heartbeat-timeout inf: must be 0 to 86400 seconds"),
    ]:
        refused = gpufrac("scheduler", "--kubeconfig", str(kubeconfig), option, value)
        assert refused.returncode == 2 and said in refused.stderr and len(refused.stderr.splitlines()) == 1


@pytest.mark.parametrize("command", [["scheduler"], ["agent", "--node-name", "n1"]])
def test_a_bad_log_level_is_one_line(command: list[str], tmp_path: Path) -> None:
    result = gpufrac(*command, "--kubeconfig", str(tmp_path / "absent"), "--log-level", "loud")
    assert result.returncode == 2
    assert result.stderr.strip() == "gpufrac: --log-level loud: choose debug, info, warning or error"


UNAUTHORIZED = (
    401,
    "application/json",
    b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized",'
    b'"reason":"Unauthorized","code":401}',
)


@pytest.mark.parametrize("not_kubernetes", [UNAUTHORIZED], indirect=True, ids=["401"])
@pytest.mark.parametrize("command", ["scheduler", "top"])
def test_credentials_the_api_server_refuses_are_one_line_naming_the_kubeconfig(
    command: str, not_kubernetes: str, tmp_path: Path
) -> None:
    """An expired token: the scheduler took the 401 of its start-up check as proof the server was there,
    then retried its watches for ever, never ready, with no word of the token."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE.replace("https://127.0.0.1:1", not_kubernetes))
    result = gpufrac(command, "--kubeconfig", str(kubeconfig))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"gpufrac: the Kubernetes API server at {not_kubernetes} does not accept the credentials of the "
        f"kubeconfig {kubeconfig} (401 Unauthorized"
    )
    assert last.endswith("log in again, or fix the user there")
