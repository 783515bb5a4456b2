"""Fixtures for tests against a real control plane: one etcd, kube-apiserver and trimmed
kube-controller-manager per pytest session (see controlplane.py and hack/README.md).

Every test in this folder is marked ``integration``, so ``pytest -m "not integration"`` leaves them out.
A control plane that cannot start fails these tests with the reason; it never skips them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import lightkube
import pytest
import yaml
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment, ReplicaSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.scheduling_v1 import PriorityClass
from lightkube.types import PatchType

from gpufrac.kubeapi.custom import QUEUE_RESOURCE

from . import controlplane, fakenodes, scheduling

CRDS = Path(__file__).parents[2] / "deploy/helm/gpufrac/crds"

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    for part, seconds in config.stash.get(controlplane.START_SECONDS, {}).items():
        terminalreporter.write_line(f"{part} started in {seconds:.1f}s")


@pytest.fixture(scope="session")
def control_plane(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[controlplane.ControlPlane]:
    """The session's control plane: ``url``, ``ca_file``, ``kubeconfig(identity)``, ``client(identity)``,
    with the identities ``admin`` (system:masters), ``scheduler`` (the gpufrac-scheduler service account
    under the Helm chart's RBAC) and ``tenant`` (edit-like rights in each test namespace)."""
    folder = tmp_path_factory.mktemp("control-plane")
    plane = controlplane.started(
        lambda: controlplane.start(folder), "the integration tests need a control plane"
    )
    request.config.stash.setdefault(controlplane.START_SECONDS, {})["control plane"] = plane.start_seconds
    yield plane
    plane.stop()


@pytest.fixture
async def namespace(control_plane: controlplane.ControlPlane) -> AsyncIterator[str]:
    """A fresh namespace, with a ``default`` ServiceAccount (so pods can be created) and the tenant's
    Role and RoleBinding; deleted after the test."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    # The ServiceAccount admission plugin refuses pods whose service account has no token Secret, and
    # nothing here creates token Secrets; so the account does not mount tokens.
    async with control_plane.client() as admin:
        await admin.create(Namespace(metadata=ObjectMeta(name=name)))
        try:
            meta = ObjectMeta(name="default", namespace=name)
            await admin.create(ServiceAccount(metadata=meta, automountServiceAccountToken=False))
        except lightkube.ApiError as e:
            if e.status.code != 409:
                raise
            # The serviceaccount controller was quicker.
            no_token = {"automountServiceAccountToken": False}
            await admin.patch(ServiceAccount, "default", no_token, namespace=name, patch_type=PatchType.MERGE)
        for obj in controlplane.tenant_objects(name):
            await admin.create(obj)
    yield name
    async with control_plane.client() as admin:
        await empty_and_delete(admin, name)


async def empty_and_delete(admin: lightkube.AsyncClient, name: str) -> None:
    """Delete a test's namespace. Controllers first, so that none recreates the pods deleted next: a pod
    left pending while the namespace empties in the background would be scheduled (or made room for) by the
    next test. Then the pods, at once: a pod bound to a node waits for its kubelet to confirm the deletion,
    and there is none. Whatever went meanwhile with its owner (a Deployment's ReplicaSet, its pods) is gone
    already."""
    for kind in (Deployment, ReplicaSet, Job, Pod):
        async for item in admin.list(kind, namespace=name):
            assert item.metadata is not None and item.metadata.name is not None
            try:
                await admin.delete(kind, item.metadata.name, namespace=name, grace_period=0)
            except lightkube.ApiError as error:
                if error.status.code != 404:
                    raise
    await admin.delete(Namespace, name)


@pytest.fixture
async def other_namespace(admin_client: lightkube.AsyncClient, namespace: str) -> AsyncIterator[str]:
    """A second namespace for the test (another team's, another fault domain), emptied and deleted after."""
    other = f"{namespace}-b"
    await admin_client.create(Namespace(metadata=ObjectMeta(name=other)))
    yield other
    await empty_and_delete(admin_client, other)


@pytest.fixture
async def admin_client(control_plane: controlplane.ControlPlane) -> AsyncIterator[lightkube.AsyncClient]:
    """An AsyncClient as ``admin`` (system:masters); default namespace ``default``."""
    async with control_plane.client("admin") as client:
        yield client


@pytest.fixture
async def scheduler_client(control_plane: controlplane.ControlPlane) -> AsyncIterator[lightkube.AsyncClient]:
    """An AsyncClient as the gpufrac scheduler's service account; default namespace ``default``."""
    async with control_plane.client("scheduler") as client:
        yield client


@pytest.fixture
async def tenant_client(
    control_plane: controlplane.ControlPlane, namespace: str
) -> AsyncIterator[lightkube.AsyncClient]:
    """An AsyncClient as the user ``tenant``, whose default namespace is the test's ``namespace``."""
    async with control_plane.client("tenant", namespace=namespace) as client:
        yield client


@pytest.fixture
async def gpu_nodes(admin_client: lightkube.AsyncClient, namespace: str) -> AsyncIterator[fakenodes.GpuNodes]:
    """Makes fake GPU nodes (``await gpu_nodes.create(gpus=4, ...)``) and deletes them after the test.

    Before deleting them it recomputes the allocation from the API objects alone (every GPU's requests and
    modes, from the bound pods' annotations): whatever a test did, no GPU may end up oversubscribed or with
    two modes. Depending on ``namespace`` keeps the test's pods alive until that check has run.
    """
    nodes = fakenodes.GpuNodes(admin_client, prefix=f"gpu-{uuid.uuid4().hex[:6]}")
    yield nodes
    problems = await scheduling.allocation_problems(admin_client)
    await nodes.delete_all()
    assert problems == [], f"the allocation recomputed from the API objects is unsound: {problems}"


async def install_crd(client: lightkube.AsyncClient, name: str) -> None:
    """The chart's CustomResourceDefinition `name` (kept once made: the control plane outlives the test),
    once the API server serves it."""
    try:
        await client.create(
            CustomResourceDefinition.from_dict(yaml.safe_load((CRDS / f"{name}.yaml").read_text()))
        )
    except lightkube.ApiError as error:
        if error.status.code != 409:
            raise
    deadline = time.monotonic() + 30
    while True:  # served once Established
        crd = (await client.get(CustomResourceDefinition, name)).to_dict()
        if any(
            c["type"] == "Established" and c["status"] == "True" for c in crd["status"].get("conditions", [])
        ):
            return
        assert time.monotonic() < deadline, f"the CRD {name} was not established"
        await asyncio.sleep(0.2)


@pytest.fixture
async def team_queues(admin_client: lightkube.AsyncClient) -> AsyncIterator[list[str]]:
    """The Queue CRD and queues team-a and team-b, each guaranteed one GPU."""
    await install_crd(admin_client, "queues.gpufrac.io")
    names = ["team-a", "team-b"]
    for name in names:
        body = {"metadata": {"name": name}, "spec": {"resources": {"gpus": {"quota": 1}}}}
        await admin_client.create(QUEUE_RESOURCE.from_dict(body))
    yield names
    for name in names:
        await admin_client.delete(QUEUE_RESOURCE, name)


# Priority classes for preemption tests: below, between and above what other pods have, and one past the
# protected priority (100).
PRIORITY_CLASSES = {"gpufrac-test-low": 10, "gpufrac-test-high": 50, "gpufrac-test-critical": 150}


@pytest.fixture
async def priority_classes(admin_client: lightkube.AsyncClient) -> AsyncIterator[None]:
    for name, value in PRIORITY_CLASSES.items():
        await admin_client.create(PriorityClass.from_dict({"metadata": {"name": name}, "value": value}))
    yield
    for name in PRIORITY_CLASSES:
        await admin_client.delete(PriorityClass, name)
