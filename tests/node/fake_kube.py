"""A stand-in for lightkube's AsyncClient holding one Node and its pods, as the agent uses them: get and
merge-patch the Node and its status' capacity and allocatable, strategic-merge its status conditions (keyed by
type), list the pods, create Events and
evictions."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from lightkube.resources.core_v1 import Node

from tests.kubeapi.fakeapi import api_error


@dataclass
class FakeNodeClient:
    node: dict[str, Any]
    pods: list[dict[str, Any]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)  # "get Node", "patch Node", "patch NodeStatus", "list Pod"
    writes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def _check(self, call: str) -> None:
        if call in self.fail:
            raise api_error(503, "ServiceUnavailable", f"{call} refused")

    async def get(self, resource: type[Any], name: str, **_: Any) -> Any:
        self._check("get Node")
        return SimpleNamespace(to_dict=lambda: copy.deepcopy(self.node))

    async def patch(self, resource: type[Any], name: str, body: dict[str, Any], **_: Any) -> None:
        kind = "NodeStatus" if resource is Node.Status else "Node"
        self._check(f"patch {kind}")
        self.writes.append((kind, copy.deepcopy(body)))
        if kind == "Node":
            for key, values in body["metadata"].items():
                self.node.setdefault("metadata", {}).setdefault(key, {}).update(values)
            return
        status = self.node.setdefault("status", {})
        for part in ("capacity", "allocatable"):
            status.setdefault(part, {}).update(body["status"].get(part, {}))
        conditions = status.setdefault("conditions", [])
        for condition in body["status"].get("conditions", []):
            conditions[:] = [c for c in conditions if c["type"] != condition["type"]] + [condition]

    async def list(self, resource: type[Any], **_: Any) -> AsyncIterator[Any]:
        self._check("list Pod")
        for pod in self.pods:
            yield SimpleNamespace(to_dict=lambda pod=pod: copy.deepcopy(pod))

    async def create(self, obj: Any, *_: Any, **__: Any) -> Any:
        """An Event, or an Eviction (created as a subresource of the pod it names)."""
        self.events.append(obj)
        return obj

    def condition(self) -> dict[str, Any] | None:
        for condition in self.node.get("status", {}).get("conditions", []):
            if condition["type"] == "gpufrac.io/Ready":
                return dict(condition)
        return None

    def status_writes(self) -> int:
        return sum(1 for kind, _ in self.writes if kind == "NodeStatus")
