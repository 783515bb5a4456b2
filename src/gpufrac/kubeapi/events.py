"""Warning Events, as `kubectl describe` shows them: one builder and one writer for every gpufrac program.

An Event is a side note: failing to record one is logged, never raised, so a full or refusing API server
cannot stop a decision or an action that already happened.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime

import lightkube
from lightkube.resources.core_v1 import Event

from gpufrac.kubeapi.client import READ_ERRORS, build

log = logging.getLogger("gpufrac.events")

# Event messages are bounded, as the kubelet bounds them: a message that quotes a tenant's value must not
# grow without limit.
MAX_MESSAGE = 1024


def warning(
    *,
    involved: Mapping[str, str | None],
    reason: str,
    message: str,
    component: str,
    host: str | None = None,
    name: str | None = None,
) -> Event:
    """A Warning about `involved` (kind, name, and namespace and uid for namespaced objects).

    `name` fixes the Event's name, so that one action is recorded once however often it is attempted;
    without it the API server generates one. Events about a Node go to the default namespace, as the
    kubelet's do.
    """
    namespace = involved.get("namespace") or "default"
    metadata = {"namespace": namespace} | (
        {"name": name} if name else {"generateName": f"{involved['name']}."}
    )
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = {"component": component} | ({"host": host} if host else {})
    return build(
        Event,
        {
            "metadata": metadata,
            "involvedObject": {"apiVersion": "v1", **{k: v for k, v in involved.items() if v is not None}},
            "reason": reason,
            "message": message[:MAX_MESSAGE],
            "type": "Warning",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": source,
            "reportingComponent": component,
            "reportingInstance": host or component,
        },
    )


async def record(client: lightkube.AsyncClient, event: Event) -> None:
    """Create `event`; one that exists already (409, a fixed name) was recorded before."""
    try:
        await client.create(event)
    except lightkube.ApiError as error:
        if error.status.code != 409:
            log.error("cannot record Event %s: %s", _describe(event), error)
    except READ_ERRORS as error:  # no answer, or one that cannot be read: the Event may or may not exist
        log.error("cannot record Event %s: %s", _describe(event), error)


def _describe(event: Event) -> str:
    meta = event.metadata
    return f"{meta.namespace}/{meta.name or meta.generateName}" if meta else "(unnamed)"
