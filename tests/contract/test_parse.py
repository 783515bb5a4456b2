"""parse_pod: what each form of request parses to, and every rule with its exact message."""

from __future__ import annotations

import json
from fractions import Fraction

import pytest

from gpufrac.contract import (
    ComputeMode,
    ContractError,
    Mebibytes,
    PodGpuRequest,
    Portion,
    ShareRequest,
    WholeGpuRequest,
    granted_to_another,
    kai_share_container,
    keys,
    parse_pod,
)
from gpufrac.contract.parse import MAX_SHARE_CONTAINERS

from .pods import make_pod

N = "nvidia.com/container."
MIXED = "cannot be combined with gpu-fraction; ask for a portion or an amount, not both"
NOT_A_QUANTITY = "not a Kubernetes quantity (for example 8Gi, 512Mi, 1G or 1e9)"


def refusal(pod: dict[str, object]) -> str:
    with pytest.raises(ContractError) as caught:
        parse_pod(pod)
    return str(caught.value)


# What each form parses to.


def test_a_pod_without_gpu_keys_asks_for_nothing() -> None:
    assert parse_pod(make_pod({"prometheus.io/scrape": "true"})) == PodGpuRequest()
    assert parse_pod({}) == PodGpuRequest()


def test_gpu_fraction_goes_to_the_first_container_with_the_limit_equal_to_the_request() -> None:
    request = parse_pod(make_pod({"gpu-fraction": "0.25"}, ["app", "sidecar"]))
    assert request == PodGpuRequest(
        shares=(ShareRequest("app", Portion(Fraction(1, 4)), Portion(Fraction(1, 4))),)
    )


def test_gpu_fraction_with_limit_mode_devices_and_named_container() -> None:
    pod = make_pod(
        {
            "gpu-fraction": "0.5",
            "gpu-fraction.limit": "1",
            "gpu-fraction-num-devices": "2",
            "gpu-fraction-container-name": "trainer",
            f"{N}trainer.gpu-compute.mode": "sm-sharing",
        },
        ["sidecar", "trainer"],
    )
    share = ShareRequest("trainer", Portion(Fraction(1, 2)), Portion(Fraction(1)), ComputeMode.SM_SHARING, 2)
    assert parse_pod(pod) == PodGpuRequest(shares=(share,))


@pytest.mark.parametrize(("text", "mib"), [("20480", 20480), ("20Gi", 20480), ("1000M", 954)])
def test_gpu_memory_bare_integer_is_mib_and_quantities_are_bytes(text: str, mib: int) -> None:
    assert parse_pod(make_pod({"gpu-memory": text})).shares == (
        ShareRequest("app", Mebibytes(mib), Mebibytes(mib)),
    )


def test_gpu_memory_with_limit() -> None:
    shares = parse_pod(make_pod({"gpu-memory": "20Gi", "gpu-memory.limit": "40960"})).shares
    assert shares == (ShareRequest("app", Mebibytes(20480), Mebibytes(40960)),)


def test_nvidia_keys_give_each_container_its_own_share_in_container_order() -> None:
    pod = make_pod(
        {
            f"{N}b.gpu-memory.request": "1Gi",
            f"{N}a.gpu-memory.request": "8Gi",
            f"{N}a.gpu-memory.limit": "16Gi",
            f"{N}a.gpu-compute.mode": "time-slicing",
        },
        ["a", "b", "c"],
    )
    assert parse_pod(pod).shares == (
        ShareRequest("a", Mebibytes(8192), Mebibytes(16384)),
        ShareRequest("b", Mebibytes(1024), Mebibytes(1024)),
    )


def test_a_request_alone_sets_the_limit_and_a_limit_alone_sets_the_request() -> None:
    alone = parse_pod(make_pod({f"{N}app.gpu-memory.request": "1000M"})).shares[0]
    assert (alone.request, alone.limit) == (Mebibytes(954), Mebibytes(954))
    alone = parse_pod(make_pod({f"{N}app.gpu-memory.limit": "2Gi"})).shares[0]
    assert (alone.request, alone.limit) == (Mebibytes(2048), Mebibytes(2048))


