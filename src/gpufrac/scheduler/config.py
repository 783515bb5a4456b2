"""The scheduler's settings (`gpufrac scheduler`'s flags), read by the loop and the parts it delegates to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpufrac import contract
from gpufrac.contract import node_inventory
from gpufrac.scheduler import reservations

# The placement policy unless told otherwise: on every one of the FGD paper's 17 openb traces it leaves
# fewer GPUs unallocated than FGD and every other policy here (README, "Beyond FGD").
DEFAULT_POLICY = "fgd-stranding"


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    name: str = "gpufrac"
    policy: str = DEFAULT_POLICY
    node_selector: Mapping[str, str] = field(default_factory=dict)
    env_delivery: contract.EnvDelivery = contract.EnvDelivery.CONFIGMAP
    mps_pipe_directory: str = contract.DEFAULT_MPS_PIPE_DIRECTORY
    # A bind holds one HTTP connection for its two writes (the env ConfigMap, then the Binding), so binds
    # in flight bound the rate at about binds / (2 x request latency), and on a busy API server a write
    # takes tens of milliseconds: with 16, gpufrac bound 66-74 pods/s on a loaded 2-core machine, no more
    # than kube-scheduler (QPS 1000), which binds every pod in its own goroutine; with 64, 93 pods/s against
    # its 78 in the same run. httpcore's pool walks every connection on each request, which costs the
    # scheduler CPU as connections grow (benchmarks/scheduler.py --profile: 3.9 ms of scheduler CPU per pod
    # at 16 on a quiet machine, 4.8 at 64 on a busy one), a price worth the rate.
    max_concurrent_binds: int = 64
    # GPU pods only on nodes whose agent set `gpufrac.io/Ready` (off: nodes without an agent, e.g. tests),
    # and refreshed it within `agent_heartbeat_timeout` seconds (0: never stale).
    require_ready: bool = True
    agent_heartbeat_timeout: float = node_inventory.HEARTBEAT_TIMEOUT_SECONDS
    # The scheduler's own namespace, where tenants create nothing: its Lease and its reservation pods; what
    # those run, and how long one whose GPU holds no share is kept before it goes back to the device plugin.
    namespace: str = "gpufrac-system"
    reservation_image: str = reservations.DEFAULT_IMAGE
    reservation_idle_seconds: float = 10.0
    # sm-sharing shares share a GPU only within one fault domain: the pod's namespace, or, with this set,
    # the namespaces carrying the same value of this namespace label (an admin's label; tenants cannot
    # label namespaces).
    fault_domain_label: str = ""
    # Evictions to let a pending pod in (scheduler/mover.py): moves of pods that opted in (defragmentation),
    # preemption of lower priorities in its queue, reclaim from queues over their fair share. At most
    # `max_moves` pods per pending pod (0: never evict), none running for less than `min_runtime` seconds,
    # none at or above `protected_priority`; `preemption` off: moves only.
    max_moves: int = 3
    min_runtime: float = 600.0
    # Percent of the GPUs kept empty for whole-GPU pods: a share of most of a GPU that would open one of
    # them waits (placement/reserve.py). 0: off, every share that fits is placed.
    whole_gpu_reserve: float = 0.0
    preemption: bool = True
    protected_priority: int = 100
    # Tenant queues (Queue objects, queues.gpufrac.io): pods are taken from the queue furthest below its fair
    # share first. Needs the chart's CustomResourceDefinition.
    queues: bool = False
    # Gangs (PodGroup objects, podgroups.gpufrac.io): a group's pods are bound together once `minMember` of
    # them can run. Needs the chart's CustomResourceDefinition.
    gangs: bool = False
    # How long a bind waits for the volumes of a pod's delayed-binding claims to be provisioned
    # (scheduler/volumes.py), as kube-scheduler's bindTimeoutSeconds: past it the pod is placed again.
    volume_bind_timeout: float = 600.0
