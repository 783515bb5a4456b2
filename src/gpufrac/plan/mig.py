"""MIG profiles as data, and the slot arithmetic that says where on a GPU an instance can go.

Source: NVIDIA's Multi-Instance GPU User Guide. "Supported MIG Profiles" gives each model's profiles with
their fractions of memory (eighths) and of compute (sevenths); "Getting Started with MIG", listing the
possible placements (`nvidia-smi mig -lgipp`), gives each profile's allowed start slots and size in
memory slices, e.g. `{0,2,4}:2` for a 2g profile. The four models below share one geometry: seven compute
slices, eight memory slices. The guide's table puts 1g.10gb (A100-40GB) at 1/8 of memory, but its name
and its placements (two slices, `{0,2,4,6}:2`) say 2/8; the placements are what bound packing, so 2/8 is
used. The `+me` (media extension) profiles are left out: they are the size of the plain 1g profile and at
most one fits per GPU.

A profile's memory for fitting is its memory slices ÷ 8 of the GPU's memory (the guide's fraction), not
the rounded GB in its name: the name of H200's 1g.18gb rounds up 141 GB ÷ 8.

A GPU's occupancy is an 8-bit mask of memory slices. The placements alone keep compute within seven
slices (every profile that can reach slice 7 has fewer compute than memory slices), so the mask is the
whole state; `tests/plan/test_mig.py` checks that on every reachable mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
FULL_MASK = (1 << MEMORY_SLICES) - 1


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    memory_gb: int  # as in the profile's name
    compute: int  # compute slices, of 7
    memory: int  # memory slices, of 8
    starts: tuple[int, ...]  # allowed first memory slice

    def mask(self, start: int) -> int:
        return ((1 << self.memory) - 1) << start

    def capacity_mib(self, gpu_memory_mib: int) -> int:
        return self.memory * gpu_memory_mib // MEMORY_SLICES


# The table. The four models share one geometry, so it is given once: per profile, smallest first, its
# compute slices, memory slices and allowed start slots; then per model its GPU memory and each profile's
# memory as named (a profile is called <compute>g.<GB>gb).
GEOMETRY = (
    (1, 1, (0, 1, 2, 3, 4, 5, 6)),  # 1g, one memory slice: 7 instances
    (1, 2, (0, 2, 4, 6)),  # 1g, two memory slices: 4 instances
    (2, 2, (0, 2, 4)),  # 2g: 3 instances
    (3, 4, (0, 4)),  # 3g: 2 instances
    (4, 4, (0,)),  # 4g: 1 instance
    (7, 8, (0,)),  # 7g, the whole GPU: 1 instance
)
PROFILE_GB = {
    "A100-40GB": (40, (5, 10, 10, 20, 20, 40)),
    "A100-80GB": (80, (10, 20, 20, 40, 40, 80)),
    "H100-80GB": (80, (10, 20, 20, 40, 40, 80)),
    "H200-141GB": (141, (18, 35, 35, 71, 71, 141)),
}

# model: (GPU memory GB, its profiles smallest first)
MIG_MODELS: dict[str, tuple[int, tuple[Profile, ...]]] = {
    model: (
        gpu_gb,
        tuple(
            Profile(f"{compute}g.{gb}gb", gb, compute, memory, starts)
            for (compute, memory, starts), gb in zip(GEOMETRY, sizes, strict=True)
        ),
    )
    for model, (gpu_gb, sizes) in PROFILE_GB.items()
}

# A GPU without MIG holds one tenant, whole: a single profile that takes every slice.
WHOLE = Profile("whole", 0, COMPUTE_SLICES, MEMORY_SLICES, (0,))


def profiles(model: str) -> tuple[Profile, ...]:
    """The model's profiles, smallest first; a model without MIG has only `WHOLE`."""
    entry = MIG_MODELS.get(model)
    return entry[1] if entry else (WHOLE,)


def smallest_fit(model: str, request_mib: int, gpu_memory_mib: int) -> int | None:
    """Index into `profiles(model)` of the smallest profile that holds the request, by memory and then
    compute, or None when even the whole GPU is too small. The trace has no compute demand, so 2g and 4g,
    which add only compute to a 1g or 3g of the same memory, are never chosen."""
    for index, profile in enumerate(profiles(model)):
        if request_mib <= profile.capacity_mib(gpu_memory_mib):
            return index
    return None


def options_left(mask: int, model: str) -> int:
    """How many (profile, start) placements a mask still allows: what a good start slot keeps high."""
    return sum(1 for profile in profiles(model) for start in profile.starts if not mask & profile.mask(start))


@cache
def start_table(model: str) -> np.ndarray:
    """(profiles, 256) int8: for each occupancy mask, where each profile goes, or -1 when it fits nowhere.

    Among the free start slots the one that leaves the most placements open wins; on a tie, the highest,
    which keeps the low slots (where the large profiles start) free.
    """
    table = np.full((len(profiles(model)), FULL_MASK + 1), -1, np.int8)
    for index, profile in enumerate(profiles(model)):
        for mask in range(FULL_MASK + 1):
            free = [start for start in profile.starts if not mask & profile.mask(start)]
            if free:
                table[index, mask] = max(free, key=lambda s: (options_left(mask | profile.mask(s), model), s))
    return table


POPCOUNT = np.array([bin(mask).count("1") for mask in range(FULL_MASK + 1)], np.int64)
