"""`gpufrac webhook` against the real apiserver: the acceptance list of the admission webhook.

As the tenant, each way of taking more GPU than granted is denied with the webhook's message; as the
scheduler's identity the same operations succeed; valid tenant pods are admitted, normalized and then
scheduled by the gpufrac scheduler. The scheduler's deployed RBAC does not let it create pods or edit
and delete ConfigMaps at all, so for the "same operations" the test widens its RBAC in the test's
namespace: what is checked there is that the webhook, not RBAC, lets it through.
"""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import httpx2
import lightkube
import pytest
from lightkube import codecs
from lightkube.models.core_v1 import ResourceQuotaSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    MutatingWebhookConfiguration,
    ValidatingWebhookConfiguration,
)
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod, ResourceQuota, Secret

from gpufrac import contract
from gpufrac.admission import certs, settings
from gpufrac.contract import keys, memory_resource

from . import controlplane, fakenodes
from .scheduling import eventually, running_scheduler, wait_bound
from .test_helm_chart import helm_template
from .webhook_fixtures import (
    LABEL,
    RunningWebhook,
    denied_by_webhook,
    serving,
    wait_until_guarded,
)

N = keys.CONTAINER_PREFIX
SCHEDULER = controlplane.SCHEDULER_USER
RESOURCE = memory_resource.GPU_MEMORY_RESOURCE
BASE = re.compile(r"gpufrac-env-[0-9a-f]{16}")


@pytest.fixture(scope="module")
def webhook(
    control_plane: controlplane.ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningWebhook, str]]:
    """`gpufrac webhook` with its default policy, registered for namespaces labelled with the token."""
    with control_plane.sync_client() as admin, serving(admin, tmp_path_factory.mktemp("webhook")) as webhook:
        yield webhook


@pytest.fixture
async def guarded(
    webhook: tuple[RunningWebhook, str], namespace: str, admin_client: lightkube.AsyncClient
) -> AsyncIterator[str]:
    """The test's namespace, served by the webhook, with the scheduler's rights widened there (see the
    module docstring)."""
    _, token = webhook
    # The trusted tier, where sm-sharing is allowed (test_trust_tiers.py has the untrusted one).
    labels = {LABEL: token, settings.TRUST_LABEL: settings.TRUSTED}
    await admin_client.patch(Namespace, namespace, {"metadata": {"labels": labels}})
    rbac = codecs.load_all_yaml(
        f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: scheduler-widened, namespace: {namespace}}}
rules:
  - apiGroups: [""]
    resources: [pods, configmaps]
    verbs: [create, get, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: scheduler-widened, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: scheduler-widened}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: "{SCHEDULER}"}}]
