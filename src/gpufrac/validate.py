"""`gpufrac validate`: check Kubernetes manifests against the annotation contract before they reach a cluster.

The webhook refuses a broken pod only once a controller tries to create it, which for a Deployment means a
ReplicaSet stuck without pods and an Event few people read. Linting the files in review or CI catches the
same mistakes, with the same rules (`contract.parse_pod`) and the line to fix.

Errors are what the webhook would refuse; like the webhook, the check stops at a template's first error.
Warnings are manifests that parse but are almost certainly wrong: a scheduler-owned key set by hand
(`gpus.devices`: the webhook refuses it from tenants, so a copied bound pod will not apply), or a bare
number under an NVIDIA memory key that, read as bytes, rounds up to 1 MiB. Warnings are printed with
`warning:` and leave the exit status alone unless `--strict` is given.

Exit status: 0 when there is no error (and, with `--strict`, no warning), 1 otherwise, 2 when an input
cannot be read at all (a missing path, invalid YAML, a file that is not UTF-8, a file over
`MAX_FILE_BYTES`, YAML nested too deep or whose aliases expand too far: see `gpufrac.reading`).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TextIO

import yaml

from gpufrac import contract, reading
from gpufrac.contract import keys, quantity
from gpufrac.errors import UserError

# Where each kind keeps its pod template (the path from the object to a {metadata, spec} map).
TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": (),
    "PodTemplate": ("template",),
    "ReplicationController": ("spec", "template"),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
MANIFEST_SUFFIXES = (".yaml", ".yml")
# Kubernetes stores no object over 1.5 MiB; a file of many is still a few MiB. Read in about two seconds.
MAX_FILE_BYTES = 4 * reading.MIB
# A bare number under a memory key, as the contract reads one (ASCII digits, at most `MAX_DIGITS`), so
# that the warning never suggests a value the contract refuses and `int` never meets a huge one.
_BARE_WHOLE_NUMBER = re.compile(rf"[0-9]{{1,{quantity.MAX_DIGITS}}}")


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Problem:
    """One finding, located at the line of the offending key (or of the object when there is none)."""

    file: str
    line: int
    kind: str
    name: str
    key: str
    message: str
    severity: Severity = Severity.ERROR

    def __str__(self) -> str:
        label = "warning: " if self.severity is Severity.WARNING else ""
        return f"{self.file}:{self.line}: {self.kind}/{self.name}: {label}{self.message}"


@dataclass
class Report:
    """What a run found, and how much it looked at, so that "no problems" can be told from "nothing read"."""

    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    templates: int = 0


def run(
    paths: Sequence[Path],
    *,
    output_format: str,
    strict: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Check `paths`, print the findings as text lines or a JSON list, and return the exit status."""
    report = check_paths(paths)
    if output_format == "json":
        print(json.dumps([asdict(problem) for problem in report.problems], indent=2), file=out)
    else:
        for problem in report.problems:
            print(problem, file=out)
    errors = sum(problem.severity is Severity.ERROR for problem in report.problems)
    warnings = len(report.problems) - errors
    found = f"{_count(errors, 'error')}, {_count(warnings, 'warning')}" if report.problems else "no problems"
    looked_at = f"{_count(report.templates, 'pod template')} in {_count(report.files, 'file')}"
    print(f"gpufrac validate: {looked_at}: {found}", file=err)
    return 1 if errors or (strict and warnings) else 0


def check_paths(paths: Sequence[Path]) -> Report:
    """Check every manifest file named in `paths` or found under the folders among them, in order."""
    report = Report()
    for path in manifest_files(paths):
        text = reading.read_text(path, limit=MAX_FILE_BYTES)
        report.files += 1
        for problems in check_text(text, file=str(path)):
            report.templates += 1
            report.problems.extend(problems)
    return report


