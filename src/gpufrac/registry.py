"""Plugins by name: the engine's placement policies and the planner's sharing strategies.

Each entry carries its own name, so a name is written once, where its plugin is defined. Entries keep the
order they were registered in, which is the order every listing shows them (`--policies all`, a plan's
strategies); each plugin package imports its modules in that order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, TypeVar


class Named(Protocol):
    @property
    def name(self) -> str: ...


Entry = TypeVar("Entry", bound=Named)


class Registry(Mapping[str, Entry]):
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}

    def register(self, entry: Entry) -> Entry:
        """Add `entry` under its name and return it, so that it also serves as a class decorator."""
        if entry.name in self._entries:
            raise ValueError(f"two plugins are named {entry.name!r}")
        self._entries[entry.name] = entry
        return entry

    def __getitem__(self, name: str) -> Entry:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
