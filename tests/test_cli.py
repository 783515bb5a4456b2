"""Every command, given bad input of each class, answers with one line and a non-zero exit, never a
traceback or a hang: flags out of range, files that are missing, folders, endless or too large, and
kubeconfigs that are missing, have no current context or name an unreachable server.

The program is run as `gpufrac` runs it (`cli.main`), in this process: stderr is what a person sees.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufrac import cli
from gpufrac.errors import one_line
from gpufrac.kubeapi import client as kube_client

KUBECONFIG = """
apiVersion: v1
kind: Config
{current}
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:1"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: {cluster}, user: u}}}}]
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        cli.main(list(args))
    code = exited.value.code
    return (code if isinstance(code, int) else 1), capsys.readouterr().err


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    assert code != 0
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and " ERROR " not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith("gpufrac: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One file of each kind a command can be handed by mistake (the big one sparse, so cheap to make)."""
    folder = tmp_path_factory.mktemp("files")
    big = folder / "big.yaml"
    with big.open("wb") as out:
        out.write(b"# ")
        out.truncate(70 * 1024 * 1024)
    return {"missing": folder / "absent", "folder": folder, "endless": Path("/dev/zero"), "big": big}


FILE_ANSWERS = {
    "missing": "no such file",
    "folder": "folder",
    "endless": "more than",
    "big": "more than",
}


FILE_COMMANDS = [
    ("validate", "{path}"),
    ("simulate", "--nodes", "{path}", "--seeds", "1"),
    ("simulate", "--pods", "{path}", "--seeds", "1"),
    ("plan", "--pods", "{path}"),
    ("top", "--kubeconfig", "{path}"),
    ("report", "--out", "/nonexistent/gpufrac-report", "--kubeconfig", "{path}"),
    ("scheduler", "--kubeconfig", "{path}"),
    ("agent", "--node-name", "n", "--once", "--kubeconfig", "{path}"),
    ("webhook", "--generate-certs", "--hosts", "h", "--secret", "ns/s", "--kubeconfig", "{path}"),
]


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        pytest.param(command, kind, id=f"{' '.join(p for p in command if not p.startswith('{'))}-{kind}")
        for command in FILE_COMMANDS
        for kind in FILE_ANSWERS
        if (command[0], kind) != ("validate", "folder")  # validate reads folders: see test_validate
    ],
)
def test_a_bad_file_is_one_line(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], command: tuple[str, ...], kind: str
) -> None:
    args = [part.format(path=files[kind]) for part in command]
    assert_one_line(*run(capsys, *args), str(files[kind]), FILE_ANSWERS[kind])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("webhook", "--port", "99999"), "'--port'"),
        (("webhook", "--port", "-1"), "'--port'"),
        (("scheduler", "--metrics-port", "70000"), "'--metrics-port'"),
        (("agent", "--node-name", "n", "--metrics-port", "65536"), "'--metrics-port'"),
        (("agent", "--node-name", "n", "--mps-thread-percentage", "101"), "'--mps-thread-percentage'"),
        (("agent", "--node-name", "n", "--mps-pinned-limit-mib", "0"), "'--mps-pinned-limit-mib'"),
        (("agent", "--node-name", "n", "--interval", "nan"), "--interval nan"),
        (("agent", "--node-name", "n", "--interval", "1e300"), "at most 3600"),
        (("agent", "--node-name", "n", "--cuda-context-mib", "999999999999"), "'--cuda-context-mib'"),
        (("webhook", "--fraction-reference-mib", "99999999999999999999"), "'--fraction-reference-mib'"),
        (("simulate", "--seeds", "1-99999999999"), "more than 1000 seeds"),
        (("simulate", "--seeds", "9" * 5000), "expected numbers"),
        (("plan", "--seeds", "0-5000"), "more than 1000 seeds"),
        (("simulate", "--inflation", "nan"), "--inflation nan"),
        (("simulate", "--inflation", "abc"), "'--inflation'"),
        (("simulate", "--inflation", "1e300"), "at most 10.0"),
        (("plan", "--price-per-gpu-hour", "inf"), "--price-per-gpu-hour"),
        (("plan", "--trusted-share", "nan"), "--trusted-share"),
        (("simulate", "--workers", "-3"), "--workers"),
        (("validate", "--format", "xml", "."), "'--format'"),
        (("validate",), "Missing argument"),
        (("agent",), "--node-name"),
        (("no-such-command",), "No such command"),
        # Accepted, each made a scheduler that waited for ever on pods or nodes no object can match: a Node or
        # Namespace label has Kubernetes' syntax, and an empty schedulerName is defaulted to kube-scheduler's.
        (("scheduler", "--node-selector", "gpu = true"), "'gpu ' is not a label key"),
        (("scheduler", "--node-selector", "gpu=a b"), "'a b' is not a label value"),
        (("scheduler", "--fault-domain-label", "team name"), "'team name' is not a label key"),
        (("scheduler", "--scheduler-name", " "), "--scheduler-name"),
        (("webhook", "--scheduler-name", ""), "--scheduler-name"),
        (("validate", "--no-such-flag", "."), "No such option"),
    ],
)
def test_a_bad_flag_is_one_line(capsys: pytest.CaptureFixture[str], args: tuple[str, ...], says: str) -> None:
    code, err = run(capsys, *args)
    assert code == 2
    assert_one_line(code, err, says)


