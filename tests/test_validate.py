"""`gpufrac validate`, run as a user runs it: a subprocess, its output and its exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def gpufrac(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufrac.cli", *args], capture_output=True, text=True, cwd=cwd, check=False
    )


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


BAD = """
apiVersion: v1
kind: Pod
metadata:
  name: greedy
  annotations:
    team: search
    gpu-fraction: "1.5"
spec:
  containers:
    - name: app
      image: busybox
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: not-a-workload
  annotations:
    gpu-fraction: "7"
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: nightly
spec:
  schedule: "0 3 * * *"
  jobTemplate:
    spec:
      template:
        metadata:
          annotations:
            gpu-memory: "8Gi"
            nvidia.com/container.job.gpu-compute.mode: mps
        spec:
          containers:
            - name: job
              image: busybox
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: fine
spec:
  template:
    metadata:
      annotations:
        gpu-fraction: "0.5"
    spec:
      containers:
        - name: app
          image: busybox
"""


GREEDY = 'gpu-fraction="1.5": must be less than 1; ask for whole GPUs with the nvidia.com/gpu resource'
NIGHTLY = 'nvidia.com/container.job.gpu-compute.mode="mps": must be exactly "time-slicing" or "sm-sharing"'


def test_the_examples_validate_clean() -> None:
    result = gpufrac("validate", str(EXAMPLES), cwd=EXAMPLES)
    assert (result.returncode, result.stdout) == (0, "")
    assert result.stderr == "gpufrac validate: 4 pod templates in 4 files: no problems\n"


def test_problems_are_reported_at_the_line_of_their_key(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", BAD)
    result = gpufrac("validate", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"bad.yaml:7: Pod/greedy: {GREEDY}",
        f"bad.yaml:32: CronJob/nightly: {NIGHTLY}",
    ]
    assert result.stderr == "gpufrac validate: 3 pod templates in 1 file: 2 errors, 0 warnings\n"


def test_json_format_lists_every_field(tmp_path: Path) -> None:
    write(tmp_path, "bad.yaml", BAD)
    result = gpufrac("validate", "--format", "json", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert json.loads(result.stdout) == [
        {
            "file": "bad.yaml",
            "line": 7,
            "kind": "Pod",
            "name": "greedy",
            "key": "gpu-fraction",
            "message": GREEDY,
            "severity": "error",
        },
        {
            "file": "bad.yaml",
            "line": 32,
            "kind": "CronJob",
            "name": "nightly",
            "key": "nvidia.com/container.job.gpu-compute.mode",
            "message": NIGHTLY,
            "severity": "error",
        },
    ]


def test_json_format_of_a_clean_run_is_an_empty_list() -> None:
    result = gpufrac("validate", "--format", "json", str(EXAMPLES), cwd=EXAMPLES)
    assert (result.returncode, json.loads(result.stdout)) == (0, [])


@pytest.mark.parametrize(
    "kind",
    ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController", "PodTemplate"],
)
def test_every_workload_kind_is_checked_through_its_pod_template(tmp_path: Path, kind: str) -> None:
    template = textwrap.dedent(
        """\
        template:
          metadata:
            annotations:
              gpu-fraction-container-name: missing
              gpu-fraction: "0.5"
          spec:
            containers:
              - name: app
        """
    )
    # A PodTemplate holds its template at the top, every other kind under `spec`.
    body = template if kind == "PodTemplate" else "spec:\n" + textwrap.indent(template, "  ")
    write(tmp_path, "workload.yaml", f"kind: {kind}\nmetadata:\n  name: w\n{body}")
    result = gpufrac("validate", "workload.yaml", cwd=tmp_path)
    assert result.returncode == 1
    line = 7 if kind == "PodTemplate" else 8
    assert result.stdout == (
        f'workload.yaml:{line}: {kind}/w: gpu-fraction-container-name="missing": no such container; the pod'
        ' has containers "app"\n'
    )


def test_items_of_a_list_are_checked(tmp_path: Path) -> None:
    write(
        tmp_path,
        "list.yaml",
        """
        apiVersion: v1
        kind: List
        items:
          - kind: Pod
            metadata:
              name: ok
              annotations: {gpu-memory: "8Gi"}
            spec:
              containers: [{name: app}]
          - kind: Pod
            metadata:
              name: broken
              annotations:
                gpu-memory: "8Gi"
                gpu-memory.limit: "4Gi"
            spec:
              containers: [{name: app}]
        """,
    )
    result = gpufrac("validate", "list.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == 'list.yaml:14: Pod/broken: gpu-memory="8Gi": request exceeds limit "4Gi"\n'


def test_a_gpu_resource_problem_points_at_the_resource(tmp_path: Path) -> None:
    write(
        tmp_path,
        "pod.yaml",
        """
        kind: Pod
        metadata:
          name: whole
        spec:
          containers:
            - name: app
              resources:
                limits:
                  nvidia.com/gpu: 1.5
        """,
    )
    result = gpufrac("validate", "pod.yaml", cwd=tmp_path)
    assert result.stdout == (
        'pod.yaml:9: Pod/whole: nvidia.com/gpu="1.5": container "app" must ask for a whole number of GPUs\n'
    )


def test_an_unquoted_number_is_an_error_at_its_line(tmp_path: Path) -> None:
    write(
        tmp_path,
        "pod.yaml",
        """
        kind: Pod
        metadata:
          name: p
          annotations:
            gpu-fraction: 0.5
        spec:
          containers: [{name: app}]
        """,
    )
    result = gpufrac("validate", "pod.yaml", cwd=tmp_path)
    assert result.stdout == (
        'pod.yaml:5: Pod/p: gpu-fraction="0.5": annotation values must be strings, not float;'
        " quote the value\n"
    )


WARNED = """
kind: Pod
metadata:
  name: copied
  annotations:
    nvidia.com/container.app.gpu-memory.request: "8192"
    nvidia.com/container.app.gpus.devices: GPU-1