def test_a_bare_number_in_nvidia_keys_is_bytes() -> None:
    assert parse_pod(make_pod({f"{N}app.gpu-memory.request": "1073741824"})).shares[0].request == Mebibytes(
        1024
    )


def test_whole_gpus_come_from_limits_or_requests() -> None:
    pod = make_pod(
        containers=["a", "b", "c", "d"], limits={"a": "2", "c": 0, "d": 1}, requests={"b": 1, "d": "1"}
    )
    assert parse_pod(pod).whole == (WholeGpuRequest("a", 2), WholeGpuRequest("b", 1), WholeGpuRequest("d", 1))


def test_whole_gpus_and_nvidia_shares_live_in_different_containers_of_one_pod() -> None:
    pod = make_pod({f"{N}b.gpu-memory.request": "1Gi"}, ["a", "b"], limits={"a": 1})
    assert parse_pod(pod) == PodGpuRequest(
        shares=(ShareRequest("b", Mebibytes(1024), Mebibytes(1024)),), whole=(WholeGpuRequest("a", 1),)
    )


def test_a_kai_share_and_an_nvidia_share_in_other_containers() -> None:
    pod = make_pod({"gpu-fraction": "0.5", f"{N}b.gpu-memory.request": "1Gi"}, ["a", "b"])
    assert [share.container for share in parse_pod(pod).shares] == ["a", "b"]


def test_a_scheduler_written_devices_key_does_not_change_the_request() -> None:
    pod = make_pod({f"{N}app.gpu-memory.request": "1Gi", f"{N}app.gpus.devices": "GPU-1"})
    assert parse_pod(pod).shares == (ShareRequest("app", Mebibytes(1024), Mebibytes(1024)),)


def test_on_a_bound_pod_the_resolved_memory_of_a_kai_share_is_not_a_second_request() -> None:
    bound = {
        "gpu-fraction": "0.5",
        f"{N}app.gpu-memory.request": "40960Mi",
        f"{N}app.gpu-memory.limit": "40960Mi",
        f"{N}app.gpu-compute.mode": "time-slicing",
        f"{N}app.gpus.devices": "GPU-1",
    }
    assert parse_pod(make_pod(bound)) == parse_pod(make_pod({"gpu-fraction": "0.5"}))


# Every rule, each with its own message.


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {f"{N}app.gpu-memory.request": "9Gi", f"{N}app.gpu-memory.limit": "8Gi"},
            'nvidia.com/container.app.gpu-memory.request="9Gi": request exceeds limit "8Gi"',
        ),
        (
            {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.4"},
            'gpu-fraction="0.5": request exceeds limit "0.4"',
        ),
        (
            {"gpu-memory": "20Gi", "gpu-memory.limit": "10240"},
            'gpu-memory="20Gi": request exceeds limit "10240"',
        ),
    ],
)
def test_request_must_not_exceed_limit(annotations: dict[str, str], message: str) -> None:
    assert refusal(make_pod(annotations)) == message


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({"gpu-fraction": "0"}, 'gpu-fraction="0": must be greater than 0'),
        ({"gpu-fraction": "-0.5"}, 'gpu-fraction="-0.5": must be greater than 0'),
        (
            {"gpu-fraction": "1"},
            'gpu-fraction="1": must be less than 1; ask for whole GPUs with the nvidia.com/gpu resource',
        ),
        (
            {"gpu-fraction": "1.5"},
            'gpu-fraction="1.5": must be less than 1; ask for whole GPUs with the nvidia.com/gpu resource',
        ),
        (
            {"gpu-fraction": "0.5", "gpu-fraction.limit": "1.01"},
            'gpu-fraction.limit="1.01": must be at most 1, a whole GPU',
        ),
        ({"gpu-fraction": "half"}, 'gpu-fraction="half": not a decimal number (for example 0.25)'),
        ({"gpu-fraction": "50%"}, 'gpu-fraction="50%": not a decimal number (for example 0.25)'),
        (
            {"gpu-fraction": "0.5", "gpu-fraction.limit": ""},
            'gpu-fraction.limit="": not a decimal number (for example 0.25)',
        ),
    ],
)
def test_fraction_is_between_0_and_1(annotations: dict[str, str], message: str) -> None:
    assert refusal(make_pod(annotations)) == message


