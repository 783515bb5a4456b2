"""Reading untrusted shapes: the API sends well-formed objects, but a review is read as untrusted input.

Two halves. `check_pod` walks every field of a pod (or of the EphemeralContainers object the v1.20
subresource sends) that a rule reads, and raises `Malformed` naming the first one of the wrong type: the
validating webhook denies such an object rather than read a list that is not a list as empty and let the
pod through (it fails closed). The readers below then read a field of the wrong type as empty, so that a
rule cannot raise on what `check_pod` was not asked to check; the rules run only on checked objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpufrac.contract.errors import brief
from gpufrac.kubeapi.fields import as_list, as_mapping

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
# The most annotations a pod may carry for the webhook to read them all; far above any real pod's, far
# below the ~100,000 short ones that fit Kubernetes' 256 KiB (and the webhook sees a pod before the
# apiserver has checked even that).
MAX_ANNOTATIONS = 4096


class Malformed(ValueError):
    """A field a rule reads holds a value of the wrong type; the message names the field."""


# The fields the rules read, and their types: a dict is an object with these fields, a one-item list a
# list of that item, `Mapping` any object (annotations), a type that type. Absent fields are fine.
_NAME = {"name": str}
_RESOURCES = {"requests": Mapping, "limits": Mapping}
_CONTAINER: dict[str, Any] = {
    "name": str,
    "targetContainerName": str,
    "env": [
        {
            "name": str,
            "value": str,
            "valueFrom": {"configMapKeyRef": _NAME, "secretKeyRef": _NAME},
        }
    ],
    "envFrom": [{"prefix": str, "configMapRef": _NAME, "secretRef": _NAME}],
    "securityContext": {"privileged": bool, "capabilities": {"add": [str]}},
    "volumeMounts": [{"name": str, "mountPath": str}],
    "resources": _RESOURCES,
}
_METADATA = {"name": str, "generateName": str, "annotations": Mapping, "labels": Mapping}
_LISTS = {kind: [_CONTAINER] for kind in _CONTAINER_LISTS}
_POD_SPEC: dict[str, Any] = {
    **_LISTS,
    "schedulerName": str,
    "nodeName": str,
    "hostPID": bool,
    "hostIPC": bool,
    "shareProcessNamespace": bool,
    "volumes": [
        {
            "name": str,
            "hostPath": {"path": str},
            "configMap": _NAME,
            "projected": {"sources": [{"configMap": _NAME}]},
        }
    ],
}
_POD = {"metadata": _METADATA, "spec": _POD_SPEC}
_EPHEMERAL_CONTAINERS = {"metadata": _METADATA, "ephemeralContainers": [_CONTAINER]}


def check_pod(obj: Mapping[str, Any]) -> None:
    """Raise `Malformed` for the first field a rule reads that has the wrong type: in a Pod, or in the
    EphemeralContainers object (no `spec`) that kube-apiserver v1.20 sends to `pods/ephemeralcontainers`."""
    _check(obj, _POD if "spec" in obj else _EPHEMERAL_CONTAINERS, "object")
    count = len(annotations_of(obj))
    if count > MAX_ANNOTATIONS:
        raise Malformed(
            f"object.metadata.annotations has {count} entries, more than the {MAX_ANNOTATIONS} allowed"
        )


def _check(value: object, schema: object, where: str) -> None:
    if value is None:
        return
    if isinstance(schema, dict):
        if not isinstance(value, Mapping):
            raise Malformed(f"{where} is not an object")
        for field, inner in schema.items():
            _check(value.get(field), inner, f"{where}.{field}")
    elif isinstance(schema, list):
        if not isinstance(value, list):
            raise Malformed(f"{where} is not a list")
        for i, item in enumerate(value):
            _check(item, schema[0], f"{where}[{i}]")
    elif isinstance(schema, type) and not isinstance(value, schema):
        raise Malformed(f"{where} is not {_KINDS.get(schema, schema.__name__)}: {brief(repr(value))}")


_KINDS: dict[type, str] = {str: "a string", bool: "a boolean", Mapping: "an object"}


def metadata_of(obj: object) -> Mapping[str, Any]:
    return as_mapping(as_mapping(obj).get("metadata"))


def annotations_of(obj: object) -> Mapping[str, Any]:
    return as_mapping(metadata_of(obj).get("annotations"))


def labels_of(obj: object) -> Mapping[str, Any]:
    return as_mapping(metadata_of(obj).get("labels"))


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pod's spec, or the EphemeralContainers object itself (which holds its list at the top)."""
    return as_mapping(obj.get("spec")) if "spec" in obj else obj


def containers_by_list(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container of a pod, or of an EphemeralContainers object, with the list it is in."""
    spec = spec_of(pod)
    for kind in _CONTAINER_LISTS:
        for container in as_list(spec.get(kind)):
            if isinstance(container, Mapping):
                yield kind, container


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    return (container for _, container in containers_by_list(pod))


def volumes(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for volume in as_list(spec_of(pod).get("volumes")):
        if isinstance(volume, Mapping):
            yield volume


def configmap_refs(container: Mapping[str, Any]) -> list[str]:
    """The ConfigMaps a container takes env from: `envFrom[].configMapRef` and `env[].valueFrom`."""
    refs = [
        as_mapping(as_mapping(source).get("configMapRef")).get("name")
        for source in as_list(container.get("envFrom"))
    ]
    refs += [
        as_mapping(as_mapping(as_mapping(variable).get("valueFrom")).get("configMapKeyRef")).get("name")
        for variable in as_list(container.get("env"))
    ]
    return [ref for ref in refs if isinstance(ref, str)]


def volume_configmaps(volume: Mapping[str, Any]) -> list[str]:
    """The ConfigMaps a pod volume mounts as files: `configMap`, and `projected.sources[].configMap`."""
    refs = [as_mapping(volume.get("configMap")).get("name")]
    refs += [
        as_mapping(as_mapping(source).get("configMap")).get("name")
        for source in as_list(as_mapping(volume.get("projected")).get("sources"))
    ]
    return [ref for ref in refs if isinstance(ref, str)]