KUBECONFIG_CASES = {
    "no current context": ("", "c", "no current-context; pick one with `kubectl config use-context NAME`"),
    "unknown context": ("current-context: other", "c", "not a usable kubeconfig (Context 'other' not found)"),
    "unknown cluster": ("current-context: c", "gone", "its context names 'gone', which it does not define"),
    "unreachable": (
        "current-context: c",
        "c",
        "cannot reach the Kubernetes API server at https://127.0.0.1:1",
    ),
}
KUBECONFIG_COMMANDS = [
    ("top",),
    ("report", "--out", "/nonexistent/gpufrac-report"),
    ("scheduler", "--metrics-port", "0"),
    ("webhook", "--generate-certs", "--hosts", "h", "--secret", "ns/s"),
    ("agent", "--node-name", "n", "--once", "--mps-control", ""),
]


@pytest.mark.parametrize(
    ("command", "current", "cluster", "says"),
    [
        pytest.param(command, *case, id=f"{command[0]}-{name}")
        for command in KUBECONFIG_COMMANDS
        for name, case in KUBECONFIG_CASES.items()
        # an agent that cannot reach the API still checks NVML: see tests/node/test_command.py
        if (command[0], name) != ("agent", "unreachable")
    ],
)
def test_a_bad_kubeconfig_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: tuple[str, ...],
    current: str,
    cluster: str,
    says: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG.format(current=current, cluster=cluster))
    code, err = run(capsys, *command, "--kubeconfig", str(kubeconfig))
    assert_one_line(code, err, says if "reach" in says else f"{kubeconfig}: {says}")


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (("top",), "cannot reach the Kubernetes API server at"),
        (("report", "--out", "report"), "cannot reach the Kubernetes API server at"),
        (("webhook", "--generate-certs", "--hosts", "h", "--secret", "ns/s"), "cannot reach"),
        (
            ("agent", "--node-name", "n", "--once", "--mps-control", "", "--nvml", "fake:/nonexistent"),
            "cannot read Node n",
        ),
    ],
    ids=lambda value: value[0] if isinstance(value, tuple) else "",
)
def test_a_server_that_is_not_kubernetes_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    not_kubernetes: str,
    command: tuple[str, ...],
    says: str,
) -> None:
    """A kubeconfig that points at another web service (a page, another JSON API): the one line an
    unreachable server gets, from every command that talks to the API server."""
    monkeypatch.chdir(tmp_path)
    kubeconfig = tmp_path / "kubeconfig"
    config = KUBECONFIG.format(current="current-context: c", cluster="c")
    kubeconfig.write_text(config.replace("https://127.0.0.1:1", not_kubernetes))
    code, err = run(capsys, *command, "--kubeconfig", str(kubeconfig))
    assert_one_line(code, err, says)


CONTEXTS = {
    "no user": ("{cluster: c}", "https://127.0.0.1:1", "its current context names no user"),
    "not a URL": ("{cluster: c, user: u}", "http://[::1", "is not a URL"),
    "no plugin": ("{cluster: c, user: p}", "https://127.0.0.1:1", "its credential plugin '/nonexistent'"),
    "endless token": (
        "{cluster: c, user: z}",
        "https://127.0.0.1:1",
        "its tokenFile /dev/zero is not a token",
    ),
}