def test_a_fraction_limit_of_exactly_one_is_allowed() -> None:
    share = parse_pod(make_pod({"gpu-fraction": "0.9", "gpu-fraction.limit": "1.0"})).shares[0]
    assert share.limit == Portion(Fraction(1))


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"gpu-fraction": "0.5", "gpu-memory": "8Gi"},
            'gpu-memory="8Gi": ' + MIXED,
        ),
        (
            {"gpu-fraction": "0.5", "gpu-memory.limit": "8Gi"},
            'gpu-memory.limit="8Gi": ' + MIXED,
        ),
        (
            {"gpu-memory": "8Gi", "gpu-fraction.limit": "0.5"},
            'gpu-memory="8Gi": ' + MIXED,
        ),
    ],
)
def test_fraction_and_memory_forms_do_not_mix(annotations: dict[str, str], message: str) -> None:
    assert refusal(make_pod(annotations)) == message


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {"gpu-fraction.limit": "0.5"},
            'gpu-fraction.limit="0.5": needs gpu-fraction, the guaranteed amount',
        ),
        ({"gpu-memory.limit": "8Gi"}, 'gpu-memory.limit="8Gi": needs gpu-memory, the guaranteed amount'),
    ],
)
def test_a_kai_limit_needs_its_request(annotations: dict[str, str], message: str) -> None:
    assert refusal(make_pod(annotations)) == message


@pytest.mark.parametrize("key", ["gpu-fraction", "gpu-memory"])
def test_a_kai_share_is_not_combined_with_whole_gpus_anywhere_in_the_pod(key: str) -> None:
    value = "0.5" if key == "gpu-fraction" else "8Gi"
    pod = make_pod({key: value}, ["app", "helper"], limits={"helper": "2"})
    assert refusal(pod) == (
        f'{key}="{value}": cannot be combined with the nvidia.com/gpu resource (container "helper" has'
        " nvidia.com/gpu: 2); ask for whole GPUs or a share, not both"
    )


@pytest.mark.parametrize("key", ["gpu-memory.request", "gpu-memory.limit"])
def test_an_nvidia_share_is_not_combined_with_whole_gpus_in_one_container(key: str) -> None:
    pod = make_pod({f"{N}app.{key}": "8Gi"}, limits={"app": 1})
    assert refusal(pod) == (
        f'nvidia.com/container.app.{key}="8Gi": container "app" also has nvidia.com/gpu;'
        " ask for a share or whole GPUs"
    )


@pytest.mark.parametrize("key", ["gpu-memory.request", "gpu-memory.limit"])
def test_a_kai_share_and_nvidia_memory_keys_do_not_mix_on_one_container(key: str) -> None:
    pod = make_pod({"gpu-fraction": "0.5", f"{N}app.{key}": "8Gi"})
    assert refusal(pod) == (
        f'nvidia.com/container.app.{key}="8Gi": container "app" has its share from gpu-fraction already;'
        " set memory one way"
    )


def test_the_named_container_must_exist() -> None:
    pod = make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "trainer"}, ["app", "sidecar"])
    assert refusal(pod) == (
        'gpu-fraction-container-name="trainer": no such container; the pod has containers "app", "sidecar"'
    )


def test_a_share_needs_a_container() -> None:
    assert refusal(make_pod({"gpu-memory": "8Gi"}, [])) == (
        'gpu-memory="8Gi": the pod has no container to give the share to'
    )


def test_the_container_of_an_nvidia_key_must_exist() -> None:
    assert refusal(make_pod({f"{N}web.gpu-memory.request": "8Gi"}, ["app"])) == (
        'nvidia.com/container.web.gpu-memory.request="8Gi": no container "web"; the pod has containers "app"'
    )
    assert refusal(make_pod({f"{N}web.gpu-memory.request": "8Gi"}, [])) == (
        'nvidia.com/container.web.gpu-memory.request="8Gi": no container "web"; the pod has no containers'
    )


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("", 'is blank; set "time-slicing" or "sm-sharing", or remove the key for time-slicing'),
        ("  ", 'is blank; set "time-slicing" or "sm-sharing", or remove the key for time-slicing'),
        ("mps", 'must be exactly "time-slicing" or "sm-sharing"'),
        ("Time-Slicing", 'must be exactly "time-slicing" or "sm-sharing"'),
        (" sm-sharing", 'must be exactly "time-slicing" or "sm-sharing"'),
    ],
)
def test_the_mode_is_exactly_one_of_two(value: str, rule: str) -> None:
    pod = make_pod({"gpu-fraction": "0.5", f"{N}app.gpu-compute.mode": value})
    assert refusal(pod) == f'nvidia.com/container.app.gpu-compute.mode="{value}": {rule}'


