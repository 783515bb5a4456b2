"""`gpufrac.io/gpu-memory`: shares as an extended resource, so that Kubernetes can count them.

A share lives in annotations, which a `ResourceQuota`, Kueue, the cluster autoscaler and `kubectl describe
node` cannot see. The webhook therefore also gives each share container this resource (requests = limits,
as extended resources must), and the node agent advertises each node's capacity of it.

The unit is the byte, as for `memory`, and every amount is a whole number of MiB: a quota reads
`requests.gpufrac.io/gpu-memory: 160Gi`, a container `gpufrac.io/gpu-memory: 40Gi`. It counts what a share
is guaranteed (its request, on each of its devices), not its limit, as `requests.memory` does.

A `gpu-fraction` has no size until the scheduler picks a GPU, but a pod's resources are fixed at admission,
so a fraction f counts f x a *reference GPU* of R MiB (`--fraction-reference-mib`, one value for the webhook
and the agent). For the kubelet's admission to accept whatever the scheduler places, each GPU advertises
max(its usable MiB, R): a GPU holds at most its usable MiB of `gpu-memory` shares and at most a whole GPU of
fractions, each fraction counting f x R where it holds f x its usable MiB. Set R to the usable memory of
the largest GPU model, so that a fraction never counts less than it holds.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufrac.contract.model import Mebibytes, ShareRequest
from gpufrac.contract.render import portion_mib

GPU_MEMORY_RESOURCE = "gpufrac.io/gpu-memory"
# An 80 GiB GPU (A100 80GB, H100): R, unless the operator says otherwise.
DEFAULT_FRACTION_REFERENCE_MIB = 80 * 1024


def counted_mib(share: ShareRequest, reference_mib: int) -> int:
    """The MiB of `GPU_MEMORY_RESOURCE` a share container requests: its request on each of its devices, a
    fraction resolved on the reference GPU (never 0: an extended resource of 0 would count nothing)."""
    amount = share.request
    per_device = (
        amount.value if isinstance(amount, Mebibytes) else max(1, portion_mib(amount.value, reference_mib))
    )
    return per_device * share.num_devices


def capacity_mib(usable_mib: Iterable[int], reference_mib: int) -> int:
    """A node's capacity of `GPU_MEMORY_RESOURCE`: each GPU's usable MiB, or R where that is more."""
    return sum(max(usable, reference_mib) for usable in usable_mib)