@pytest.mark.parametrize("command", [("top",), ("scheduler", "--metrics-port", "0")], ids=lambda c: c[0])
@pytest.mark.parametrize(("context", "server", "says"), list(CONTEXTS.values()), ids=list(CONTEXTS))
def test_a_context_the_first_request_would_fail_on_is_one_line_before_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    command: tuple[str, ...],
    context: str,
    server: str,
    says: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users:
- {{name: u, user: {{token: t}}}}
- {{name: p, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1beta1, command: /nonexistent}}}}}}
- {{name: z, user: {{tokenFile: /dev/zero}}}}
contexts: [{{name: x, context: {context}}}]
current-context: x
"""
    )
    assert_one_line(*run(capsys, *command, "--kubeconfig", str(kubeconfig)), says)


@pytest.mark.parametrize("kind", list(FILE_ANSWERS))
def test_a_bad_certificate_file_is_one_line(
    capsys: pytest.CaptureFixture[str], files: dict[str, Path], kind: str
) -> None:
    path = str(files[kind])
    code, err = run(capsys, "webhook", "--tls-cert", path, "--tls-key", path, "--port", "0")
    assert_one_line(code, err, f"--tls-cert {path}", "cannot load them")


def test_a_certificate_that_is_a_pipe_is_refused_not_waited_on(tmp_path: Path) -> None:
    """OpenSSL opens the files it loads blocking: a pipe (a process substitution, a FIFO) for --tls-cert or
    --tls-key waited for a writer for ever, in the event loop and deaf to SIGTERM. Run apart, so that the
    wait, should it come back, fails this test instead of hanging the run."""
    pipe = tmp_path / "tls.pipe"
    os.mkfifo(pipe)
    for cert in (str(pipe), "absent.crt"):
        flags = ("--tls-cert", cert, "--tls-key", str(pipe))
        done = subprocess.run(
            [sys.executable, "-m", "gpufrac.cli", "webhook", *flags, "--port", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert "cannot load them" in done.stderr and "not a file" in done.stderr


@pytest.mark.parametrize(("level", "quiet"), [("info", True), ("warning", True), ("debug", False)])
def test_the_http_clients_request_lines_stay_out_of_the_log_but_at_debug(
    level: str, quiet: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under lightkube, the HTTP client logs every request at info: on a busy cluster, thousands a minute."""
    for name in cli.HTTP_CLIENT_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    cli.setup_logging(level)
    assert [logging.getLogger(name).level == logging.WARNING for name in cli.HTTP_CLIENT_LOGGERS] == [
        quiet
    ] * len(cli.HTTP_CLIENT_LOGGERS)


PLUGIN_CONFIG = """
clusters: [{{name: c, cluster: {{server: "https://127.0.0.1:1"}}}}]
users: [{{name: p, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1beta1, command: "{command}",
  args: {args}}}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: p}}}}]
current-context: x
"""
PLUGIN_COMMANDS = [
    ("top",),
    ("report", "--out", "/nonexistent/gpufrac-report"),
    ("scheduler", "--metrics-port", "0"),
    ("webhook", "--generate-certs", "--hosts", "h", "--secret", "ns/s"),
]


@pytest.mark.parametrize("command", PLUGIN_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(
    ("plugin", "args", "says"),
    [("false", "[]", "credential plugin failed"), ("sleep", '["600"]', "no whole answer within 0.5s")],
    ids=["fails", "never ends"],
)
def test_a_credential_plugin_that_fails_or_never_ends_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    command: tuple[str, ...],
    plugin: str,
    args: str,
    says: str,
) -> None:
    """An expired cloud login: lightkube runs the plugin at the first request, and raised out of it (a
    69-line traceback) or waited on it for ever."""
    monkeypatch.setattr(kube_client, "ONE_SHOT_SECONDS", 0.5)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(PLUGIN_CONFIG.format(command=plugin, args=args))
    assert_one_line(*run(capsys, *command, "--kubeconfig", str(kubeconfig)), says)


