"""The MIG table and its rounding, profile by profile, and the slot rules on one GPU."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest

from gpufrac.cluster.model import GpuSpec, NodeSpec, PodDemand, Unschedulable
from gpufrac.contract.model import Mebibytes, Portion, ShareRequest
from gpufrac.plan import mig
from gpufrac.plan.mig_packer import MigPacker

# Per model, the profile names smallest first, as the MIG user guide lists them.
NAMES = {
    "A100-40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200-141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}
# The guide's instance counts per GPU for the six profiles, the same on all four models.
INSTANCES = (7, 4, 3, 2, 1, 1)


def test_the_table_holds_the_four_models() -> None:
    assert {model: tuple(p.name for p in mig.profiles(model)) for model in mig.MIG_MODELS} == NAMES


@pytest.mark.parametrize("model", sorted(mig.MIG_MODELS))
def test_each_profile_is_consistent_with_its_name_and_the_gpu(model: str) -> None:
    gpu_gb, profiles = mig.MIG_MODELS[model]
    for profile, instances in zip(profiles, INSTANCES, strict=True):
        compute, memory_gb = profile.name.split(".")
        assert int(compute.removesuffix("g")) == profile.compute
        assert memory_gb == f"{profile.memory_gb}gb"
        # The name's GB is the memory fraction of the GPU, rounded (up, on H200).
        assert abs(profile.memory_gb - gpu_gb * profile.memory / 8) < 1
        assert all(start >= 0 and start + profile.memory <= 8 for start in profile.starts)
        # As many instances fit as the guide says, placed at its allowed starts.
        assert _most_instances(profile) == instances
    assert profiles[-1].memory_gb == gpu_gb


def _most_instances(profile: mig.Profile) -> int:
    best = 0
    for count in range(1, len(profile.starts) + 1):
        for starts in itertools.combinations(profile.starts, count):
            masks = [profile.mask(start) for start in starts]
            if sum(bin(mask).count("1") for mask in masks) == bin(sum(masks)).count("1"):
                best = max(best, count)
    return best


@pytest.mark.parametrize("model", sorted(mig.MIG_MODELS))
def test_slots_alone_keep_compute_within_seven_slices(model: str) -> None:
    """Every combination the placements allow uses at most 7 compute slices, so a mask is enough state."""
    seen = {(0, 0)}
    todo = [(0, 0)]
    while todo:
        mask, compute = todo.pop()
        for profile in mig.profiles(model):
            for start in profile.starts:
                if not mask & profile.mask(start):
                    state = (mask | profile.mask(start), compute + profile.compute)
                    if state not in seen:
                        seen.add(state)
                        todo.append(state)
    assert max(compute for _, compute in seen) == mig.COMPUTE_SLICES


# (portion in thousandths, index of the expected profile): on every model, the smallest by memory, then
# compute. Index 1 is the 2-slice 1g profile, 3 is 3g; 2g and 4g (indices 2 and 4) only add compute.
ROUNDING = [(1, 0), (125, 0), (126, 1), (250, 1), (251, 3), (500, 3), (501, 5), (999, 5), (1000, 5)]


@pytest.mark.parametrize("model", sorted(mig.MIG_MODELS))
@pytest.mark.parametrize(("milli", "index"), ROUNDING)
def test_portions_round_up_to_the_smallest_profile(model: str, milli: int, index: int) -> None:
    memory = 1000 * mig.MIG_MODELS[model][0]
    request = milli * memory // 1000
    assert mig.profiles(model)[mig.smallest_fit(model, request, memory) or 0].name == NAMES[model][index]


@pytest.mark.parametrize(
    ("mib", "expected"),
    [(1, "1g.10gb"), (10_000, "1g.10gb"), (10_001, "1g.20gb"), (20_001, "3g.40gb"), (40_001, "7g.80gb")],
)
def test_absolute_requests_round_up_on_h100(mib: int, expected: str) -> None:
    index = mig.smallest_fit("H100-80GB", mib, 80_000)
    assert index is not None and mig.profiles("H100-80GB")[index].name == expected


def test_a_request_above_the_gpu_fits_no_profile() -> None:
    assert mig.smallest_fit("H100-80GB", 80_001, 80_000) is None
    assert mig.smallest_fit("T4", 16_001, 16_000) is None


def test_a_gpu_without_mig_has_one_whole_profile() -> None:
    assert mig.profiles("T4") == (mig.WHOLE,)
    assert mig.smallest_fit("T4", 1, 16_000) == 0


def test_the_start_table_keeps_the_large_profiles_possible() -> None:
    # A lone 1g.5gb goes to slice 6, where it blocks the fewest placements: slices 0-3 stay free for a 3g
    # or the 4g, and 4-5 for a 2g.
    table = mig.start_table("A100-40GB")
    assert table[0, 0] == 6
    assert table[5, 0] == 0 and table[5, 1 << 6] == -1  # 7g.40gb needs an empty GPU


def gpu(model: str = "A100-40GB", count: int = 1) -> MigPacker:
    memory = 1000 * mig.MIG_MODELS.get(model, (16, ()))[0]
    gpus = tuple(GpuSpec(i, f"g{i}", model, memory) for i in range(count))
    return MigPacker([NodeSpec("n", 64_000, 262_144, gpus)])


def pod(name: str, milli: int, devices: int = 1) -> PodDemand:
    amount = Portion(Fraction(milli, 1000))
    return PodDemand(name, shares=(ShareRequest("main", amount, amount, num_devices=devices),))


def fill(packer: MigPacker, milli: list[int]) -> list[bool]:
    return [not isinstance(packer.place(pod(f"p{i}", m)), Unschedulable) for i, m in enumerate(milli)]


@pytest.mark.parametrize(
    ("requests", "placed"),
    [
        ([125] * 8, [True] * 7 + [False]),  # 1g.5gb starts at slices 0-6 only: seven, though 1/8 is free
        ([250] * 5, [True] * 4 + [False]),  # 1g.10gb at 0, 2, 4, 6
        ([500] * 3, [True, True, False]),  # 3g.20gb at 0 and 4
        ([500] + [125] * 5, [True] * 5 + [False]),  # 3g + four 1g.5gb: all seven compute slices
        ([500, 250, 250, 250], [True, True, True, False]),  # 3g at 4, 1g.10gb at 0 and 2
        ([125, 1000], [True, False]),  # a whole GPU (7g.40gb) needs an empty one
    ],
)
def test_slot_rules_on_one_a100(requests: list[int], placed: list[bool]) -> None:
    assert fill(gpu(), requests) == placed


def test_release_frees_the_slots() -> None:
    packer = gpu()
    assert fill(packer, [500, 500]) == [True, True]
    assert isinstance(packer.place(pod("late", 125)), Unschedulable)
    packer.release("p0")
    assert packer.place(pod("late", 125)) == "n"
    assert packer.busy_gpus() == 1


def test_without_mig_every_share_takes_a_whole_gpu() -> None:
    packer = gpu("T4", count=2)
    assert fill(packer, [100, 100, 100]) == [True, True, False]
    assert [use.allocated_mib for use in packer.uses()] == [16_000, 16_000]


def test_multi_device_shares_take_distinct_gpus() -> None:
    packer = gpu(count=2)
    assert packer.place(pod("wide", 500, devices=2)) == "n"
    (use,) = packer.uses()
    assert use.gpus == (0, 1) and use.allocated_mib == 20_000
    assert not isinstance(packer.place(pod("again", 500, devices=2)), Unschedulable)
    assert isinstance(packer.place(pod("third", 125)), Unschedulable)


def test_absolute_memory_above_every_gpu_fits_nowhere() -> None:
    big = Mebibytes(50_000)
    demand = PodDemand("big", shares=(ShareRequest("main", big, big),))
    outcome = gpu().place(demand)
    assert isinstance(outcome, Unschedulable) and outcome.reasons == {"no free GPU or MIG slot": 1}