spec:
  containers: [{name: app}]
"""


def test_warnings_do_not_change_the_exit_status(tmp_path: Path) -> None:
    write(tmp_path, "copied.yaml", WARNED)
    result = gpufrac("validate", "copied.yaml", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        'copied.yaml:5: Pod/copied: warning: nvidia.com/container.app.gpu-memory.request="8192":'
        " a number without a unit is bytes, so this is 1 MiB; write 8192Mi for MiB",
        'copied.yaml:6: Pod/copied: warning: nvidia.com/container.app.gpus.devices="GPU-1": is written by the'
        " scheduler at bind; remove it (the webhook refuses it from tenants)",
    ]
    assert result.stderr == "gpufrac validate: 1 pod template in 1 file: 0 errors, 2 warnings\n"


@pytest.mark.parametrize("value", ["1" * 5000, "\uff18\uff11\uff19\uff12"])
def test_a_bare_number_the_contract_refuses_is_one_error_and_no_warning(tmp_path: Path, value: str) -> None:
    # 5,000 digits once made `int` raise past Python's limit on converting them: a traceback, not a line.
    write(tmp_path, "copied.yaml", WARNED.replace('"8192"', f'"{value}"'))
    result = gpufrac("validate", "--format", "json", "copied.yaml", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    found = [(problem["severity"], problem["key"]) for problem in json.loads(result.stdout)]
    assert found == [
        ("error", "nvidia.com/container.app.gpu-memory.request"),
        ("warning", "nvidia.com/container.app.gpus.devices"),
    ]


def test_strict_turns_warnings_into_a_failure(tmp_path: Path) -> None:
    write(tmp_path, "copied.yaml", WARNED)
    result = gpufrac("validate", "--strict", "--format", "json", "copied.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert [problem["severity"] for problem in json.loads(result.stdout)] == ["warning", "warning"]


def test_folders_are_searched_recursively_for_yaml(tmp_path: Path) -> None:
    write(tmp_path, "deploy/a.yaml", "kind: Pod\nmetadata: {name: a, annotations: {gpu-fraction: '2'}}\n")
    write(tmp_path, "deploy/nested/b.yml", "kind: Pod\nmetadata: {name: b, annotations: {gpu-memory: '0'}}\n")
    write(tmp_path, "deploy/notes.txt", "not: [yaml")
    result = gpufrac("validate", "deploy", cwd=tmp_path)
    assert result.returncode == 1
    assert [line.split(": ")[0] for line in result.stdout.splitlines()] == [
        "deploy/a.yaml:2",
        "deploy/nested/b.yml:2",
    ]
    assert result.stderr.startswith("gpufrac validate: 2 pod templates in 2 files: ")


@pytest.mark.parametrize(
    ("files", "argument", "message"),
    [
        ({}, "missing.yaml", "gpufrac: missing.yaml: no such file or folder"),
        ({"empty/notes.txt": b"x"}, "empty", "gpufrac: empty: no .yaml or .yml files in this folder"),
        (
            {"broken.yaml": b"kind: Pod\nmetadata: {name: [x\n"},
            "broken.yaml",
            "gpufrac: broken.yaml:3: not valid YAML: did not find expected ',' or ']'",
        ),
        ({"binary.yaml": b"kind: \xff\xfe\n"}, "binary.yaml", "gpufrac: binary.yaml: not a UTF-8 text file"),
    ],
)
def test_unreadable_input_exits_2_with_one_line(
    tmp_path: Path, files: dict[str, bytes], argument: str, message: str
) -> None:
    for name, content in {"good.yaml": b"kind: Pod\nmetadata: {name: good}\n", **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    result = gpufrac("validate", "good.yaml", argument, cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", message + "\n")


def test_a_usage_error_exits_2(tmp_path: Path) -> None:
    assert gpufrac("validate", "--format", "xml", ".", cwd=tmp_path).returncode == 2


def test_documents_that_are_not_workloads_are_skipped(tmp_path: Path) -> None:
    write(
        tmp_path,
        "mixed.yaml",
        """
        ---
        ---
        - just
        - a list
        ---
        plain text
        ---
        kind: Pod
        metadata:
          generateName: worker-
          annotations: {gpu-fraction: "0"}
        spec: {containers: [{name: app}]}
        ---
        kind: Pod
        spec: {containers: [{name: app}]}
        metadata:
          annotations: {gpu-memory.limit: "1Gi"}
        """,
    )
    result = gpufrac("validate", "mixed.yaml", cwd=tmp_path)
    assert result.stdout.splitlines() == [
        'mixed.yaml:11: Pod/worker-: gpu-fraction="0": must be greater than 0',
        'mixed.yaml:17: Pod/(unnamed): gpu-memory.limit="1Gi": needs gpu-memory, the guaranteed amount',
    ]
    assert result.stderr == "gpufrac validate: 2 pod templates in 1 file: 2 errors, 0 warnings\n"


@pytest.mark.parametrize("template", ["", "template: [not, a, map]", "template: text"])
def test_a_workload_without_a_pod_template_is_an_error(tmp_path: Path, template: str) -> None:
    """Counted as checked and passed, it said "no problems" of a manifest the API server refuses."""
    write(tmp_path, "job.yaml", f"kind: Job\nmetadata: {{name: train}}\nspec: {{{template}}}\n")
    result = gpufrac("validate", "job.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "job.yaml:1: Job/train: spec.template: missing or not a mapping; a Job needs its pod template there"
    ]
    assert result.stderr == "gpufrac validate: 1 pod template in 1 file: 1 error, 0 warnings\n"