def test_certificate_files_that_are_one_file_are_refused_and_left_as_they_were(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_text("OLD CERT")
    key.write_text("OLD KEY")
    for flags in (("--tls-key", str(key), "--ca-cert", str(cert)), ("--tls-key", str(cert))):
        args = ("webhook", "--generate-certs", "--hosts", "h", "--tls-cert", str(cert), *flags)
        assert_one_line(*run(capsys, *args), "name the same file")
        assert (cert.read_text(), key.read_text()) == ("OLD CERT", "OLD KEY")


def test_a_quoted_cell_with_a_line_break_or_of_any_length_stays_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(f'sn,cpu_milli,memory_mib,gpu,model\nn1,"64\n000{"9" * 100_000}",262144,2,P100\n')
    code, err = run(capsys, "simulate", "--nodes", str(nodes), "--seeds", "1")
    assert_one_line(code, err, "must be a whole number", "\\n")
    assert len(err) < 2 * one_line.__defaults__[0]  # type: ignore[index]


def test_a_csv_saved_with_a_byte_order_mark_reads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Spreadsheets save CSV so: its header's first column read as "\\ufeffsn" and was missing."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_bytes(b"\xef\xbb\xbfsn,cpu_milli,memory_mib,gpu,model\nn1,64000,262144,0,\n")
    code, err = run(capsys, "simulate", "--nodes", str(nodes), "--seeds", "1")
    assert_one_line(code, err, "the node list has no GPUs")


@pytest.mark.parametrize(
    "command",
    [("simulate", "--seeds", "1"), ("report", "--kubeconfig", "/nonexistent"), ("plan",)],
    ids=lambda c: c[0],
)
def test_an_out_folder_that_cannot_be_written_is_refused_before_the_work(
    capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """Found only when the report came to be written, after the whole run (root may write anywhere but
    in /proc: a file is made there and gone at once to find out)."""
    code, err = run(capsys, *command, "--out", "/proc/gpufrac-report")
    assert_one_line(code, err, "--out /proc/gpufrac-report: cannot write in /proc")


@pytest.mark.parametrize("below", ["", "/sub"])
def test_an_out_that_is_a_link_to_nothing_is_refused_before_the_work(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, below: str
) -> None:
    """A dangling link (a report folder moved away) passed the check, as nothing there, and the report's
    folder could not be made there: 'cannot write the report (File exists)', after the whole run."""
    link = tmp_path / "report"
    link.symlink_to(tmp_path / "moved")
    code, err = run(capsys, "simulate", "--seeds", "1", "--out", f"{link}{below}")
    assert_one_line(code, err, f"--out {link}{below}: a link to nothing, not a folder")


def test_a_certificate_file_the_kubeconfig_names_is_found_beside_it_or_named_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """kubectl reads a relative path beside the kubeconfig; a missing file was `[Errno 2] No such file or
    directory`, naming none."""
    config = KUBECONFIG.format(current="current-context: c", cluster="c").replace(
        '"https://127.0.0.1:1"', '"https://127.0.0.1:1", certificate-authority: ca.crt'
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(config)
    missing = f"its certificate-authority {tmp_path / 'ca.crt'} is not a file"
    assert_one_line(*run(capsys, "top", "--kubeconfig", str(kubeconfig)), missing)
    (tmp_path / "ca.crt").write_text("not used before the connection fails")
    assert_one_line(*run(capsys, "top", "--kubeconfig", str(kubeconfig)), "cannot")


def test_one_line_escapes_only_what_a_terminal_would_act_on() -> None:
    """Line breaks, controls and bidirectional overrides are escaped; text and spaces of any script are a
    path a person may paste back."""
    assert (
        one_line("データ\u3000集計.csv, 9\u202fAM, a\u00a0b, é")
        == "データ\u3000集計.csv, 9\u202fAM, a\u00a0b, é"
    )
    assert one_line("a\nb\rc\x1b[2Jd\u202ee\u2028f") == "a\\nb\\rc\\x1b[2Jd\\u202ee\\u2028f"


def test_a_certificate_path_in_a_symlink_loop_raises_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    loop = tmp_path / "a"
    loop.symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(loop)
    args = (
        "webhook",
        "--generate-certs",
        "--hosts",
        "h",
        "--tls-cert",
        str(loop),
        "--tls-key",
        str(tmp_path / "k"),
    )
    code, err = run(capsys, *args)  # resolving it raised out of the duplicate check; writing replaces it
    assert (code, err) == (0, "") and loop.is_file() and not loop.is_symlink()


@pytest.mark.parametrize(
    "command", [["validate", "examples", "--format", "json"], ["plan", "--format", "json"]]
)
def test_output_that_cannot_be_written_is_one_line_and_a_failure(command: list[str]) -> None:
    """`> file` on a full disk: a traceback, or, for output small enough to sit in the buffer, a success
    reported before the write failed at exit."""
    root = Path(__file__).parents[1]
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "gpufrac.cli", *command],
            cwd=root,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "gpufrac: cannot write the output (No space left on device)" in done.stderr
