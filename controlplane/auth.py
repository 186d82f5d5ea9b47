"""Bearer-token authentication of the Admin service (a server interceptor).

Every method under ``/pagedweight.v1.Admin/`` needs the metadata header
``authorization: Bearer <token>`` with one of the configured tokens;
otherwise the call fails with UNAUTHENTICATED before the handler runs. Other
services (Telemetry, health) pass through: the dataplane link is not
token-protected in v1.
"""

from __future__ import annotations

import hmac
from typing import Callable

import grpc

ADMIN_METHOD_PREFIX = "/pagedweight.v1.Admin/"
AUTH_HEADER = "authorization"
BEARER = "Bearer "


def _reject(message: str) -> grpc.RpcMethodHandler:
    def handler(request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # Every Admin method is unary-unary; the request stays undecoded bytes.
    return grpc.unary_unary_rpc_method_handler(handler)


class AdminAuthInterceptor(grpc.ServerInterceptor):
    """Rejects Admin calls without a valid bearer token."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        if not tokens or any(not t for t in tokens):
            raise ValueError("at least one non-empty admin token is required")
        self._tokens = tuple(t.encode() for t in tokens)

    def _valid(self, header: str | None) -> bool:
        if header is None or not header.startswith(BEARER):
            return False
        given = header[len(BEARER):].strip().encode()
        # compare_digest against every token: no early exit that leaks which.
        return any([hmac.compare_digest(given, t) for t in self._tokens])

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if not handler_call_details.method.startswith(ADMIN_METHOD_PREFIX):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        header = metadata.get(AUTH_HEADER)
        if header is None:
            return _reject("missing 'authorization: Bearer <token>' metadata")
        if not self._valid(header):
            return _reject("invalid admin token")
        return continuation(handler_call_details)
