"""Properties of the contract over generated pods.

- A valid request written out in any of its equivalent spellings parses back to itself.
- Binding (resolving, rendering the annotations) changes neither what a pod asks for nor loses where it went.
- Any annotation map either parses or raises ContractError: the webhook never answers with a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from hypothesis import assume, given
from hypothesis import strategies as st

from gpufrac.contract import (
    ComputeMode,
    ContractError,
    Mebibytes,
    PodGpuRequest,
    PodPlacement,
    Portion,
    ShareRequest,
    WholeGpuPlacement,
    WholeGpuRequest,
    keys,
    parse_placement,
    parse_pod,
    render_annotations,
    resolve_share,
)

from .pods import make_pod

N = "nvidia.com/container."
MIB = 2**20
NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)


def _portion_texts(tenths_of_thousandths: int) -> st.SearchStrategy[str]:
    """Spellings of n / 10000 as a plain decimal."""
    return st.sampled_from(
        [
            str(Decimal(tenths_of_thousandths).scaleb(-4)),
            f"{tenths_of_thousandths}e-4",
            f"{tenths_of_thousandths}E-4",
        ]
    )


def _memory_texts(mib: int, *, kai: bool) -> st.SearchStrategy[str]:
    """Spellings of `mib` MiB; a bare number means MiB under `gpu-memory` and bytes under the NVIDIA keys."""
    texts = [f"{mib}Mi", f"{Decimal(mib * MIB).scaleb(-6)}M", str(mib) if kai else str(mib * MIB)]
    if mib % 1024 == 0:
        texts.append(f"{mib // 1024}Gi")
    # Anything above (mib - 1) MiB rounds up to mib.
    return st.sampled_from(texts) | st.integers(0, 1023).map(lambda short: f"{mib * 1024 - short}Ki")


@st.composite
def _kai_share(draw: st.DrawFn, container: str, *, first: bool) -> tuple[ShareRequest, dict[str, str]]:
    annotations: dict[str, str] = {}
    if draw(st.booleans()):
        request = draw(st.integers(1, 9999))
        limit = draw(st.integers(request, 10000)) if draw(st.booleans()) else None
        annotations["gpu-fraction"] = draw(_portion_texts(request))
        if limit is not None:
            annotations["gpu-fraction.limit"] = draw(_portion_texts(limit))
        amounts: tuple[Portion | Mebibytes, ...] = (
            Portion(Fraction(request, 10000)),
            Portion(Fraction(limit or request, 10000)),
        )
    else:
        request = draw(st.integers(1, 200_000))
        limit = draw(st.integers(request, 400_000)) if draw(st.booleans()) else None
        annotations["gpu-memory"] = draw(_memory_texts(request, kai=True))
        if limit is not None:
            annotations["gpu-memory.limit"] = draw(_memory_texts(limit, kai=True))
        amounts = (Mebibytes(request), Mebibytes(limit or request))
    devices = draw(st.integers(1, 4))
    if devices > 1 or draw(st.booleans()):
        annotations["gpu-fraction-num-devices"] = str(devices)
    if not first or draw(st.booleans()):
        annotations["gpu-fraction-container-name"] = container
    return ShareRequest(container, amounts[0], amounts[1], num_devices=devices), annotations


@st.composite
def _nvidia_share(draw: st.DrawFn, container: str) -> tuple[ShareRequest, dict[str, str]]:
    request = draw(st.integers(1, 200_000))
    limit = draw(st.integers(request, 400_000))
    # When the two are equal, either one alone says the same.
    written = {"request": request, "limit": limit}
    if request == limit:
        written = draw(st.sampled_from([written, {"request": request}, {"limit": limit}]))
    annotations = {
        f"{N}{container}.gpu-memory.{key}": draw(_memory_texts(mib, kai=False))
        for key, mib in written.items()
    }
    return ShareRequest(container, Mebibytes(request), Mebibytes(limit)), annotations


@dataclass(frozen=True)
class Case:
    """A valid request, and a pod that spells it in one of its many equivalent ways."""

    request: PodGpuRequest
    annotations: dict[str, str]
    containers: list[str]
    limits: dict[str, object]
    requests: dict[str, object]

    def pod(self, extra: dict[str, str] | None = None) -> dict[str, object]:
        annotations = {**self.annotations, **(extra or {})}
        return make_pod(annotations, self.containers, limits=self.limits, requests=self.requests)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    containers = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    kai_at = draw(st.none() | st.integers(0, len(containers) - 1))
    annotations: dict[str, str] = {}
    limits: dict[str, object] = {}
    requests: dict[str, object] = {}
    shares: list[ShareRequest] = []
    whole: list[WholeGpuRequest] = []
    for index, container in enumerate(containers):
        roles = ["none", "share"] if kai_at is not None else ["none", "share", "whole"]
        role = "kai" if index == kai_at else draw(st.sampled_from(roles))
        if role == "whole":
            count = draw(st.integers(1, 8))
            for amounts in draw(st.sampled_from([[limits], [requests], [limits, requests]])):
                amounts[container] = draw(st.sampled_from([count, str(count)]))
            whole.append(WholeGpuRequest(container, count))
        elif role != "none":
            share, written = draw(
                _kai_share(container, first=index == 0) if role == "kai" else _nvidia_share(container)
            )
            annotations.update(written)
            mode = draw(st.sampled_from(ComputeMode))
            if mode is ComputeMode.SM_SHARING or draw(st.booleans()):
                annotations[f"{N}{container}.gpu-compute.mode"] = mode.value
            cap = draw(st.none() | st.integers(1, 100)) if mode is ComputeMode.SM_SHARING else None
            if cap is not None:
                annotations[f"gpufrac.io/container.{container}.compute-percentage"] = str(cap)
            shares.append(
                ShareRequest(share.container, share.request, share.limit, mode, share.num_devices, cap)
            )
    return Case(PodGpuRequest(tuple(shares), tuple(whole)), annotations, containers, limits, requests)


def _place(request: PodGpuRequest, *, gpu_mib: int) -> PodPlacement | None:
    """Every container on GPUs of `gpu_mib` MiB, or None where a portion is too small for them."""
    try:
        shares = tuple(
            resolve_share(
                share,
                devices=[f"GPU-{share.container}-{n}" for n in range(share.num_devices)],
                gpu_mib=gpu_mib,
            )
            for share in request.shares
        )
    except ContractError:
        return None
    whole = tuple(
        WholeGpuPlacement(item.container, tuple(map(str, range(item.count)))) for item in request.whole
    )
    return PodPlacement(shares, whole)


@given(cases())
def test_a_valid_request_parses_back_to_itself(case: Case) -> None:
    assert parse_pod(case.pod()) == case.request


@given(cases(), st.integers(min_value=1024, max_value=200_000))
def test_binding_keeps_the_request_and_the_placement_reads_back(case: Case, gpu_mib: int) -> None:
    placement = _place(case.request, gpu_mib=gpu_mib)
    assume(placement is not None)
    assert placement is not None
    bound = case.pod(render_annotations(placement))
    assert parse_pod(bound) == case.request
    assert parse_placement(bound) == (placement if placement.shares or placement.whole else None)


_CONTAINERS = ["app", "side"]
_KEYS = st.sampled_from(
    [
        *sorted(keys.POD_KEYS),
        "nvidia.com/container.",
        *(
            f"{N}{container}.{suffix}"
            for container in [*_CONTAINERS, "ghost", ""]
            for suffix in [
                *keys.CONTAINER_SUFFIXES,
                "x",
                "",
            ]
        ),
        *(
            f"gpufrac.io/container.{container}.{suffix}"
            for container in _CONTAINERS
            for suffix in ["compute-percentage", "gpus.devices"]
        ),
    ]
) | st.text(max_size=30)
_VALUES = (
    st.sampled_from(["0.5", "1", "0", "-1", "2", "8Gi", "1000M", "1e3", "", " ", "app", "side", "sm-sharing"])
    | st.sampled_from(
        ["time-slicing", "GPU-a", "GPU-a,GPU-b", "0,0", ",", "1e999", "1.5", "NaN", "inf", "100", "101"]
    )
    | st.text(max_size=12)
    | st.integers()
    | st.floats()
    | st.none()
    | st.booleans()
)
_GPUS = st.dictionaries(
    st.sampled_from(_CONTAINERS),
    st.integers(-2, 3) | st.sampled_from(["1", "2", "0.5", "x", "1e3"]) | st.none(),
)


@given(st.dictionaries(_KEYS, _VALUES, max_size=8), _GPUS, _GPUS)
def test_any_annotation_map_parses_or_raises_contract_error(
    annotations: dict[str, object], limits: dict[str, object], requests: dict[str, object]
) -> None:
    pod = make_pod(annotations, _CONTAINERS, limits=limits, requests=requests)
    for parse in (parse_pod, parse_placement):
        try:
            result = parse(pod)
        except ContractError:
            continue
        assert result is None or isinstance(result, PodGpuRequest | PodPlacement)