def manifest_files(paths: Sequence[Path]) -> list[Path]:
    """The files to read: each file as named, and every *.yaml and *.yml under each folder, sorted."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(
                child for child in path.rglob("*") if child.suffix in MANIFEST_SUFFIXES and child.is_file()
            )
            if not found:
                raise UserError(f"{path}: no .yaml or .yml files in this folder")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise UserError(f"{path}: no such file or folder")
    return files


def check_text(text: str, *, file: str) -> Iterator[list[Problem]]:
    """The problems found in each pod template of a multi-document YAML text, one list per template."""
    for node, data in reading.yaml_documents(text, name=file):
        for object_node, manifest in _objects(node, data):
            kind = manifest.get("kind")
            if not isinstance(kind, str) or kind not in TEMPLATE_PATHS:
                continue
            template_node: yaml.Node | None = object_node
            template: object = manifest
            for step in TEMPLATE_PATHS[kind]:
                template_node = _child(template_node, step)
                template = template.get(step) if isinstance(template, dict) else None
            if template_node is None or not isinstance(template, dict):
                yield [_no_template(file, kind, manifest, object_node)]
                continue
            located = _Locator(file=file, kind=kind, name=_name(manifest), template=template_node)
            yield [located.problem(error, severity) for error, severity in _findings(template)]


def _no_template(file: str, kind: str, manifest: Mapping[str, object], node: yaml.Node) -> Problem:
    """A workload without a pod template the API server would accept: counted as checked and passed, it
    was a success that did not happen."""
    path = ".".join(TEMPLATE_PATHS[kind])
    return Problem(
        file=file,
        line=node.start_mark.line + 1,
        kind=kind,
        name=_name(manifest),
        key=path,
        message=f"{path}: missing or not a mapping; a {kind} needs its pod template there",
    )


def _findings(template: Mapping[str, object]) -> list[tuple[contract.ContractError, Severity]]:
    """The contract error in a pod template, if any, then the warnings."""
    findings: list[tuple[contract.ContractError, Severity]] = []
    try:
        contract.parse_pod(template)
    except contract.ContractError as error:
        findings.append((error, Severity.ERROR))
    metadata = template.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if not isinstance(annotations, dict):
        return findings
    for key, value in annotations.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        if contract.is_scheduler_owned(key):
            rule = "is written by the scheduler at bind; remove it (the webhook refuses it from tenants)"
            findings.append((contract.ContractError(key, value, rule), Severity.WARNING))
        split = contract.split_container_key(key)
        memory_keys = (keys.MEMORY_REQUEST, keys.MEMORY_LIMIT)
        if split and split[1] in memory_keys and _BARE_WHOLE_NUMBER.fullmatch(value) and int(value) < 2**20:
            rule = f"a number without a unit is bytes, so this is 1 MiB; write {value}Mi for MiB"
            findings.append((contract.ContractError(key, value, rule), Severity.WARNING))
    return findings


@dataclass(frozen=True)
class _Locator:
    """Turns a finding in one pod template into a Problem at the line of its key."""

    file: str
    kind: str
    name: str
    template: yaml.Node

    def problem(self, error: contract.ContractError, severity: Severity) -> Problem:
        return Problem(
            file=self.file,
            line=self._line(error),
            kind=self.kind,
            name=self.name,
            key=error.key,
            message=str(error),
            severity=severity,
        )

    def _line(self, error: contract.ContractError) -> int:
        annotations = _child(_child(self.template, "metadata"), "annotations")
        entry = _entry(annotations, error.key)
        if entry is None and error.key == keys.GPU_RESOURCE:
            entry = self._resource_entry(error.value)
        return (entry[0] if entry else self.template).start_mark.line + 1

    def _resource_entry(self, value: str) -> tuple[yaml.Node, yaml.Node] | None:
        """The `nvidia.com/gpu` entry, in any container's limits or requests, whose value is `value`."""
        containers = _child(_child(self.template, "spec"), "containers")
        for container in containers.value if isinstance(containers, yaml.SequenceNode) else ():
            for part in ("limits", "requests"):
                entry = _entry(_child(_child(container, "resources"), part), keys.GPU_RESOURCE)
                if entry is not None and entry[1].value == value:
                    return entry
        return None


def _objects(node: yaml.Node, data: object) -> Iterator[tuple[yaml.Node, dict[str, object]]]:
    """The Kubernetes objects in a document: the document itself, or the items of a `kind: List`."""
    if not isinstance(data, dict):
        return
    items = data.get("items")
    items_node = _child(node, "items")
    if data.get("kind") == "List" and isinstance(items, list) and isinstance(items_node, yaml.SequenceNode):
        for item_node, item in zip(items_node.value, items, strict=True):
            yield from _objects(item_node, item)
    else:
        yield node, data


def _entry(node: yaml.Node | None, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    """The key and value nodes of `key` in a mapping node (the key's line is the one to point at)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return key_node, value_node
    return None


def _child(node: yaml.Node | None, key: str) -> yaml.Node | None:
    """The value node of `key` in a mapping node; None when either is missing."""
    entry = _entry(node, key)
    return entry[1] if entry else None


def _name(manifest: Mapping[str, object]) -> str:
    metadata = manifest.get("metadata")
    name = metadata.get("name") or metadata.get("generateName") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else "(unnamed)"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
