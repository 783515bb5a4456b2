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


class Backoffs:
    """Requests refused in a row, by key, and when each may be asked again. A refusal that lasts (a quota,
    RBAC, a namespace being deleted, an API server that drops writes) would otherwise be asked again at
    every round of a loop that runs many times a second, for every key at once."""

    def __init__(self, *, first: float = 1.0, ceiling: float = 60.0) -> None:
        self.first, self.ceiling = first, ceiling
        self._refusals: dict[str, tuple[int, float]] = {}  # key -> refusals in a row, when to ask again

    def refused(self, key: str, *, now: float) -> None:
        """Ask again only after `first` seconds, doubled at each refusal in a row, at most `ceiling`."""
        times = self._refusals.get(key, (0, 0.0))[0] + 1
        self._refusals[key] = (times, now + doubling(times - 1, first=self.first, ceiling=self.ceiling))

    def waiting(self, key: str, *, now: float) -> bool:
        """Whether `key` was refused and its wait has not run out."""
        return self._refusals.get(key, (0, now))[1] > now

    def forget(self, key: str) -> None:
        """It went through, or no longer needs asking: the next refusal starts from `first` again."""
        self._refusals.pop(key, None)
