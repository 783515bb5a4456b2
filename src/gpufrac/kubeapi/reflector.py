"""List, then watch from the list's resourceVersion; relist on 410 Gone; reconnect with backoff.

The scheduler's view of nodes and pods is only as good as this loop, so it never gives up: an API error,
a dropped connection or an answer that cannot be read is logged and retried. A handler that fails is never
raised into the scheduler; since the event it failed on cannot be skipped without losing what it said, the
loop lists again (after a backoff), and the list handler rebuilds its view from the full set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

import lightkube
from lightkube import ApiError

from gpufrac import retrying
from gpufrac.kubeapi.client import TRANSPORT_ERRORS, UNREADABLE_ANSWERS

log = logging.getLogger("gpufrac.reflector")

# The longest one watch request is trusted, after which it is cut and made again from the last version seen
# (client-go's reflector asks for 5 to 10 minutes). lightkube waits on a watch with no read timeout and
# turns no TCP keepalive on, so a connection that died without a word (a load balancer that forgot it, an
# API server host gone) would otherwise be read for ever, and the cache would go stale without a warning.
WATCH_SECONDS = 300.0

Handler = Callable[[str, dict[str, Any]], None]


async def reflect(
    client: lightkube.AsyncClient,
    resource: type[Any],
    *,
    on_list: Callable[[list[dict[str, Any]]], None],
    on_event: Handler,
    namespaced: bool,
    max_backoff: float = 30.0,
    watch_seconds: float = WATCH_SECONDS,
) -> None:
    """Run until cancelled. `on_list` gets the full set after every (re)list; `on_event` each change."""
    namespace = lightkube.ALL_NS if namespaced else None
    kind = resource.__name__
    version: str | None = None
    failures = 0
    listed_only = False
    while True:
        try:
            if version is None:
                listing = client.list(resource, namespace=namespace)
                objects = [item.to_dict() async for item in listing]
                if not _deliver_list(on_list, kind, objects):
                    failures += 1
                    await asyncio.sleep(retrying.doubling(failures, first=0.2, ceiling=max_backoff))
                    continue  # list again: the handler rebuilds everything from a full list
                version = listing.resourceVersion
                listed_only = True  # no event since this list: a 410 now would come straight back
            # An async generator (lightkube's is): closed at once when a failed event breaks out of it.
            stream = cast(
                AsyncGenerator[tuple[str, Any]],
                client.watch(resource, namespace=namespace, resource_version=version),
            )
            async with asyncio.timeout(watch_seconds), contextlib.aclosing(stream):
                async for event, item in stream:
                    body = item.to_dict()
                    version = body.get("metadata", {}).get("resourceVersion", version)
                    failures, listed_only = 0, False
                    if not _deliver(on_event, kind, event, body):
                        # Skipping the event would lose what it said for good (a DELETED event, the memory
                        # of a pod gone); a full list states everything again, and the handler rebuilds.
                        version = None
                        failures += 1
                        break
        except TimeoutError:
            log.debug("%s watch: cut after %gs; watching again from %s", kind, watch_seconds, version)
            continue
        except ApiError as error:
            if error.status.code == 410:
                log.info("%s watch expired (410 Gone); relisting", kind)
                version = None
                if not listed_only:
                    continue
                # Expired at once from a fresh list (a server whose watch cache lags its lists): relisting
                # at once again would pull every object in a loop, so it backs off as other errors do.
            failures += 1
            log.warning("%s watch: API error %s %s", kind, error.status.code, error.status.message)
        except TRANSPORT_ERRORS as error:
            failures += 1
            log.warning("%s watch: connection lost (%s); reconnecting", kind, error)
        except UNREADABLE_ANSWERS as error:
            # What the unreadable part said is lost, and where the stream stood with it: a list says all.
            failures += 1
            version = None
            log.warning(
                "%s watch: an answer that is not Kubernetes API data (%s); listing again", kind, error
            )
        await asyncio.sleep(retrying.doubling(failures, first=0.2, ceiling=max_backoff))


def _deliver(on_event: Handler, kind: str, event: str, body: dict[str, Any]) -> bool:
    """False when the handler failed. Handlers report and skip the objects they cannot read, so this is a
    bug; it must still not stop the watch that every other object arrives on."""
    try:
        on_event(event, body)
    except Exception:
        name = body.get("metadata", {}).get("name")
        log.exception("%s %s %s: handling the event failed; relisting", kind, event, name)
        return False
    return True


def _deliver_list(
    on_list: Callable[[list[dict[str, Any]]], None], kind: str, objects: list[dict[str, Any]]
) -> bool:
    try:
        on_list(objects)
    except Exception:
        log.exception("%s list: handling it failed; listing again", kind)
        return False
    return True
