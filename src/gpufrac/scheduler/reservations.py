"""Reservation pods: how gpufrac holds a GPU it shares from the kubelet's device plugin. Pure.

A reservation is a pod in the scheduler's own namespace, bound straight to its node, asking for one
`nvidia.com/gpu` and running nothing but a pause container. The kubelet's device plugin gives it a GPU and
counts that GPU as taken, so no other pod is given it; the node agent publishes which GPU that was
(`GpuInfo.holder`), and only then do shares go there (`devices`). The scheduler deletes a reservation once
no share is left on its GPU.

A reservation is told apart by all three of its namespace, its label and its name prefix: tenants cannot
create pods in the scheduler's namespace, so none of theirs can pass for one.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from gpufrac.contract import keys

LABEL = keys.RESERVATION_LABEL
NODE_LABEL = "gpufrac.io/reserved-node"
PREFIX = "gpufrac-reservation-"
CONTAINER = "reservation"
DEFAULT_IMAGE = "registry.k8s.io/pause:3.9"


def is_reservation(pod: Mapping[str, Any], namespace: str) -> bool:
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return False
    labels = metadata.get("labels")
    name = metadata.get("name")
    return (
        metadata.get("namespace") == namespace
        and isinstance(name, str)
        and name.startswith(PREFIX)
        and isinstance(labels, Mapping)
        and labels.get(LABEL) == "true"
    )


def named_as_reservation(holder: str, namespace: str) -> bool:
    """Whether a published holder (namespace/name) names a reservation pod, live or gone."""
    holder_namespace, _, name = holder.partition("/")
    return holder_namespace == namespace and name.startswith(PREFIX)


def manifest(node: str, *, namespace: str, image: str) -> dict[str, Any]:
    """A reservation for one GPU on `node`. Bound by `nodeName`, so no scheduler is involved; it tolerates
    every taint, since GPU nodes are often tainted and the shares it serves tolerate theirs; it asks for
    next to no CPU or memory, and stops at once."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": PREFIX + secrets.token_hex(6),
            "namespace": namespace,
            "labels": {LABEL: "true", NODE_LABEL: node[:63]},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "4Mi"},
                        "limits": {keys.GPU_RESOURCE: "1", "memory": "16Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
