"""The Eviction API against a real kube-apiserver: an eviction names the pod by UID as well as by name."""

from __future__ import annotations

import httpx2
import lightkube
import pytest
from lightkube.resources.core_v1 import Pod

from gpufrac.kubeapi.eviction import evict

from . import controlplane
from .scheduling import gpu_pod


async def test_a_pod_recreated_under_the_name_of_the_one_to_evict_is_left_alone(
    control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient, namespace: str
) -> None:
    """A StatefulSet recreates its pod under the same name: an eviction decided on the first (its cache not
    yet told) must not evict the second, which nobody chose. kube-apiserver v1.20 retries the failed
    precondition for about 10 s before it answers 409, as long as lightkube waits for a read: a client that
    gives up first (a failed eviction to the mover and the agent) has evicted nothing either."""
    first = await admin_client.create(gpu_pod("w-0", namespace, annotations={"gpu-fraction": "0.5"}))
    assert first.metadata is not None and first.metadata.uid is not None
    await admin_client.delete(Pod, "w-0", namespace=namespace, grace_period=0)
    second = await admin_client.create(gpu_pod("w-0", namespace, annotations={"gpu-fraction": "0.5"}))
    patient = lightkube.AsyncClient(control_plane.config(), trust_env=False, timeout=httpx2.Timeout(60.0))
    with pytest.raises(lightkube.ApiError) as refused:
        await evict(patient, "w-0", namespace=namespace, uid=first.metadata.uid)
    await patient.close()
    assert refused.value.status.code == 409
    still = await admin_client.get(Pod, "w-0", namespace=namespace)
    assert still.metadata is not None and second.metadata is not None
    assert still.metadata.uid == second.metadata.uid and still.metadata.deletionTimestamp is None
    await evict(admin_client, "w-0", namespace=namespace, uid=second.metadata.uid)  # its own UID: evicted


@pytest.mark.parametrize("deleted_first", [False, True], ids=["running", "deleted with a day of grace"])
async def test_an_eviction_shortens_a_long_grace_period(
    admin_client: lightkube.AsyncClient, namespace: str, deleted_first: bool
) -> None:
    """The API server takes the grace period an Eviction names over the pod's own, and over that of a
    deletion under way: a bound pod asking for a day is given what the eviction says (its node has no
    kubelet here, so it stays, being deleted)."""
    made = gpu_pod("slow", namespace).to_dict()
    made["spec"]["terminationGracePeriodSeconds"] = 86_400
    made["spec"]["nodeName"] = "nowhere"
    created = await admin_client.create(Pod.from_dict(made))
    assert created.metadata is not None
    if deleted_first:  # by its tenant, taking its time
        await admin_client.delete(Pod, "slow", namespace=namespace, grace_period=86_400)
    await evict(admin_client, "slow", namespace=namespace, uid=created.metadata.uid, grace_seconds=30)
    going = await admin_client.get(Pod, "slow", namespace=namespace)
    assert going.metadata is not None and going.metadata.deletionGracePeriodSeconds == 30
    await admin_client.delete(Pod, "slow", namespace=namespace, grace_period=0)