def test_a_mode_needs_a_share() -> None:
    message = 'nvidia.com/container.app.gpu-compute.mode="sm-sharing": container "app" has no GPU share'
    assert refusal(make_pod({f"{N}app.gpu-compute.mode": "sm-sharing"})) == message
    assert refusal(make_pod({f"{N}app.gpu-compute.mode": "sm-sharing"}, limits={"app": 1})) == message


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "two", "", "+2"])
def test_num_devices_is_a_positive_integer(value: str) -> None:
    pod = make_pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": value})
    assert refusal(pod) == f'gpu-fraction-num-devices="{value}": must be a positive whole number'


@pytest.mark.parametrize(
    ("key", "value"), [("gpu-fraction-num-devices", "2"), ("gpu-fraction-container-name", "app")]
)
def test_share_options_need_a_share(key: str, value: str) -> None:
    assert refusal(make_pod({key: value})) == (
        f'{key}="{value}": applies to a share, but the pod sets neither gpu-fraction nor gpu-memory'
    )


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        (
            {f"{N}app.gpu-memory.request": "0"},
            'nvidia.com/container.app.gpu-memory.request="0": must be at least 1 MiB',
        ),
        (
            {f"{N}app.gpu-memory.limit": "-1Gi"},
            'nvidia.com/container.app.gpu-memory.limit="-1Gi": must be at least 1 MiB',
        ),
        ({"gpu-memory": "0"}, 'gpu-memory="0": must be at least 1 MiB'),
        (
            {"gpu-memory": "8Gi", "gpu-memory.limit": "-8Gi"},
            'gpu-memory.limit="-8Gi": must be at least 1 MiB',
        ),
        (
            {f"{N}app.gpu-memory.request": "8GB"},
            'nvidia.com/container.app.gpu-memory.request="8GB": ' + NOT_A_QUANTITY,
        ),
        (
            {"gpu-memory": "1.5"},
            'gpu-memory="1.5": a number without a unit means MiB and must be whole; add a unit, as in 1536Mi',
        ),
    ],
)
def test_memory_is_a_quantity_of_at_least_one_mib(annotations: dict[str, str], message: str) -> None:
    assert refusal(make_pod(annotations)) == message


@pytest.mark.parametrize("suffix", ["gpu-memory", "gpu-memory.requests", "gpus.device", "", "gpu-fraction"])
def test_unknown_keys_under_nvidia_container_list_the_valid_suffixes(suffix: str) -> None:
    key = f"{N}app.{suffix}"
    assert refusal(make_pod({key: "1"})) == (
        f'{key}="1": unknown key; the keys under nvidia.com/container.<container>. are gpu-memory.request,'
        " gpu-memory.limit, gpu-compute.mode, gpus.devices"
    )


def test_a_key_with_no_container_is_unknown() -> None:
    assert refusal(make_pod({"nvidia.com/container.": "1"})).startswith(
        'nvidia.com/container.="1": unknown key;'
    )


@pytest.mark.parametrize(
    ("value", "type_name"), [(0.5, "float"), (2, "int"), (True, "bool"), (None, "NoneType")]
)
def test_annotation_values_must_be_strings(value: object, type_name: str) -> None:
    assert refusal(make_pod({"gpu-fraction": value})) == (
        f'gpu-fraction="{value}": annotation values must be strings, not {type_name}; quote the value'
    )


def test_values_of_other_annotations_are_not_the_contract_s_business() -> None:
    assert parse_pod(make_pod({"example.com/replicas": 3, 7: "x"})) == PodGpuRequest()


