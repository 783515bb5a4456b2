"""How the webhook is configured: the `Policy` the `gpufrac webhook` flags build, and their defaults.

The defaults live here, not in the CLI, so that a Policy made in a test or a benchmark is the deployed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpufrac import contract
from gpufrac.contract import memory_resource

DEFAULT_SCHEDULER_IDENTITY = "system:serviceaccount:gpufrac-system:gpufrac-scheduler"
DEFAULT_SCHEDULER_NAME = "gpufrac"
DEFAULT_EXEMPT_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "gpufrac-system")
# Who deletes an env ConfigMap once its pod is gone: the garbage collector (it is owned by the pod) and
# the namespace controller, under their own service accounts or, without per-controller credentials, the
# controller manager's. A deletion grants nothing: a container whose ConfigMap is gone cannot start.
DEFAULT_CONFIGMAP_DELETERS = (
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:serviceaccount:kube-system:namespace-controller",
    "system:kube-controller-manager",
)


# Trust tiers: sm-sharing puts a GPU's processes behind one MPS server, one fault domain, so only namespaces
# an admin labelled `gpufrac.io/trust=trusted` may use it. The apiserver tells the webhook which tier a
# namespace is in by which of two webhook entries (namespace selectors on this label) called it, and so by
# the path: `/mutate/trusted`, `/validate/trusted`; the plain paths are the untrusted tier, the safe default.
TRUST_LABEL = "gpufrac.io/trust"
TRUSTED = "trusted"
REWRITTEN_ANNOTATION = "gpufrac.io/compute-mode-rewritten"


class UntrustedSmSharing(StrEnum):
    """What happens to sm-sharing asked from an untrusted namespace."""

    DENY = "deny"  # refused by validation, with the fix
    TIME_SLICING = "time-slicing"  # rewritten by the mutation, and said in `REWRITTEN_ANNOTATION`


@dataclass(frozen=True)
class Policy:
    """How this webhook is configured (the `gpufrac webhook` flags)."""

    scheduler_identity: str = DEFAULT_SCHEDULER_IDENTITY
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    exempt_namespaces: frozenset[str] = frozenset(DEFAULT_EXEMPT_NAMESPACES)
    configmap_deleters: frozenset[str] = frozenset(DEFAULT_CONFIGMAP_DELETERS)
    env_delivery: contract.EnvDelivery = contract.EnvDelivery.CONFIGMAP
    mps_host_directory: str = contract.DEFAULT_MPS_PIPE_DIRECTORY
    # Host directories a pod may mount (and anything below them); none by default (see pod_guards).
    allowed_host_paths: tuple[str, ...] = ()
    untrusted_sm_sharing: UntrustedSmSharing = UntrustedSmSharing.DENY
    # The reference GPU a `gpu-fraction` counts on in `gpufrac.io/gpu-memory` (`contract.memory_resource`).
    fraction_reference_mib: int = memory_resource.DEFAULT_FRACTION_REFERENCE_MIB

    def __post_init__(self) -> None:
        # Mounted read-write into every sm-sharing pod: a shared directory (`/run`) is refused at startup,
        # not handed to tenants.
        contract.check_mps_directory(self.mps_host_directory, flag="--mps-host-directory")

    def is_scheduler(self, user: str) -> bool:
        """Whether `user` is the scheduler, the one writer of scheduler-owned keys and env ConfigMaps."""
        return user == self.scheduler_identity
