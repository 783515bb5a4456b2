"""A real Kubernetes control plane for the integration tests, started by ``hack/test-cluster``.

A real kube-apiserver rather than a fake, because what the scheduler and the webhook must get right is the
apiserver's behaviour: RBAC, admission (the not-ready taint, the ``default`` ServiceAccount check),
subresources such as ``pods/binding``, and watch semantics. A fake would only echo our own assumptions.

The shell script does the starting, so that a developer gets the same cluster by hand
(``hack/test-cluster start DIR``); this module adds the identities the tests need and the RBAC they run
under.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import lightkube
import pytest
import yaml
from lightkube import codecs
from lightkube.core.resource import NamespacedResource

from gpufrac.scheduler import binder

from . import chart

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "test-cluster"
TENANT_ROLE = Path(__file__).with_name("tenant-role.yaml")

SCHEDULER_NAMESPACE = chart.NAMESPACE
SCHEDULER_USER = f"system:serviceaccount:{SCHEDULER_NAMESPACE}:gpufrac-scheduler"
AGENT_USER = f"system:serviceaccount:{SCHEDULER_NAMESPACE}:gpufrac-agent"
TENANT_USER = "tenant"
REAL_NODE = "real-node-1"  # see kubelet/realnode.py
REAL_NODE_USER = f"system:node:{REAL_NODE}"

# Controllers the tests need: namespace deletion that empties the namespace, garbage collection of owned
# objects (gpufrac's env ConfigMaps are owned by their pod), `default` ServiceAccounts, and the workload
# controllers of the examples the real node runs (Deployment, ReplicaSet, Job), and ResourceQuota's (the quota
# on gpufrac.io/gpu-memory is enforced only once it has written the quota's status). Not the node lifecycle
# controller: it would mark every fake node NotReady.
CONTROLLERS = "namespace,garbagecollector,serviceaccount,deployment,replicaset,job,resourcequota"


T = TypeVar("T")


class ControlPlaneError(Exception):
    """The control plane could not be started; the message says why and where the logs are."""


# How long each part of the test cluster took to start ("control plane", "real node"), for the summary.
START_SECONDS = pytest.StashKey[dict[str, float]]()


def started(start: Callable[[], T], needs: str) -> T:
    """What ``start()`` returns; if it raises ControlPlaneError, the test fails (never skips) with why."""
    try:
        return start()
    except ControlPlaneError as e:
        why = str(e)
    pytest.fail(f"{needs}, and it did not start: {why}", pytrace=False)


@dataclass(frozen=True)
class Identity:
    """One way of talking to the apiserver: a static bearer token and a kubeconfig file that holds it."""

    name: str
    user: str
    groups: tuple[str, ...]
    token: str
    kubeconfig: Path


@dataclass(frozen=True)
class ControlPlane:
    """A running etcd and kube-apiserver (and a trimmed kube-controller-manager) on loopback."""

    rundir: Path
    url: str
    ca_file: Path
    identities: dict[str, Identity]
    start_seconds: float

    def kubeconfig(self, identity: str = "admin") -> Path:
        """The kubeconfig file of ``identity`` (admin, scheduler or tenant), e.g. for a subprocess."""
        return self.identities[identity].kubeconfig

    def config(self, identity: str = "admin") -> lightkube.KubeConfig:
        return lightkube.KubeConfig.from_file(self.kubeconfig(identity))

    def client(self, identity: str = "admin", *, namespace: str | None = None) -> lightkube.AsyncClient:
        # trust_env=False: a proxy from the environment must not see loopback traffic.
        return lightkube.AsyncClient(
            self.config(identity), namespace=namespace, trust_env=False, field_manager="gpufrac-tests"
        )

    def sync_client(self, identity: str = "admin") -> lightkube.Client:
        return lightkube.Client(self.config(identity), trust_env=False, field_manager="gpufrac-tests")

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.rundir)], check=False, capture_output=True, timeout=60)


def _identities(rundir: Path) -> list[Identity]:
    def make(name: str, user: str, *groups: str) -> Identity:
        return Identity(name, user, groups, secrets.token_hex(16), rundir / f"kubeconfig-{name}")

    return [
        make("admin", "admin", "system:masters"),
        make(
            "scheduler",
            SCHEDULER_USER,
            "system:serviceaccounts",
            f"system:serviceaccounts:{SCHEDULER_NAMESPACE}",
        ),
        make("tenant", TENANT_USER),
        make("agent", AGENT_USER, "system:serviceaccounts", f"system:serviceaccounts:{SCHEDULER_NAMESPACE}"),
        # The real node's kubelet (realnode.py): the apiserver reads the token file once, at start.
        make("node", REAL_NODE_USER, "system:nodes"),
    ]


def _write_kubeconfig(identity: Identity, *, url: str, ca_file: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": url, "certificate-authority": str(ca_file)}}],
        "users": [{"name": identity.name, "user": {"token": identity.token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": identity.name}}],
        "current-context": "test",
    }
    identity.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))


def start(rundir: Path, *, controllers: str = CONTROLLERS) -> ControlPlane:
    """Start a control plane in ``rundir`` and set up the scheduler's RBAC; raise ControlPlaneError.

    The processes also stop when this process dies, however it dies (the script watches our pid).
    """
    rundir.mkdir(parents=True, exist_ok=True)
    identities = _identities(rundir)
    # The first line is the admin: the script's own kubeconfig and readiness checks use it.
    lines = [f'{i.token},{i.user},{i.user},"{",".join(i.groups)}"' for i in identities]
    (rundir / "tokens.csv").write_text("\n".join(lines) + "\n")
    env = dict(os.environ, OWNER_PID=str(os.getpid()), CONTROLLERS=controllers)
    env.pop("PORT", None)
    env.pop("ETCD_PORT", None)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(SCRIPT), "start", str(rundir)], env=env, capture_output=True, text=True, timeout=180
        )
    except subprocess.TimeoutExpired as e:
        subprocess.run([str(SCRIPT), "stop", str(rundir)], check=False, capture_output=True)
        raise ControlPlaneError(f"hack/test-cluster start timed out after {e.timeout}s; see {rundir}") from e
    if done.returncode != 0:
        why = done.stderr.strip()
        raise ControlPlaneError(
            f"hack/test-cluster start failed (exit {done.returncode}); see {rundir}\n{why}"
        )
    settings = dict(
        line.split("=", 1) for line in (rundir / "cluster.env").read_text().splitlines() if "=" in line
    )
    url, ca_file = settings["APISERVER_URL"], Path(settings["CA_FILE"])
    for identity in identities:
        _write_kubeconfig(identity, url=url, ca_file=ca_file)
    plane = ControlPlane(
        rundir=rundir,
        url=url,
        ca_file=ca_file,
        identities={i.name: i for i in identities},
        start_seconds=time.monotonic() - started,
    )
    try:
        with plane.sync_client() as admin:
            for document in chart.rbac_objects():
                admin.create(codecs.from_dict(document))
    except Exception as e:
        plane.stop()
        raise ControlPlaneError(
            f"could not apply the Helm chart's RBAC ({chart.CHART.relative_to(REPO)}): {e}"
        ) from e
    return plane


def tenant_objects(namespace: str) -> list[NamespacedResource]:
    """The tenant's Role and RoleBinding in ``namespace``."""
    objects = codecs.load_all_yaml(TENANT_ROLE.read_text())
    for obj in objects:
        assert isinstance(obj, NamespacedResource) and obj.metadata is not None
        obj.metadata.namespace = namespace
    return objects  # type: ignore[return-value]


async def bind_pod(client: lightkube.AsyncClient, pod: str, node: str, *, namespace: str) -> None:
    """Bind ``pod`` to ``node`` as a scheduler does: POST pods/binding."""
    await binder.post_binding(client, name=pod, namespace=namespace, node=node)
