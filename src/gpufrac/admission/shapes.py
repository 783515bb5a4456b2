"""Reading untrusted shapes: the API sends well-formed objects, but no rule may raise on others, so a
field of the wrong type reads as empty."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


def as_mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def as_list(value: object) -> Sequence[object]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def metadata_of(obj: object) -> Mapping[str, Any]:
    return as_mapping(as_mapping(obj).get("metadata"))


def annotations_of(obj: object) -> Mapping[str, Any]:
    return as_mapping(metadata_of(obj).get("annotations"))


def containers_by_list(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every container of a pod, or of an EphemeralContainers object, with the list it is in."""
    spec = as_mapping(pod.get("spec")) if "spec" in pod else pod
    for kind in _CONTAINER_LISTS:
        for container in as_list(spec.get(kind)):
            if isinstance(container, Mapping):
                yield kind, container


def containers(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    return (container for _, container in containers_by_list(pod))


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
