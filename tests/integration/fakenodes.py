"""Fake GPU nodes for one test, made by :func:`gpufrac.testing.fake_nodes.create_gpu_node` (shared with
``benchmarks/scheduler.py``): Ready, untainted Node objects with GPU Feature Discovery labels and
``nvidia.com/gpu`` capacity, but no kubelet."""

from __future__ import annotations

from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node

from gpufrac.testing.fake_nodes import create_gpu_node

__all__ = ["GpuNodes", "create_gpu_node"]


class GpuNodes:
    """Creates fake GPU nodes for one test and deletes them afterwards: nodes are cluster-scoped, so
    they would otherwise outlive the test's namespace and show up in the next test."""

    def __init__(self, client: lightkube.AsyncClient, *, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self.names: list[str] = []

    async def create(self, name: str | None = None, **kwargs: Any) -> Node:
        """Like :func:`create_gpu_node`; ``name`` defaults to ``<prefix>-<n>``."""
        name = name or f"{self._prefix}-{len(self.names)}"
        self.names.append(name)
        return await create_gpu_node(self._client, name, **kwargs)

    async def delete_all(self) -> None:
        for name in self.names:
            try:
                await self._client.delete(Node, name)
            except lightkube.ApiError as e:
                if e.status.code != 404:
                    raise
        self.names.clear()
