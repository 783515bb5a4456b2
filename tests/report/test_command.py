"""`gpufrac report` on bad input: one line and a non-zero exit, before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufrac import cli
from gpufrac.report import collect

from ..scheduler.test_cli import UNREACHABLE, gpufrac


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_missing_kubeconfig_is_one_line(tmp_path: Path) -> None:
    result = gpufrac("report", "--kubeconfig", str(tmp_path / "absent"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert (
        one_line(result.stderr)
        == f"gpufrac: --kubeconfig {tmp_path / 'absent'}: no such file; pass a readable kubeconfig"
    )
    assert not (tmp_path / "out").exists()


def test_an_unreachable_api_server_is_one_line(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    result = gpufrac("report", "--kubeconfig", str(kubeconfig), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in one_line(result.stderr)
    assert not (tmp_path / "out").exists()


def test_an_empty_out_is_refused_not_taken_for_this_folder(tmp_path: Path) -> None:
    """An unset variable in a script: the report must not land in whatever folder the script runs in."""
    result = gpufrac("report", "--kubeconfig", str(tmp_path / "absent"), "--out", "")
    assert result.returncode == 2
    assert "--out': empty; name the folder for the report" in one_line(result.stderr)


def test_an_out_folder_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("")
    result = gpufrac("report", "--kubeconfig", str(tmp_path / "absent"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2
    assert (
        one_line(result.stderr)
        == f"gpufrac: --out {tmp_path / 'out'}: a file, not a folder; pass a folder for the report"
    )


def test_out_is_required() -> None:
    result = gpufrac("report")
    assert result.returncode == 2 and "--out" in one_line(result.stderr)


@pytest.mark.parametrize(
    ("option", "url"),
    [
        ("--metrics", "node-1:9400/metrics"),
        ("--metrics", "ftp://node-1/metrics"),
        ("--prometheus", "http://"),
    ],
)
def test_a_source_that_is_not_a_url_is_one_line_before_the_cluster_is_read(
    tmp_path: Path, option: str, url: str
) -> None:
    """A typo in a flag, unlike an agent that is down, is refused: the report would otherwise be written
    with every share "not measured" and exit 0."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    result = gpufrac("report", "--kubeconfig", str(kubeconfig), "--out", str(tmp_path / "out"), option, url)
    assert result.returncode == 2
    assert one_line(result.stderr).startswith(f"gpufrac: {option} {url}: not an http:// or https:// URL")
    assert not (tmp_path / "out").exists()


def test_a_report_whose_every_usage_source_failed_is_written_but_not_a_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What was asked (memory used) was measured nowhere: exit 1, after the cluster's part is written."""
    monkeypatch.setattr(collect, "read_cluster", lambda kubeconfig: ([], []))
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", "--out", str(tmp_path / "out"), "--metrics", "http://127.0.0.1:1/metrics"])
    assert exited.value.code == 1
    assert "none of the 1 --metrics/--prometheus source(s) could be read" in capsys.readouterr().err
    assert any((tmp_path / "out").iterdir())
