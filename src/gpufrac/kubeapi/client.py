"""Building an async lightkube client, with the one-line errors a person can act on.

A missing or broken kubeconfig, and a missing in-cluster service account, become `UserError`s that name
the file and the fix; this is the only place that knows how gpufrac finds its credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import httpx2
import lightkube
import yaml
from lightkube.core.exceptions import ConfigError

from gpufrac.errors import UserError

R = TypeVar("R")

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def load_config(kubeconfig: Path | None) -> lightkube.KubeConfig:
    """The kubeconfig file if one is given, otherwise the pod's in-cluster service account."""
    try:
        if kubeconfig is not None:
            if not kubeconfig.is_file():
                raise UserError(f"--kubeconfig {kubeconfig}: no such file; pass a readable kubeconfig")
            return lightkube.KubeConfig.from_file(kubeconfig)
        if not SERVICE_ACCOUNT_DIR.is_dir():
            raise UserError(
                "no --kubeconfig given and not running in a pod (no service account token under "
                f"{SERVICE_ACCOUNT_DIR}); pass --kubeconfig PATH"
            )
        return lightkube.KubeConfig.from_service_account(SERVICE_ACCOUNT_DIR)
    except (ConfigError, OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as error:
        source = kubeconfig or SERVICE_ACCOUNT_DIR
        raise UserError(f"{source}: not a usable kubeconfig ({error}); fix or replace it") from None


def async_client(config: lightkube.KubeConfig, *, field_manager: str = "gpufrac") -> lightkube.AsyncClient:
    return lightkube.AsyncClient(config=config, field_manager=field_manager)


def unreachable(error: Exception, config: lightkube.KubeConfig) -> UserError:
    """The message for an API server that cannot be reached at all."""
    single = config.get()
    server = f" at {single.cluster.server}" if single is not None else ""
    return UserError(
        f"cannot reach the Kubernetes API server{server} ({error}); check the kubeconfig and network"
    )


# What a dropped or refused connection raises through lightkube's transport.
TRANSPORT_ERRORS = (httpx2.TransportError,)
# Everything a request can fail with: the API server's answer, or no answer at all.
API_ERRORS = (lightkube.ApiError, *TRANSPORT_ERRORS)


def build(resource: type[R], body: Mapping[str, Any]) -> R:
    """A typed lightkube object from plain API data: requests are written as data, as the API documents
    them, and converted once here."""
    return cast(R, resource.from_dict(dict(body)))  # type: ignore[attr-defined]


async def delete_exactly(
    client: lightkube.AsyncClient, resource: type[Any], name: str, *, namespace: str, uid: str
) -> None:
    """Delete the object named `name` only if it is still the one with `uid`: the API server answers 409
    Conflict when the name now belongs to another object, which is then left alone.

    lightkube's `delete` sends no body, and the API server reads `DeleteOptions.preconditions` only from one
    (not from query parameters), so the request is built through lightkube's generic client.
    """
    generic = client._client
    request = generic.prepare_request("delete", resource, name=name, namespace=namespace)
    request.data = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
    response = await generic.send(generic.build_adapter_request(request))
    generic.handle_response("delete", response, request)
