"""The one rule for the MPS pipe directory, which sm-sharing pods mount read-write from the host."""

from __future__ import annotations

import pytest

from gpufrac.contract import DEFAULT_MPS_PIPE_DIRECTORY, check_mps_directory
from gpufrac.errors import UserError

# Also rendered through the chart (tests/integration/test_helm_agent.py), whose schema must agree.
REFUSED = [
    "",
    "run/gpufrac/mps",  # relative
    "/",
    # Top-level directories, shared whole: /run holds the container runtime's socket.
    *("/run", "/var/run", "/tmp", "/var", "/usr", "/bin", "/lib", "/root", "/home", "/boot", "/opt"),
    # Within a system tree, or above one (/var/lib holds the kubelet's).
    *("/proc/1/root", "/sys/fs/cgroup", "/dev/shm", "/etc/kubernetes", "/var/lib/kubelet"),
    *("/var/lib/kubelet/pods", "/var/lib"),
    # Not spelled plainly: the rule would judge another directory than the one mounted.
    *("//run", "/run/gpufrac/mps/", "/run/./gpufrac", "/run/gpufrac/../..", "/var/run/.."),
]
ACCEPTED = [
    DEFAULT_MPS_PIPE_DIRECTORY,
    "/var/run/gpufrac/mps",
    "/run/gpufrac",
    "/var/lib/gpufrac/mps",
    "/var/lib/kubelet-gpufrac",
    "/opt/gpufrac",
    "/run/.gpufrac",
]


@pytest.mark.parametrize("path", REFUSED)
def test_a_directory_not_gpufracs_own_is_refused_naming_the_flag(path: str) -> None:
    with pytest.raises(UserError) as refused:
        check_mps_directory(path, flag="--flag")
    assert str(refused.value).startswith(f"--flag {path!r}: sm-sharing pods mount the MPS pipe directory")


@pytest.mark.parametrize("path", ACCEPTED)
def test_a_directory_of_its_own_is_accepted(path: str) -> None:
    check_mps_directory(path, flag="--flag")