"""
    )
    for obj in rbac:
        await admin_client.create(obj)
    await wait_until_guarded(admin_client, namespace)
    yield namespace
    # Off again before the namespace goes, so that its deletion of env ConfigMaps (by the controller
    # manager, as admin here) is not refused.
    await admin_client.patch(Namespace, namespace, {"metadata": {"labels": {LABEL: None}}})


def pod(
    name: str, annotations: dict[str, str] | None = None, containers: tuple[str, ...] = ("main",)
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {"name": c, "image": "busybox", "resources": {"requests": {"cpu": "100m"}}}
                for c in containers
            ],
        },
    }


def with_devices(obj: dict[str, Any], limit: str = "40960Mi", device: str = "GPU-0") -> dict[str, Any]:
    """`obj` carrying what the scheduler writes at bind for container main."""
    obj["metadata"]["annotations"].update(
        {
            f"{N}main.gpu-memory.request": "40960Mi",
            f"{N}main.gpu-memory.limit": limit,
            f"{N}main.gpu-compute.mode": "time-slicing",
            f"{N}main.gpus.devices": device,
        }
    )
    return obj


async def create(client: lightkube.AsyncClient, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    created = await client.create(codecs.from_dict(obj), namespace=namespace)
    result: dict[str, Any] = created.to_dict()
    return result


async def refused(call: Awaitable[object]) -> str:
    with pytest.raises(lightkube.ApiError) as caught:
        await call
    assert caught.value.status.code == 403, caught.value.status.message
    return denied_by_webhook(caught.value)


# Valid tenant pods.


async def test_a_tenant_share_pod_is_admitted_and_normalized(
    tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    asked = pod("share", {"gpu-fraction": "0.5"})
    created = await create(tenant_client, asked, guarded)
    assert created["spec"]["schedulerName"] == "gpufrac"
    annotations = created["metadata"]["annotations"]
    assert annotations[f"{N}main.gpu-compute.mode"] == "time-slicing"
    assert annotations["gpu-fraction-container-name"] == "main"
    base = annotations[keys.ENV_CONFIGMAP_ANNOTATION]
    assert BASE.fullmatch(base)
    assert created["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": f"{base}-main", "optional": False}}
    ]
    assert contract.parse_pod(created) == contract.parse_pod(asked)
    # A pod from generateName is named only after admission; it gets a ConfigMap name all the same.
    unnamed = pod("", {"gpu-memory": "8Gi"})
    unnamed["metadata"] = {"generateName": "notebook-", "annotations": {"gpu-memory": "8Gi"}}
    other = await create(tenant_client, unnamed, guarded)
    assert BASE.fullmatch(other["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION]) and other != base
    # Pods without GPUs pass untouched.
    plain = await create(tenant_client, pod("plain"), guarded)
    assert plain["spec"]["schedulerName"] == "default-scheduler"


async def test_a_resource_quota_caps_a_namespaces_gpu_memory(
    admin_client: lightkube.AsyncClient, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    """Each share container requests gpufrac.io/gpu-memory as its share counts, so the apiserver's own
    ResourceQuota admission caps a namespace's shares, whatever the tenant wrote there."""
    hard = {f"requests.{RESOURCE}": "48Gi"}
    await admin_client.create(
        ResourceQuota(metadata=ObjectMeta(name="gpus"), spec=ResourceQuotaSpec(hard=hard)), namespace=guarded
    )

    async def counted() -> dict[str, str] | None:
        quota = await admin_client.get(ResourceQuota, "gpus", namespace=guarded)
        return quota.status.used if quota.status and quota.status.hard else None

    async def synced() -> bool:
        return await counted() is not None

    await eventually(synced, what="the quota controller to count the namespace")
    first = await create(tenant_client, pod("first", {"gpu-memory": "32Gi"}), guarded)
    requests = first["spec"]["containers"][0]["resources"]["requests"]
    assert contract.parse_quantity(requests[RESOURCE]) == 32 * 2**30
    # A tenant who asks for less of the resource than its share is counted at its share.
    cheap = pod("cheap", {"gpu-memory": "12Gi"})
    cheap["spec"]["containers"][0]["resources"] = {"requests": {RESOURCE: "1Mi"}, "limits": {RESOURCE: "1Mi"}}
    await create(tenant_client, cheap, guarded)
    # 44Gi used: a fraction counts on the 80 GiB reference GPU, 0.1 of it is 8192Mi, past the quota.
    with pytest.raises(lightkube.ApiError) as caught:
        await create(tenant_client, pod("fraction", {"gpu-fraction": "0.1"}), guarded)
    message = caught.value.status.message or ""
    assert caught.value.status.code == 403 and "exceeded quota: gpus" in message, message
    assert f"requested: requests.{RESOURCE}=8Gi, used: requests.{RESOURCE}=44Gi" in message, message
    await create(tenant_client, pod("small", {"gpu-fraction": "0.05"}), guarded)  # 4Gi: just fits
    used = await counted()
    assert used is not None and contract.parse_quantity(used[f"requests.{RESOURCE}"]) == 48 * 2**30


# Forged devices, raised limits.


