"""Host paths compared as the host resolves them (issue 11)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufrac.admission import host_paths

MPS = "/run/gpufrac/mps"


@pytest.mark.parametrize(
    ("path", "canonical"),
    [
        ("//run/gpufrac/mps", MPS),
        ("///run//gpufrac///mps//", MPS),
        ("/run/./gpufrac/mps/.", MPS),
        ("/run/gpufrac/x/../mps", MPS),
        ("/../../run/gpufrac/mps", MPS),
        ("run/gpufrac/mps", MPS),
        ("/var/run/gpufrac/mps", MPS),
        ("/var/./run/gpufrac/mps", MPS),
        ("/var/run", "/run"),
        ("/var/run/../proc/1/root", "/proc/1/root"),
        ("/var/run/../var/run/gpufrac/mps", MPS),
        ("/var/runner", "/var/runner"),
        ("", "/"),
        ("/", "/"),
    ],
)
def test_canonical(path: str, canonical: str) -> None:
    assert host_paths.canonical(path) == canonical


@pytest.mark.parametrize(
    "path",
    [
        MPS,
        "//run/gpufrac/mps",
        "/run/gpufrac/mps/0",
        "/run/gpufrac",
        "/run",
        "/",
        "/var/run",
        "/var/run/",
        "/proc",
        "/proc/1/root",
        "/proc/self/root/run/gpufrac/mps",
        "//proc/1/root/",
        "/var/../proc",
    ],
)
def test_paths_that_reach_the_mps_directory(path: str) -> None:
    assert host_paths.reaches(path, MPS) is not None


@pytest.mark.parametrize(
    "path",
    [
        "/var/log",
        "/var",
        "/run/containerd/containerd.sock",
        "/data/run/gpufrac/mps",
        "/runner",
        "/run/gpufrac-other",
        "/proc-data",
        "/run/gpufrac/mpsx",
    ],
)
def test_paths_that_do_not(path: str) -> None:
    assert host_paths.reaches(path, MPS) is None


def resolved(path: str) -> str:
    """The directory a path names on a host where /var/run links to /run, resolved part by part."""
    stack: list[str] = []
    for part in path.split("/"):
        if part == "..":
            stack = stack[:-1]
        elif part not in ("", "."):
            stack.append(part)
            if stack == ["var", "run"]:
                stack = ["run"]
    return "/" + "/".join(stack)


segments = st.sampled_from(
    ["var/run/..", "run", "gpufrac", "mps", "var", "proc", "1", "root", "x", ".", "..", ""]
)


@given(st.lists(segments, max_size=8), st.sampled_from(["", "/", "//", "///"]), st.booleans())
def test_every_spelling_of_a_path_is_judged_as_its_canonical_form(
    parts: list[str], lead: str, trailing: bool
) -> None:
    path = lead + "/".join(parts) + ("/" if trailing else "")
    canonical = host_paths.canonical(path)
    assert canonical.startswith("/") and not canonical.startswith("//")
    assert canonical == "/" or not canonical.endswith("/")
    assert not {".", "..", ""} & set(canonical.split("/")[1:]) or canonical == "/"
    assert host_paths.canonical(canonical) == canonical
    assert canonical == resolved(path)
