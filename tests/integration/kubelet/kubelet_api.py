"""The kubelet's PodResources List as the real-node tests read it: every pod, containers without devices
included, which gpufrac's client (gpufrac.node.kubelet.podresources) leaves out."""

from __future__ import annotations

from typing import Any

import grpc

from gpufrac.node.kubelet import protos


def list_pod_resources(socket: str, *, timeout: float = 10) -> Any:
    """The kubelet's PodResources v1 List: every pod on the node with its containers' devices."""
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        call = protos.unary(
            channel, "/v1.PodResourcesLister/List", protos.podresources["ListPodResourcesResponse"]
        )
        return call(protos.podresources["ListPodResourcesRequest"](), timeout=timeout)
