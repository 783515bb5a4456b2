"""hack/gpu-check on a machine without a GPU: one clear FAIL line per check, no traceback, exit 1.

On a GPU machine it is run by hand (or with the device tool); see its docstring.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufrac.node import nvml

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "gpu-check"


def test_without_a_gpu_every_check_fails_clearly(tmp_path: Path) -> None:
    backend = nvml.RealBackend()
    try:
        if not backend.sample().error:
            pytest.skip("this machine has a GPU; run hack/gpu-check itself")
    finally:
        backend.close()
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stderr
    assert [line.split(":")[0] for line in lines] == [
        "FAIL nvml",
        "FAIL mps-client",
        "FAIL mps-pinned-limit",
        "FAIL watchdog",
        "FAIL interference",
    ]
    assert "NVML unavailable" in lines[0]
    assert "pip install cupy-cuda12x" in lines[4] or "CUDA" in lines[4]
    assert "Traceback" not in done.stdout + done.stderr


def test_the_client_says_why_it_cannot_allocate() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--client", "1"], capture_output=True, text=True, timeout=60
    )
    if done.returncode == 0:
        pytest.skip("this machine has a working CUDA driver")
    assert done.returncode == 1 and done.stdout.strip() != "" and "Traceback" not in done.stderr
