"""Pods as the API returns them, built from just the parts a contract test cares about."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def make_pod(
    annotations: Mapping[str, object] | None = None,
    containers: Sequence[str] = ("app",),
    *,
    limits: Mapping[str, object] | None = None,
    requests: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """A pod with `containers`; `limits`/`requests` map a container name to its `nvidia.com/gpu` value."""
    specs = []
    for name in containers:
        resources = {
            part: {"nvidia.com/gpu": amounts[name]}
            for part, amounts in (("limits", limits or {}), ("requests", requests or {}))
            if name in amounts
        }
        specs.append({"name": name, "image": "busybox", "resources": resources})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "annotations": dict(annotations or {})},
        "spec": {"containers": specs},
    }