@pytest.mark.parametrize(
    ("limits", "requests", "message"),
    [
        (
            {"app": "2"},
            {"app": "1"},
            'nvidia.com/gpu="2": container "app" has limits "2", requests "1"; make them equal',
        ),
        ({"app": "1.5"}, None, 'nvidia.com/gpu="1.5": container "app" must ask for a whole number of GPUs'),
        ({"app": 0.5}, None, 'nvidia.com/gpu="0.5": container "app" must ask for a whole number of GPUs'),
        ({"app": "-1"}, None, 'nvidia.com/gpu="-1": container "app" must ask for a whole number of GPUs'),
        (
            {"app": "one"},
            None,
            'nvidia.com/gpu="one": ' + NOT_A_QUANTITY,
        ),
        ({"app": True}, None, 'nvidia.com/gpu="True": container "app" must give a quantity'),
    ],
)
def test_whole_gpu_counts(
    limits: dict[str, object], requests: dict[str, object] | None, message: str
) -> None:
    assert refusal(make_pod(limits=limits, requests=requests)) == message


def test_equal_limits_and_requests_in_different_spellings_agree() -> None:
    assert parse_pod(make_pod(limits={"app": "2"}, requests={"app": 2})).whole == (WholeGpuRequest("app", 2),)


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ({"metadata": []}, 'metadata="[]": must be a map'),
        ({"metadata": {"annotations": "x"}}, 'metadata.annotations="x": must be a map'),
        ({"spec": {"containers": "app"}}, 'spec.containers="app": must be a list'),
        (
            {"spec": {"containers": [{"image": "x"}]}},
            'spec.containers[].name="None": every container needs a name',
        ),
        ({"spec": {"containers": ["app"]}}, 'spec.containers[]="app": must be a map'),
        (
            {"spec": {"containers": [{"name": "a", "resources": {"limits": ["nvidia.com/gpu"]}}]}},
            "spec.containers[a].resources.limits=\"['nvidia.com/gpu']\": must be a map",
        ),
    ],
)
def test_malformed_pods_are_contract_errors(pod: dict[str, object], message: str) -> None:
    assert refusal(pod) == message


@pytest.mark.parametrize("value", ["yes", "True", "", 1, None, ["true"]])
def test_consent_to_be_moved_is_true_or_false(value: object) -> None:
    if value is None:
        assert parse_pod({"metadata": {"annotations": {keys.MOVABLE_ANNOTATION: None}}}) == parse_pod({})
        return
    message = refusal({"metadata": {"annotations": {keys.MOVABLE_ANNOTATION: value}}})
    assert message.startswith(f"{keys.MOVABLE_ANNOTATION}=") and 'expected "true"' in message
    for consent in ("true", "false"):
        assert parse_pod({"metadata": {"annotations": {keys.MOVABLE_ANNOTATION: consent}}}) == parse_pod({})


def test_a_long_malformed_value_is_shortened_in_the_message() -> None:
    message = refusal({"metadata": ["x" * 100]})
    assert len(message) < 100
    assert message.endswith('...": must be a map')


def test_contract_error_carries_its_parts() -> None:
    with pytest.raises(ContractError) as caught:
        parse_pod(make_pod({"gpu-fraction": "2"}))
    error = caught.value
    assert (error.key, error.value) == ("gpu-fraction", "2")
    assert error.rule.startswith("must be less than 1")
    assert isinstance(error, ValueError)


def test_the_kai_share_goes_to_the_named_container_or_the_first() -> None:
    assert kai_share_container(make_pod({"gpu-fraction": "0.5"}, ("app", "sidecar"))) == "app"
    named = {"gpu-fraction": "0.5", "gpu-fraction-container-name": "sidecar"}
    assert kai_share_container(make_pod(named, ("app", "sidecar"))) == "sidecar"
    assert kai_share_container(make_pod({"nvidia.com/container.app.gpu-memory.request": "1Gi"})) is None
    with pytest.raises(ContractError, match="no such container"):
        kai_share_container(make_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "x"}))


# Hostile input: other scripts' digits, huge numbers, huge pods (issue 11).


