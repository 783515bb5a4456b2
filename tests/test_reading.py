"""Files and YAML read within bounds: every hostile input is one UserError line, fast, never a traceback,
a hang or a huge allocation. The cases are the ones `gpufrac validate` once failed on; the properties run
`validate` on arbitrary text and bytes."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufrac import reading, validate
from gpufrac.errors import UserError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
POD = "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, annotations: {{gpu-fraction: {value}}}}}\n"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('a: "\x00"\n', ": not valid YAML: unacceptable character #x0000"),
        ("[" * 5000 + "]" * 5000, "not valid YAML: exceeded maximum nesting depth"),
        ("a: " + "[" * 150 + "]" * 150, "1: nested more than 100 deep; flatten it"),
        (f"x: {'9' * 5000}\n", "1: not valid YAML: a number of 5000 characters; write at most 100"),
        (LAUGHS, "aliases expand to more than 100000 values; write the values out"),
        (LAUGHS + POD.format(value="*i"), "aliases expand to more than 100000 values"),
        ("a: &a [*a]\n", "1: the alias *a is inside its own anchor"),
        ("a: &a {b: *a}\n", "1: the alias *a is inside its own anchor"),
        ("a: *nowhere\n", "not valid YAML"),
    ],
    ids=[
        "NUL",
        "5000 deep",
        "150 deep",
        "huge integer",
        "laughs",
        "laughs in a pod",
        "recursive",
        "map",
        "no anchor",
    ],
)
def test_hostile_yaml_is_one_line(text: str, says: str) -> None:
    with pytest.raises(UserError) as raised:
        list(reading.yaml_documents(text, name="f.yaml"))
    message = str(raised.value)
    assert message.startswith("f.yaml") and says in message and "\n" not in message


def test_aliases_within_the_bound_and_quoted_numbers_are_read() -> None:
    text = "a: &a [1, 2]\nb: *a\nc: &c {x: *a}\nd: *c\nn: '" + "9" * 200 + "'\nm: 123456789012345678901\n"
    (data,) = [data for _, data in reading.yaml_documents(text, name="f")]
    assert data == {
        "a": [1, 2],
        "b": [1, 2],
        "c": {"x": [1, 2]},
        "d": {"x": [1, 2]},
        "n": "9" * 200,
        "m": 123456789012345678901,
    }


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (Path("/dev/zero"), "--x /dev/zero: more than 1 MiB; pass a smaller file (or split it)"),
        (Path("/nonexistent/file"), "--x /nonexistent/file: no such file; check the path"),
        (Path("/"), "--x /: is a folder; pass a file"),
    ],
)
def test_files_are_read_with_a_bounded_read(path: Path, says: str) -> None:
    with pytest.raises(UserError) as raised:
        reading.read_text(path, limit=reading.MIB, what="--x")
    assert str(raised.value) == says


def test_a_file_just_within_the_limit_is_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"a" * 100)
    assert reading.read_text(tmp_path / "f", limit=100) == "a" * 100
    (tmp_path / "f").write_bytes(b"a" * 101)
    with pytest.raises(UserError, match="more than 100 bytes"):
        reading.read_text(tmp_path / "f", limit=100)


def test_validate_refuses_a_file_over_its_limit_without_reading_it_all(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)  # 50 MB, sparse
    with pytest.raises(UserError, match=r"big\.yaml: more than 4 MiB"):
        validate.check_paths([big])


def _assert_clean_outcome(text: str) -> None:
    try:
        for problems in validate.check_text(text, file="f.yaml"):
            for problem in problems:
                assert str(problem)
    except UserError as error:
        assert str(error).startswith("f.yaml") and "\n" not in str(error)


YAMLISH = st.text(alphabet=st.sampled_from([*"ab:- &*[]{},'\"\n#!|>9.0", "\x00", "\t", "é"]), max_size=80)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200) | YAMLISH)
def test_validate_on_any_text_gives_problems_or_one_line(text: str) -> None:
    _assert_clean_outcome(text)


PODISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "kind",
                    "metadata",
                    "spec",
                    "annotations",
                    "containers",
                    "name",
                    "gpu-fraction",
                    "gpu-memory",
                    "resources",
                    "limits",
                    "nvidia.com/gpu",
                    "template",
                    "items",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(PODISH, st.sampled_from(["Pod", "Deployment", "List", "CronJob"]))
def test_validate_on_any_manifest_shape_gives_problems_or_one_line(body: object, kind: str) -> None:
    document = {"kind": kind, "spec": {"template": body}, "metadata": body, "items": [body]}
    _assert_clean_outcome(yaml.safe_dump(document))


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_validate_on_any_bytes_gives_problems_or_one_line(
    tmp_path_factory: pytest.TempPathFactory, data: bytes
) -> None:
    path = tmp_path_factory.mktemp("bytes") / "f.yaml"
    path.write_bytes(data)
    try:
        validate.check_paths([path])
    except UserError as error:
        assert "\n" not in str(error)


@pytest.mark.parametrize("date", ["2001-13-45", "!!timestamp 99999-01-01", "2024-05-01T12:00:00Z"])
def test_a_date_is_read_as_its_text(date: str) -> None:
    """As Kubernetes reads YAML (through JSON, which has no dates); PyYAML would raise on impossible ones."""
    assert reading.load_yaml(f"a: {date}\n", name="t.yaml") == {"a": date.removeprefix("!!timestamp ")}


def test_a_file_swapped_for_a_pipe_after_a_look_at_it_is_refused_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone who can write the folder (a tenant, in the MPS pipe directory) swaps a file for a pipe
    between a check of the path and its opening: what counts is the file opened, and it never waits."""
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    monkeypatch.setattr(Path, "stat", lambda self, **_: os.stat(__file__))  # the look, before the swap
    refusals: list[UserError] = []

    def attempt() -> None:
        try:
            reading.read_text(fifo, limit=9)
        except UserError as error:
            refusals.append(error)

    read = threading.Thread(target=attempt, daemon=True)
    read.start()
    read.join(timeout=10)
    if read.is_alive():
        os.close(os.open(fifo, os.O_WRONLY))  # the writer the open waits for, so the thread ends
        pytest.fail("reading waited for a writer")
    assert [str(error) for error in refusals] == [f"{fifo}: is a pipe or socket, not a file; pass a file"]


def test_a_socket_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        with pytest.raises(UserError, match="is a pipe or socket, not a file"):
            reading.read_text(path, limit=100)


def test_a_pipe_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is a pipe or socket, not a file"):
        reading.read_text(fifo, limit=100)


def test_a_key_twice_in_one_mapping_is_refused_at_its_second_line() -> None:
    """As kubectl refuses it. PyYAML kept the last, while the lines reported pointed at the first; a List
    with two `items:` made `gpufrac validate` fail with a traceback."""
    text = "kind: List\nitems:\n- {kind: Pod}\nitems:\n- {kind: Pod}\n- {kind: Pod}\n"
    with pytest.raises(
        UserError, match=r"^list.yaml:4: not valid YAML: the key 'items' is there twice; keep one$"
    ):
        reading.load_yaml(text, name="list.yaml")
    merged = reading.load_yaml("base: &b {x: 1}\nmine:\n  <<: *b\n  x: 2\n", name="merge.yaml")
    assert merged == {"base": {"x": 1}, "mine": {"x": 2}}  # a merge key's values may be overridden
