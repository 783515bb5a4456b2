"""A real gRPC server on a unix socket, answering with the handlers a test gives: the kubelet's side of
the PodResources and device plugin tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from gpufrac.node.kubelet import protos


@contextmanager
def serving(socket: Path, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> Iterator[None]:
    """``handlers`` (method name -> handler) of ``service`` served on ``socket`` while in the block; a
    method not in them answers UNIMPLEMENTED, as a server without it does."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, handlers)])
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        yield
    finally:
        server.stop(grace=None)


def unary(request: Any, answer: Callable[[Any, grpc.ServicerContext], Any]) -> grpc.RpcMethodHandler:
    """A unary handler reading ``request`` messages and answering what ``answer`` returns: a message, or
    bytes sent as they are."""

    def serialize(message: Any) -> bytes:
        return message if isinstance(message, bytes) else protos.serialize(message)

    return grpc.unary_unary_rpc_method_handler(
        answer, request_deserializer=request.FromString, response_serializer=serialize
    )
