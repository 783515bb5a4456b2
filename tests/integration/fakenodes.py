"""Fake GPU nodes for one test, made by :func:`gpufrac.testing.fake_nodes.create_gpu_node` (shared with
``benchmarks/scheduler.py``): Ready, untainted Node objects with GPU Feature Discovery labels and
``nvidia.com/gpu`` capacity, but no kubelet. The one thing of a kubelet's they do is end a pod's deletion:
a pod being deleted (evicted, say) keeps its node's resources until the kubelet says it is gone, which
without one it never would."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import lightkube
from lightkube.resources.core_v1 import Node, Pod

from gpufrac.testing.fake_nodes import create_gpu_node

# How often the stand-in kubelet looks for pods being deleted on the fake nodes.
FINALIZE_EVERY_SECONDS = 0.2

__all__ = ["GpuNodes", "create_gpu_node"]


class GpuNodes:
    """Creates fake GPU nodes for one test and deletes them afterwards: nodes are cluster-scoped, so
    they would otherwise outlive the test's namespace and show up in the next test."""

    def __init__(self, client: lightkube.AsyncClient, *, prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self.names: list[str] = []
        self._kubelet: asyncio.Task[None] | None = None

    async def create(self, name: str | None = None, **kwargs: Any) -> Node:
        """Like :func:`create_gpu_node`; ``name`` defaults to ``<prefix>-<n>``."""
        name = name or f"{self._prefix}-{len(self.names)}"
        self.names.append(name)
        if self._kubelet is None:
            self._kubelet = asyncio.create_task(self._finalize_deletions())
        return await create_gpu_node(self._client, name, **kwargs)

    async def _finalize_deletions(self) -> None:
        """What the kubelet does once a pod's containers have stopped: delete it for good."""
        while True:
            async for pod in self._client.list(Pod, namespace="*"):
                meta, spec = pod.metadata, pod.spec
                if meta and meta.deletionTimestamp and spec and spec.nodeName in self.names and meta.name:
                    with contextlib.suppress(lightkube.ApiError):
                        await self._client.delete(Pod, meta.name, namespace=meta.namespace, grace_period=0)
            await asyncio.sleep(FINALIZE_EVERY_SECONDS)

    async def delete_all(self) -> None:
        if self._kubelet is not None:
            self._kubelet.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._kubelet
            self._kubelet = None
        for name in self.names:
            try:
                await self._client.delete(Node, name)
            except lightkube.ApiError as e:
                if e.status.code != 404:
                    raise
        self.names.clear()
