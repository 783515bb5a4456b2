"""The measures on allocations written by hand: fault domains, SM share, stranded memory, oversubscription."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpufrac.cluster.model import PodDemand
from gpufrac.contract.model import Portion, ShareRequest, WholeGpuRequest
from gpufrac.plan.measures import fault_domains, measure
from gpufrac.plan.packer import PodUse

MIB = 16_000


def asks(name: str, portion: Fraction) -> PodDemand:
    return PodDemand(name, shares=(ShareRequest("main", Portion(portion), Portion(portion)),))


def use(pod: str, gpus: tuple[int, ...], allocated: int, *, sm: bool = False, node: str = "n") -> PodUse:
    return PodUse(pod, "main", node, gpus, allocated, sm_sharing=sm)


def test_sm_sharing_gpus_linked_by_a_pod_form_one_domain() -> None:
    # p spans sm-sharing GPUs 0 and 1, q is on 0, r on 1: one domain of three; s time-slices alone.
    sm = {"p": [("n", 0), ("n", 1)], "q": [("n", 0)], "r": [("n", 1)]}
    assert sorted(fault_domains({"p", "q", "r", "s"}, sm)) == [1, 3]


def test_every_other_pod_is_its_own_domain() -> None:
    assert fault_domains({"a", "b"}, {}) == [1, 1]


def test_measures_of_an_sm_sharing_gpu_beside_a_whole_one() -> None:
    # GPU 0: three sm-sharing pods asking 0.25 each; GPU 1: a whole GPU; GPU 2 bought and idle.
    pods = {name: asks(name, Fraction(1, 4)) for name in "abc"} | {
        "w": PodDemand("w", whole=(WholeGpuRequest("w", 1),))
    }
    uses = [use(name, (0,), MIB // 4, sm=True) for name in "abc"] + [use("w", (1,), MIB)]
    result = measure(uses, {("n", 0): MIB, ("n", 1): MIB, ("n", 2): MIB}, pods)
    assert (result.gpus, result.busy_gpus, result.gpu_pods) == (3, 2, 4)
    assert result.allocated_gpus == result.requested_gpus == 1.75
    assert result.allocation_ratio == pytest.approx(100 * 1.75 / 3)
    # A quarter of GPU 0 is free beside its tenants: stranded. The idle GPU 2 is spare, not stranded.
    assert result.stranded_gb == 4
    assert result.stranded_percent == pytest.approx(100 / 12)
    assert (result.blast_radius_max, result.blast_radius_mean) == (3, 2)  # domains {a, b, c} and {w}
    assert result.tenants_per_busy_gpu == 2
    assert result.sm_share == pytest.approx(1 / 3)
    assert result.pods_per_gpu == pytest.approx(4 / 3)
    assert result.oversubscribed_pods == 0


def test_a_replica_smaller_than_the_request_oversubscribes() -> None:
    # Two pods asking 0.75 on replicas of half a GPU: both oversubscribe; the GPU is fully backed.
    pods = {name: asks(name, Fraction(3, 4)) for name in "xy"}
    result = measure([use("x", (0,), MIB // 2), use("y", (0,), MIB // 2)], {("n", 0): MIB}, pods)
    assert result.oversubscribed_pods == 2
    assert result.allocated_gpus == 1 and result.requested_gpus == 1.5
    assert result.stranded_gb == 0