@pytest.mark.parametrize(
    ("annotations", "key"),
    [
        ({"gpu-fraction": "\uff10.\uff15"}, "gpu-fraction"),
        ({"gpu-memory": "\uff18Gi"}, "gpu-memory"),
        ({"gpu-memory": "\u0668\u0661\u0669\u0662"}, "gpu-memory"),
        ({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "\uff12"}, "gpu-fraction-num-devices"),
        ({f"{N}app.gpu-memory.request": "\uff11Gi"}, f"{N}app.gpu-memory.request"),
    ],
)
def test_a_number_in_digits_other_than_ascii_is_a_contract_error(
    annotations: dict[str, str], key: str
) -> None:
    assert refusal(make_pod(annotations)).startswith(f'{key}="{annotations[key]}": ')


def test_a_gpu_count_in_other_digits_is_a_contract_error() -> None:
    assert refusal(make_pod(limits={"app": "\uff11"})).startswith('nvidia.com/gpu="\uff11": ')


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-fraction": "0." + "1" * 5000},
        {"gpu-memory": "1" * 5000},
        {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "1" * 5000},
        {f"{N}app.gpu-memory.request": "1" * 5000 + "Mi"},
    ],
)
def test_a_five_thousand_digit_number_is_a_short_contract_error(annotations: dict[str, str]) -> None:
    message = refusal(make_pod(annotations))
    assert "..." in message and len(message) < 200


def test_a_long_value_is_quoted_briefly_but_kept_whole_in_the_error() -> None:
    value = "x" * 100_000
    with pytest.raises(ContractError) as caught:
        parse_pod(make_pod({f"{N}app.gpu-compute.mode": value, f"{N}app.gpu-memory.request": "1Gi"}))
    assert caught.value.value == value
    assert len(str(caught.value)) < 200


def test_a_message_lists_a_few_container_names_only() -> None:
    names = [f"c{i}" for i in range(1000)]
    message = refusal(make_pod({f"{N}other.gpu-memory.request": "1Gi"}, names))
    assert message.endswith('"c6", "c7" and 992 more')


class _CountingName(str):
    """A container name that counts how often it is compared."""

    comparisons = 0
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        _CountingName.comparisons += 1
        return str.__eq__(self, other)


def test_reading_a_pod_is_linear_in_its_containers_and_annotations() -> None:
    # One annotation per container: a list lookup per annotation would compare about n*n/2 names.
    n = 2000
    names = [f"c{i}" for i in range(n)]
    sharing = names[-MAX_SHARE_CONTAINERS:]
    pod = make_pod({f"{N}{name}.gpu-memory.request": "1Gi" for name in sharing}, names)
    for container, name in zip(pod["spec"]["containers"], names, strict=True):  # type: ignore[index]
        container["name"] = _CountingName(name)
    _CountingName.comparisons = 0
    assert len(parse_pod(pod).shares) == MAX_SHARE_CONTAINERS
    assert _CountingName.comparisons <= 4 * n


def test_a_pod_may_hold_shares_in_at_most_64_containers() -> None:
    """The scheduler searches every way of putting a pod's shares on a node's GPUs."""
    names = [f"c{i}" for i in range(MAX_SHARE_CONTAINERS + 1)]
    pod = make_pod({f"{N}{name}.gpu-memory.request": "1Gi" for name in names}, names)
    assert refusal(pod) == (
        f'{N}c64.gpu-memory.request="1Gi": a pod may hold shares in at most {MAX_SHARE_CONTAINERS} containers'
    )


def test_a_contract_is_granted_to_another_pod_only_when_the_marker_names_another_uid() -> None:
    def pod(annotations: object, uid: object = "uid-now") -> dict[str, object]:
        return {"metadata": {"uid": uid, "annotations": annotations}}

    assert granted_to_another(pod({keys.BOUND_UID_ANNOTATION: "uid-before"})) == "uid-before"
    assert granted_to_another(pod({keys.BOUND_UID_ANNOTATION: "uid-now"})) is None
    assert granted_to_another(pod({})) is None  # bound by no gpufrac Binding, or by one before the marker
    for odd in (
        pod(None),
        pod({keys.BOUND_UID_ANNOTATION: 7}),
        pod({keys.BOUND_UID_ANNOTATION: "x"}, uid=None),
    ):
        assert granted_to_another(odd) is None
    assert granted_to_another({"metadata": "garbage"}) is None


