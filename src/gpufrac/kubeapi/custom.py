"""gpufrac's custom resources for the programs that watch them: Queues (the scheduler shares the cluster
by them, the webhook checks each new one against the others) and PodGroups (the scheduler's gangs)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import lightkube
from lightkube.generic_resource import create_global_resource, create_namespaced_resource

from gpufrac import contract
from gpufrac.contract import podgroups, queues
from gpufrac.contract.podgroups import PodGroupSpec
from gpufrac.contract.queues import QueueSpec
from gpufrac.kubeapi.reflector import reflect

log = logging.getLogger("gpufrac.custom")
QUEUE_RESOURCE = create_global_resource(queues.GROUP, queues.VERSION, queues.KIND, queues.PLURAL)
POD_GROUP_RESOURCE = create_namespaced_resource(
    podgroups.GROUP, podgroups.VERSION, podgroups.KIND, podgroups.PLURAL
)
Spec = TypeVar("Spec")


def _log_bad(item: Mapping[str, Any], error: contract.ContractError) -> None:
    log.warning("%s %s ignored: %s", item.get("kind"), _key(item), error)


def _key(item: Mapping[str, Any]) -> str:
    """`namespace/name`, or `name` for a cluster-scoped object."""
    metadata = item.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    namespace, name = metadata.get("namespace"), metadata.get("name")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else str(name)


class Index(Generic[Spec]):
    """The readable objects of one custom resource by key (`name`, or `namespace/name`), as a watch last saw
    them; `on_bad` hears of the others."""

    def __init__(
        self,
        resource: type[Any],
        parse: Callable[[Mapping[str, Any]], Spec],
        *,
        namespaced: bool,
        on_bad: Callable[[Mapping[str, Any], contract.ContractError], None] = _log_bad,
    ) -> None:
        self.resource, self.parse, self.namespaced, self.on_bad = resource, parse, namespaced, on_bad
        self.specs: dict[str, Spec] = {}

    def listed(self, items: list[dict[str, Any]]) -> None:
        self.specs = {}
        for item in items:
            self.changed("ADDED", item)

    def changed(self, event: str, item: Mapping[str, Any]) -> None:
        key = _key(item)
        if event == "DELETED":
            self.specs.pop(key, None)
            return
        try:
            self.specs[key] = self.parse(item)
        except contract.ContractError as error:
            self.specs.pop(key, None)
            self.on_bad(item, error)

    async def watch(self, client: lightkube.AsyncClient) -> None:
        """Keep the index until cancelled."""
        await reflect(
            client, self.resource, on_list=self.listed, on_event=self.changed, namespaced=self.namespaced
        )


def queue_index(**settings: Any) -> Index[QueueSpec]:
    return Index(QUEUE_RESOURCE, queues.parse_queue, namespaced=False, **settings)


def pod_group_index(**settings: Any) -> Index[PodGroupSpec]:
    return Index(POD_GROUP_RESOURCE, podgroups.parse_pod_group, namespaced=True, **settings)
