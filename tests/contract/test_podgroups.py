"""PodGroup objects read into `PodGroupSpec`s, with a one-line reason for each way one can be wrong, and the
group a pod is in."""

from __future__ import annotations

from typing import Any

import pytest

from gpufrac.contract import ContractError
from gpufrac.contract.podgroups import PodGroupSpec, group_of, parse_pod_group


def group(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "team"}, "spec": spec}


def test_a_pod_group() -> None:
    assert parse_pod_group(group(minMember=4, queue="team-a", scheduleTimeoutSeconds=60)) == PodGroupSpec(
        "team", "train", 4, "team-a", 60.0
    )
    assert parse_pod_group(group(minMember=1)).timeout_seconds == 300.0


@pytest.mark.parametrize(
    ("obj", "says"),
    [
        (group(), "spec.minMember"),
        (group(minMember=0), "from 1 to 10000"),
        (group(minMember=True), "spec.minMember"),
        (group(minMember="3"), "spec.minMember"),
        (group(minMember=2, queue=""), "spec.queue"),
        (group(minMember=2, scheduleTimeoutSeconds=0), "above 0"),
        (group(minMember=2, scheduleTimeoutSeconds=float("inf")), "scheduleTimeoutSeconds"),
        ({"metadata": {"name": "train"}, "spec": {"minMember": 1}}, "a name and a namespace"),
        ({"metadata": [], "spec": {}}, "metadata"),
    ],
)
def test_a_bad_pod_group_is_refused_with_the_field(obj: dict[str, Any], says: str) -> None:
    with pytest.raises(ContractError, match=says):
        parse_pod_group(obj)


def test_the_group_a_pod_is_in() -> None:
    def pod(labels: Any = None, annotations: Any = None) -> dict[str, Any]:
        return {"metadata": {"namespace": "team", "labels": labels, "annotations": annotations}}

    assert group_of(pod({"gpufrac.io/pod-group": "train"})) == "team/train"
    assert group_of(pod(annotations={"pod-group-name": "kai"})) == "team/kai"  # KAI's annotation
    assert group_of(pod({"gpufrac.io/pod-group": "train"}, {"pod-group-name": "kai"})) == "team/train"
    assert group_of(pod()) is None and group_of(pod({"gpufrac.io/pod-group": 3})) is None
    assert group_of({"metadata": "garbage"}) is None