async def test_forged_devices_are_denied_to_the_tenant_and_allowed_to_the_scheduler(
    control_plane: controlplane.ControlPlane, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    forged = with_devices(pod("forged", {"gpu-fraction": "0.5"}))
    message = await refused(create(tenant_client, forged, guarded))
    assert message.startswith(f'{N}main.gpus.devices="GPU-0": is written by the gpufrac scheduler at bind')
    assert '"tenant" may not set it' in message
    async with control_plane.client("scheduler", namespace=guarded) as scheduler:
        created = await create(scheduler, forged, guarded)
    assert created["metadata"]["annotations"][f"{N}main.gpus.devices"] == "GPU-0"


async def test_a_raised_limit_is_denied_to_the_tenant_and_allowed_to_the_scheduler(
    control_plane: controlplane.ControlPlane, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    # Beside gpu-fraction, a memory limit can only be the scheduler's resolved value.
    raised = pod("raised", {"gpu-fraction": "0.5", f"{N}main.gpu-memory.limit": "80Gi"})
    message = await refused(create(tenant_client, raised, guarded))
    assert message == (
        f'{N}main.gpu-memory.limit="80Gi": container "main" has its share from gpu-fraction already; set '
        "memory one way"
    )
    bound = with_devices(pod("raised", {"gpu-fraction": "0.5"}), limit="81920Mi")
    assert "may not set it" in await refused(create(tenant_client, bound, guarded))
    async with control_plane.client("scheduler", namespace=guarded) as scheduler:
        await create(scheduler, bound, guarded)


async def test_a_limit_patched_after_binding_is_denied_to_the_tenant_and_allowed_to_the_scheduler(
    control_plane: controlplane.ControlPlane,
    tenant_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    gpu_nodes: fakenodes.GpuNodes,
    guarded: str,
) -> None:
    node = await gpu_nodes.create(gpus=1, gpu_memory_mib=81920)
    assert node.metadata is not None and node.metadata.name is not None
    await create(tenant_client, pod("tenant-pod", {"gpu-fraction": "0.5"}), guarded)
    # Before binding too: the request is fixed at creation.
    message = await refused(
        tenant_client.patch(Pod, "tenant-pod", {"metadata": {"annotations": {"gpu-fraction": "0.9"}}})
    )
    assert message.startswith('gpu-fraction: "0.5" -> "0.9": GPU contract annotations cannot change')
    # Device "0": the node has no agent, so its GPUs are known by index (and the allocation check at the
    # end of the test finds the bound pod on a GPU that exists).
    bind = with_devices(pod("x"), device="0")["metadata"]["annotations"]
    await scheduler_client.patch(Pod, "tenant-pod", {"metadata": {"annotations": bind}}, namespace=guarded)
    await controlplane.bind_pod(scheduler_client, "tenant-pod", node.metadata.name, namespace=guarded)
    raise_limit = {"metadata": {"annotations": {f"{N}main.gpu-memory.limit": "81920Mi"}}}
    message = await refused(tenant_client.patch(Pod, "tenant-pod", raise_limit))
    assert message == (
        f'{N}main.gpu-memory.limit: "40960Mi" -> "81920Mi": GPU contract annotations cannot change once the '
        f'pod exists; only the gpufrac scheduler ({SCHEDULER}) may write them, not "tenant"; delete the pod '
        "and create it with the keys it needs"
    )
    drop_limit = {"metadata": {"annotations": {f"{N}main.gpu-memory.limit": None}}}
    assert "-> removed" in await refused(tenant_client.patch(Pod, "tenant-pod", drop_limit))
    # Other annotations and labels stay the tenant's to change.
    await tenant_client.patch(
        Pod, "tenant-pod", {"metadata": {"labels": {"a": "b"}, "annotations": {"n": "1"}}}
    )
    patched = await scheduler_client.patch(Pod, "tenant-pod", raise_limit, namespace=guarded)
    assert patched.metadata is not None and patched.metadata.annotations is not None
    assert patched.metadata.annotations[f"{N}main.gpu-memory.limit"] == "81920Mi"


# The GPU variables, another pod's env ConfigMap.


async def test_setting_nvidia_visible_devices_is_denied_to_the_tenant(
    control_plane: controlplane.ControlPlane, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    greedy = pod("greedy")
    greedy["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    message = await refused(create(tenant_client, greedy, guarded))
    assert message.startswith('container "main" sets NVIDIA_VISIBLE_DEVICES in its env: the GPUs a container')
    async with control_plane.client("scheduler", namespace=guarded) as scheduler:
        await create(scheduler, greedy, guarded)


async def test_borrowing_another_pods_env_configmap_is_denied_to_the_tenant(
    control_plane: controlplane.ControlPlane,
    tenant_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    guarded: str,
) -> None:
    victim = await create(tenant_client, pod("victim", {"gpu-fraction": "0.5"}), guarded)
    theirs = f"{victim['metadata']['annotations'][keys.ENV_CONFIGMAP_ANNOTATION]}-main"
    await scheduler_client.create(
        ConfigMap(
            metadata=ObjectMeta(name=theirs, namespace=guarded, labels={keys.ENV_CONFIGMAP_LABEL: "true"}),
            data={"NVIDIA_VISIBLE_DEVICES": "GPU-0"},
            immutable=True,
        )
    )
    thief = pod("thief")
    thief["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": theirs}}]
    message = await refused(create(tenant_client, thief, guarded))
    assert message.startswith(f'container "main" takes its env from ConfigMap "{theirs}", another pod\'s')
    # A share pod of its own, with a second source: still denied.
    share_thief = pod("share-thief", {"gpu-fraction": "0.1"})
    share_thief["spec"]["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": theirs, "key": "NVIDIA_VISIBLE_DEVICES"}}}
    ]
    assert "another pod's" in await refused(create(tenant_client, share_thief, guarded))
    async with control_plane.client("scheduler", namespace=guarded) as scheduler:
        await create(scheduler, thief, guarded)


