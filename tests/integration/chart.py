"""Rendering the Helm chart, for the chart tests and for the control plane, which runs each gpufrac identity
under exactly the RBAC the chart ships (so there is one copy of those rules, and it is the tested one)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpufrac"
NAMESPACE = "gpufrac-system"


def helm_template(
    *values: str,
    api_versions: tuple[str, ...] = (),
    show_only: tuple[str, ...] = (),
    kube_version: str = "",
) -> list[dict[str, Any]]:
    """`helm template` of the chart, released into NAMESPACE, as a list of objects."""
    args = _template_args(values, api_versions=api_versions, show_only=show_only, kube_version=kube_version)
    rendered = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def helm_refusal(*values: str, kube_version: str = "") -> str:
    """What `helm template` says when it refuses to render the chart with `values` (it must refuse)."""
    args = _template_args(values, api_versions=(), show_only=(), kube_version=kube_version)
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode != 0, f"helm rendered the chart with {values}"
    return done.stderr


def _template_args(
    values: tuple[str, ...], *, api_versions: tuple[str, ...], show_only: tuple[str, ...], kube_version: str
) -> list[str]:
    helm = shutil.which("helm", path=str(Path(sys.executable).parent)) or shutil.which("helm")
    if helm is None:
        raise FileNotFoundError("helm is a dev dependency (helm-binary); run `make install`")
    args = [helm, "template", "gpufrac", str(CHART), "--namespace", NAMESPACE]
    for value in values:
        args += ["--set", value]
    for api_version in api_versions:  # what .Capabilities.APIVersions.Has sees, e.g. cert-manager.io/v1
        args += ["--api-versions", api_version]
    for template in show_only:
        args += ["--show-only", template]
    if kube_version:  # what .Capabilities.KubeVersion and Chart.yaml's kubeVersion see
        args += ["--kube-version", kube_version]
    return args


def rbac_objects() -> list[dict[str, Any]]:
    """The namespace and the service accounts, roles and bindings of the scheduler and the agent."""
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    return [
        namespace,
        *helm_template(show_only=("templates/scheduler-rbac.yaml", "templates/agent-rbac.yaml")),
    ]
