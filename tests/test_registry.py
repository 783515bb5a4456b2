"""The plugin registry that the placement policies and the planner's strategies share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpufrac.registry import Registry


@dataclass(frozen=True)
class Plugin:
    name: str


def test_entries_are_found_by_their_own_name_in_registration_order() -> None:
    registry: Registry[Plugin] = Registry()
    second, first = registry.register(Plugin("second")), registry.register(Plugin("first"))
    assert list(registry) == ["second", "first"]
    assert registry["first"] is first and registry["second"] is second
    assert "third" not in registry


def test_a_name_registered_twice_is_refused() -> None:
    registry: Registry[Plugin] = Registry()
    registry.register(Plugin("one"))
    with pytest.raises(ValueError, match="'one'"):
        registry.register(Plugin("one"))
    assert len(registry) == 1