# The env ConfigMaps themselves.


async def test_env_configmaps_are_the_schedulers_alone(
    control_plane: controlplane.ControlPlane, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    def configmap(name: str) -> ConfigMap:
        labels = {keys.ENV_CONFIGMAP_LABEL: "true"}
        return ConfigMap(
            metadata=ObjectMeta(name=name, labels=labels), data={"NVIDIA_GPU_MEMORY_LIMIT": "80000"}
        )

    who = f"only the gpufrac scheduler ({SCHEDULER})"
    assert f'{who} may create it, not "tenant"' in await refused(
        tenant_client.create(configmap("gpufrac-env-0000000000000000-main"))
    )
    assert "may create it" in await refused(
        tenant_client.create(ConfigMap(metadata=ObjectMeta(name="gpufrac-env-x"), data={}))
    )
    async with control_plane.client("scheduler", namespace=guarded) as scheduler:
        await scheduler.create(configmap("gpufrac-env-1111111111111111-main"))
        relabel = {"metadata": {"labels": {"edited": "yes"}}}
        assert f'{who} may update it, not "tenant"' in await refused(
            tenant_client.patch(ConfigMap, "gpufrac-env-1111111111111111-main", relabel)
        )
        assert f'{who} may delete it, not "tenant"' in await refused(
            tenant_client.delete(ConfigMap, "gpufrac-env-1111111111111111-main")
        )
        await scheduler.patch(ConfigMap, "gpufrac-env-1111111111111111-main", relabel)
        await scheduler.delete(ConfigMap, "gpufrac-env-1111111111111111-main")
    # The tenant's own ConfigMaps are the tenant's.
    await tenant_client.create(ConfigMap(metadata=ObjectMeta(name="settings"), data={"A": "1"}))
    await tenant_client.patch(ConfigMap, "settings", {"data": {"A": "2"}})
    await tenant_client.delete(ConfigMap, "settings")


async def test_denials_are_logged_and_counted(
    webhook: tuple[RunningWebhook, str], tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    running, _ = webhook
    greedy = pod("logged")
    greedy["spec"]["containers"][0]["env"] = [{"name": "CUDA_VISIBLE_DEVICES", "value": "0"}]
    await refused(create(tenant_client, greedy, guarded))
    assert (
        f"validate denied CREATE pods {guarded}/logged for user 'tenant' (rule env): container \"main\""
        in (running.log())
    )
    trust = ssl.create_default_context(cafile=str(running.ca_file))
    with urllib.request.urlopen(f"{running.url}/metrics", context=trust, timeout=10) as response:
        metrics = response.read().decode()
    counted = re.search(r'gpufrac_webhook_denials_total\{endpoint="validate",rule="env"\} (\d+)', metrics)
    assert counted is not None and float(counted.group(1)) >= 1


# End to end: tenant pods through the webhook, bound by the gpufrac scheduler, ConfigMaps and all.


async def test_tenant_pods_are_scheduled_end_to_end_by_gpufrac(
    tenant_client: lightkube.AsyncClient,
    scheduler_client: lightkube.AsyncClient,
    admin_client: lightkube.AsyncClient,
    gpu_nodes: fakenodes.GpuNodes,
    guarded: str,
) -> None:
    await gpu_nodes.create(gpus=2, gpu_memory_mib=81920)
    asked = [
        pod("half", {"gpu-fraction": "0.5"}),
        pod("notebook", {"gpu-memory": "20Gi", "gpu-memory.limit": "40Gi"}),
        pod("mps", {f"{N}main.gpu-memory.request": "10Gi", f"{N}main.gpu-compute.mode": "sm-sharing"}),
        pod("pair", {f"{N}a.gpu-memory.request": "4Gi", f"{N}b.gpu-memory.request": "2Gi"}, ("a", "b")),
    ]
    for obj in asked:
        await create(tenant_client, obj, guarded)
    async with running_scheduler(scheduler_client, policy="binpack"):
        pods = await wait_bound(admin_client, guarded, len(asked))
    for bound in pods:
        placement = contract.parse_placement(bound)
        assert placement is not None, bound["metadata"]["name"]
        base = bound["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION]
        devices = {share.container: share.devices for share in placement.shares}
        for spec in bound["spec"]["containers"]:
            name = f"{base}-{spec['name']}"
            assert {"configMapRef": {"name": name, "optional": False}} in spec["envFrom"]
            configmap = await admin_client.get(ConfigMap, name, namespace=guarded)
            assert configmap.data is not None and configmap.immutable is True
            assert configmap.data["NVIDIA_VISIBLE_DEVICES"] == ",".join(devices[spec["name"]])
    mps = next(p for p in pods if p["metadata"]["name"] == "mps")
    assert mps["spec"]["volumes"][-1]["hostPath"]["path"] == contract.DEFAULT_MPS_PIPE_DIRECTORY


# The certificate Job's command, against the real apiserver.


async def test_generate_certs_fills_the_secret_and_the_ca_bundles(
    control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient, namespace: str
) -> None:
    # The chart's configurations as the Job finds them after install, but for no namespace at all.
    name = f"gpufrac-webhook-{namespace}"
    for document in helm_template():
        if document["kind"].endswith("WebhookConfiguration"):
            document["metadata"]["name"] = name
            for hook in document["webhooks"]:
                hook["namespaceSelector"] = {"matchLabels": {LABEL: "nowhere"}}
            await admin_client.create(codecs.from_dict(document))
    hosts = certs.service_hosts("gpufrac-webhook", namespace)
    command = [sys.executable, "-m", "gpufrac.cli", "webhook", "--generate-certs"]
    command += [
        "--kubeconfig",
        str(control_plane.kubeconfig("admin")),
        "--secret",
        f"{namespace}/webhook-tls",
    ]
    command += ["--hosts", ",".join(hosts), "--webhook-configurations", name]
    try:
        bundles = []
        for _ in range(2):
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
            assert done.returncode == 0, done.stderr
            secret = await admin_client.get(Secret, "webhook-tls", namespace=namespace)
            assert secret.type == "kubernetes.io/tls" and secret.data is not None
            bundle = certs.Bundle(
                *(base64.b64decode(secret.data[k]) for k in ("ca.crt", "tls.crt", "tls.key"))
            )
            assert certs.still_valid(bundle, hosts)
            bundles.append(bundle)
            for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
                configuration = await admin_client.get(kind, name)
                for hook in configuration.webhooks or []:
                    assert base64.b64decode(hook.clientConfig.caBundle or "") == bundle.ca
        assert bundles[0] == bundles[1], "a second run keeps a certificate that is still good"
        missing = subprocess.run(
            [*command[:-1], "no-such-configuration"], capture_output=True, text=True, timeout=60, check=False
        )
        assert missing.returncode == 2
        assert "no Mutating- or ValidatingWebhookConfiguration named no-such-configuration" in missing.stderr
    finally:
        for kind in (MutatingWebhookConfiguration, ValidatingWebhookConfiguration):
            await admin_client.delete(kind, name)


# Subresources (issue 11): a pods/status update can change a pod's annotations too.


async def test_a_status_update_may_not_change_the_contract(
    admin_client: lightkube.AsyncClient, tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    await create(tenant_client, pod("status", {"gpu-fraction": "0.5"}), guarded)
    # As admin: RBAC lets it write pods/status, so what refuses is the webhook.
    raise_share = {"metadata": {"annotations": {"gpu-fraction": "0.9"}}}
    message = await refused(admin_client.patch(Pod.Status, "status", raise_share, namespace=guarded))
    assert message.startswith('gpu-fraction: "0.5" -> "0.9": GPU contract annotations cannot change')
    ordinary = {"metadata": {"annotations": {"note": "x"}}, "status": {"message": "hello"}}
    patched = await admin_client.patch(Pod.Status, "status", ordinary, namespace=guarded)
    assert patched.metadata is not None and patched.metadata.annotations is not None
    assert patched.metadata.annotations["gpu-fraction"] == "0.5"
    assert patched.metadata.annotations["note"] == "x"


async def test_hostile_pods_are_denied_through_the_apiserver(
    tenant_client: lightkube.AsyncClient, guarded: str
) -> None:
    prefixed = pod("prefixed", {"gpu-fraction": "0.5"}, ("main", "sidecar"))
    prefixed["spec"]["containers"][1]["envFrom"] = [{"prefix": "NVIDIA_", "configMapRef": {"name": "mine"}}]
    assert 'imports env with prefix "NVIDIA_"' in await refused(create(tenant_client, prefixed, guarded))
    privileged_init = pod("privileged-init", {"gpu-fraction": "0.5"})
    privileged_init["spec"]["initContainers"] = [
        {"name": "init", "image": "busybox", "securityContext": {"privileged": True}}
    ]
    assert "is privileged in a pod that holds GPUs" in await refused(
        create(tenant_client, privileged_init, guarded)
    )
    digits = pod("digits", {"gpu-fraction": "\uff10.\uff15"})
    assert (await refused(create(tenant_client, digits, guarded))).startswith(
        'gpu-fraction="\uff10.\uff15": '
    )
    whole = pod("whole")
    whole["spec"]["schedulerName"] = "gpufrac"
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    created = await create(tenant_client, whole, guarded)
    base = created["metadata"]["annotations"][keys.ENV_CONFIGMAP_ANNOTATION]
    assert created["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": f"{base}-main", "optional": False}}
    ]


async def test_an_ephemeral_container_is_checked_through_its_subresource(
    control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient, guarded: str
) -> None:
    """`kubectl debug` adds a container through pods/ephemeralcontainers (v1.20: an EphemeralContainers
    object, without the pod), which the chart routes to the webhook like a pod update."""
    await create(admin_client, pod("debugged", {"gpu-fraction": "0.5"}), guarded)
    url = f"{control_plane.url}/api/v1/namespaces/{guarded}/pods/debugged/ephemeralcontainers"
    token = control_plane.identities["admin"].token
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))

    async def add(name: str, **fields: Any) -> httpx2.Response:
        async with httpx2.AsyncClient(verify=context, trust_env=False) as http:
            current = (await http.get(url, headers={"Authorization": f"Bearer {token}"})).json()
            current["ephemeralContainers"] = [
                *(current.get("ephemeralContainers") or []),
                {"name": name, "image": "busybox", "terminationMessagePolicy": "File", **fields},
            ]
            return await http.put(url, json=current, headers={"Authorization": f"Bearer {token}"})

    forged = await add("peek", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    assert forged.status_code == 403, forged.text
    assert "NVIDIA_VISIBLE_DEVICES" in forged.json()["message"]
    # (v1.20 refuses any securityContext on an ephemeral container itself, so privilege cannot come this way.)
    prefixed = await add("prefixed", envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "mine"}}])
    assert prefixed.status_code == 403 and 'prefix "NVIDIA_"' in prefixed.json()["message"], prefixed.text
    plain = await add("shell")
    assert plain.status_code == 200, plain.text
    assert [c["name"] for c in plain.json()["ephemeralContainers"]] == ["shell"]