@pytest.mark.parametrize("key", ["gpu-fraction", "gpu-fraction.limit"])
def test_a_portion_finer_than_nine_decimal_places_is_refused(key: str) -> None:
    """Finer steps mean nothing on any GPU, and unbounded ones overflow the engine's int64 arithmetic."""
    fine = {"gpu-fraction": "0.25", "gpu-fraction.limit": "0.5", key: "0.5000000000000000001"}
    assert "more than 9 decimal places" in refusal(make_pod(annotations=fine))
    ok = {
        "gpu-fraction": "0.25",
        "gpu-fraction.limit": "0.5",
        key: "0.123456789" if key == "gpu-fraction" else "0.5",
    }
    assert parse_pod(make_pod(annotations=ok)).shares


# The compute cap: gpufrac's own per-container key, for sm-sharing shares only.

CAP = "gpufrac.io/container.app.compute-percentage"
SM_SHARING = {f"{N}app.gpu-memory.request": "4Gi", f"{N}app.gpu-compute.mode": "sm-sharing"}


@pytest.mark.parametrize("text", ["1", "30", "100", "050"])
def test_an_sm_sharing_share_takes_a_compute_cap_of_1_to_100(text: str) -> None:
    (share,) = parse_pod(make_pod({**SM_SHARING, CAP: text})).shares
    assert share.compute_percent == int(text)


def test_a_kai_share_takes_a_compute_cap_too() -> None:
    pod = make_pod({"gpu-fraction": "0.5", f"{N}app.gpu-compute.mode": "sm-sharing", CAP: "25"})
    assert parse_pod(pod).shares == (
        ShareRequest("app", Portion(Fraction(1, 2)), Portion(Fraction(1, 2)), ComputeMode.SM_SHARING, 1, 25),
    )


def test_a_share_without_a_cap_has_none() -> None:
    assert parse_pod(make_pod(SM_SHARING)).shares[0].compute_percent is None


@pytest.mark.parametrize("text", ["0", "101", "-5", "50%", "0.5", "", " 50", "1000", "\uff15\uff10"])
def test_a_compute_cap_must_be_a_whole_percentage(text: str) -> None:
    assert refusal(make_pod({**SM_SHARING, CAP: text})) == (
        f"{CAP}={json.dumps(text, ensure_ascii=False)}: must be a whole number from 1 to 100, "
        "a percentage of the GPU's SMs"
    )


@pytest.mark.parametrize("mode", [{}, {f"{N}app.gpu-compute.mode": "time-slicing"}])
def test_a_compute_cap_on_a_time_slicing_share_is_refused_with_why(mode: dict[str, str]) -> None:
    pod = make_pod({f"{N}app.gpu-memory.request": "4Gi", **mode, CAP: "50"})
    assert refusal(pod) == (
        f'{CAP}="50": caps SMs through MPS, which a time-slicing share does not use: time-slicing gives each '
        "process the whole GPU in turn, so there is no per-client SM cap to set; set "
        f'{N}app.gpu-compute.mode: "sm-sharing", or remove the cap'
    )


def test_a_compute_cap_on_a_container_without_a_share_is_refused() -> None:
    pod = make_pod(
        {"gpu-fraction": "0.5", "gpufrac.io/container.side.compute-percentage": "50"}, ["app", "side"]
    )
    assert (
        refusal(pod) == 'gpufrac.io/container.side.compute-percentage="50": container "side" has no GPU share'
    )


@pytest.mark.parametrize("suffix", ["gpu-memory.request", "gpus.devices", "compute-percent", ""])
def test_unknown_keys_under_gpufrac_container_list_gpufrac_s_suffixes(suffix: str) -> None:
    key = f"gpufrac.io/container.app.{suffix}"
    assert refusal(make_pod({**SM_SHARING, key: "1"})) == (
        f'{key}="1": unknown key; the keys under gpufrac.io/container.<container>. are compute-percentage'
    )


def test_the_cap_is_no_key_of_nvidia_s_family() -> None:
    key = f"{N}app.compute-percentage"
    assert refusal(make_pod({**SM_SHARING, key: "50"})).startswith(f'{key}="50": unknown key;')
