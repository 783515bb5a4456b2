"""The Queue custom resource (`queues.gpufrac.io`) for the programs that watch it: the scheduler, which
shares the cluster by it, and the webhook, which checks each new queue against the others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import lightkube
from lightkube.generic_resource import create_global_resource

from gpufrac import contract
from gpufrac.contract import queues
from gpufrac.contract.queues import QueueSpec
from gpufrac.kubeapi.reflector import reflect

log = logging.getLogger("gpufrac.queues")
QUEUE_RESOURCE = create_global_resource(queues.GROUP, queues.VERSION, queues.KIND, queues.PLURAL)


def _log_bad(item: Mapping[str, Any], error: contract.ContractError) -> None:
    log.warning("Queue %s ignored: %s", item.get("metadata", {}).get("name"), error)


class QueueIndex:
    """The readable Queue objects by name, as a watch last saw them; `on_bad` hears of the others."""

    def __init__(
        self, on_bad: Callable[[Mapping[str, Any], contract.ContractError], None] = _log_bad
    ) -> None:
        self.on_bad = on_bad
        self.specs: dict[str, QueueSpec] = {}

    def listed(self, items: list[dict[str, Any]]) -> None:
        self.specs = {}
        for item in items:
            self.changed("ADDED", item)

    def changed(self, event: str, item: Mapping[str, Any]) -> None:
        metadata = item.get("metadata")
        name = str(metadata.get("name")) if isinstance(metadata, Mapping) else ""
        if event == "DELETED":
            self.specs.pop(name, None)
            return
        try:
            spec = queues.parse_queue(item)
        except contract.ContractError as error:
            self.specs.pop(name, None)
            self.on_bad(item, error)
            return
        self.specs[spec.name] = spec

    async def watch(self, client: lightkube.AsyncClient) -> None:
        """Keep the index until cancelled."""
        await reflect(client, QUEUE_RESOURCE, on_list=self.listed, on_event=self.changed, namespaced=False)