async def test_sm_sharing_is_refused_in_a_namespace_outside_the_trusted_tier(
    webhook: tuple[RunningWebhook, str],
    namespace: str,
    admin_client: lightkube.AsyncClient,
    tenant_client: lightkube.AsyncClient,
) -> None:
    """The apiserver sends the namespace's pods to the untrusted entries, by the trust label's selector."""
    _, token = webhook
    await admin_client.patch(Namespace, namespace, {"metadata": {"labels": {LABEL: token}}})
    await wait_until_guarded(admin_client, namespace)
    try:
        sm = pod("sm", {"gpu-fraction": "0.5", f"{N}main.gpu-compute.mode": "sm-sharing"})
        with pytest.raises(lightkube.ApiError) as caught:
            await create(tenant_client, sm, namespace)
        said = denied_by_webhook(caught.value)
        assert f'namespace "{namespace}" is not trusted' in said and settings.TRUST_LABEL in said
        time_slicing = await create(tenant_client, pod("ts", {"gpu-fraction": "0.5"}), namespace)
        assert time_slicing["spec"]["schedulerName"] == "gpufrac"
    finally:
        await admin_client.patch(Namespace, namespace, {"metadata": {"labels": {LABEL: None}}})


async def test_a_binding_may_not_write_the_contract(
    control_plane: controlplane.ControlPlane, admin_client: lightkube.AsyncClient, guarded: str
) -> None:
    """The apiserver merges a Binding's annotations into its pod's, with no pod UPDATE for the webhook to
    see: through pods/binding, anyone RBAC lets bind (admin here) but the scheduler could grant devices."""
    waiting = pod("bound-by-hand", {"gpu-fraction": "0.5"})
    waiting["spec"]["schedulerName"] = "nobody"
    await create(admin_client, waiting, guarded)
    url = f"{control_plane.url}/api/v1/namespaces/{guarded}/pods/bound-by-hand/binding"
    headers = {"Authorization": f"Bearer {control_plane.identities['admin'].token}"}
    context = ssl.create_default_context(cafile=str(control_plane.ca_file))

    async def bind(annotations: dict[str, str]) -> httpx2.Response:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": "bound-by-hand", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "node-by-hand"},
        }
        async with httpx2.AsyncClient(verify=context, trust_env=False) as http:
            return await http.post(url, json=binding, headers=headers)

    forged = await bind({f"{N}main.gpus.devices": "GPU-0", f"{N}main.gpu-memory.limit": "80Gi"})
    assert forged.status_code == 403, forged.text
    assert "GPU contract annotations cannot change" in forged.json()["message"], forged.text
    plain = await bind({})  # as kube-scheduler binds: no annotations
    assert plain.status_code == 201, plain.text
    stored = (await admin_client.get(Pod, "bound-by-hand", namespace=guarded)).to_dict()
    assert stored["spec"]["nodeName"] == "node-by-hand"
    assert f"{N}main.gpus.devices" not in stored["metadata"]["annotations"]
