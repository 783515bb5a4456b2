"""The one error the contract raises for bad input."""

from __future__ import annotations

import json

# The most characters of a tenant's text a message quotes: a value may be hundreds of KiB, and every
# denial is shown to the tenant, logged and kept in Events.
QUOTE_LIMIT = 80


def brief(text: str, limit: int = QUOTE_LIMIT) -> str:
    """`text` as a message quotes it: at most `limit` characters, cut ones ending in "..."."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ContractError(ValueError):
    """An annotation (or GPU resource) that breaks a rule of the contract.

    It names the key, the value as written and the rule, because a tenant reading a rejected admission or a
    `gpufrac validate` line has only that message to fix the manifest with. `str()` reads well on its own:
    `nvidia.com/container.app.gpu-memory.request="9Gi": request exceeds limit "8Gi"`. The key and the
    value are quoted `brief`ly; the attributes keep them whole.
    """

    def __init__(self, key: str, value: str, rule: str) -> None:
        super().__init__(key, value, rule)
        self.key = key
        self.value = value
        self.rule = rule

    def __str__(self) -> str:
        return f"{brief(self.key)}={json.dumps(brief(self.value), ensure_ascii=False)}: {self.rule}"
