"""The one error the contract raises for bad input."""

from __future__ import annotations

import json


class ContractError(ValueError):
    """An annotation (or GPU resource) that breaks a rule of the contract.

    It names the key, the value as written and the rule, because a tenant reading a rejected admission or a
    `gpufrac validate` line has only that message to fix the manifest with. `str()` reads well on its own:
    `nvidia.com/container.app.gpu-memory.request="9Gi": request exceeds limit "8Gi"`.
    """

    def __init__(self, key: str, value: str, rule: str) -> None:
        super().__init__(key, value, rule)
        self.key = key
        self.value = value
        self.rule = rule

    def __str__(self) -> str:
        return f"{self.key}={json.dumps(self.value, ensure_ascii=False)}: {self.rule}"
