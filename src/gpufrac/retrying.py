"""How long to wait before trying again, for every loop that retries: the scheduling queue, the reflector,
the MPS supervisor."""

from __future__ import annotations

# Doubling 64 times passes any ceiling a wait has (a first wait of a nanosecond becomes 584 years), and
# leaves the float far from overflowing.
MAX_DOUBLINGS = 64


def doubling(times: int, *, first: float, ceiling: float) -> float:
    """`first` doubled `times` times, at most `ceiling`. The doublings are bounded before the power is
    taken: `first * 2**times` overflows a float past 1023 doublings, which a retry reaches after a thousand
    failures in a row (a pod that waits a day for room, an API server down for eight hours)."""
    return min(ceiling, first * 2 ** min(times, MAX_DOUBLINGS))
