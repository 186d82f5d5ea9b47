"""Bearer-token authentication of the controlplane's services (a server interceptor).

Every method under ``/pagedweight.v1.Admin/`` needs the metadata header
``authorization: Bearer <token>`` with one of the admin tokens. When
telemetry tokens are configured, ``/pagedweight.v1.Telemetry/Connect`` needs
one of those the same way (a dataplane holds a telemetry token, never an
operator's admin token); without telemetry tokens the dataplane link is open
(the controlplane logs a warning at start). A missing or wrong token fails
the call with UNAUTHENTICATED before the handler runs. grpc.health.v1 is
always open (the launcher and orchestrators probe it).
"""

from __future__ import annotations

import hmac
from typing import Callable

import grpc

ADMIN_METHOD_PREFIX = "/pagedweight.v1.Admin/"
TELEMETRY_METHOD_PREFIX = "/pagedweight.v1.Telemetry/"
AUTH_HEADER = "authorization"
BEARER = "Bearer "


def _reject(message: str, streaming: bool) -> grpc.RpcMethodHandler:
    def unary(request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    def stream(request_iterator, context: grpc.ServicerContext):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # never reached: makes this a generator, as a stream-stream handler must be

    # Admin methods are unary-unary, Telemetry.Connect stream-stream; the
    # requests stay undecoded bytes.
    return grpc.stream_stream_rpc_method_handler(stream) if streaming else grpc.unary_unary_rpc_method_handler(unary)


def _encoded(tokens: tuple[str, ...], what: str) -> tuple[bytes, ...]:
    if any(not t for t in tokens):
        raise ValueError(f"{what} tokens must not be empty")
    return tuple(t.encode() for t in tokens)


class BearerAuthInterceptor(grpc.ServerInterceptor):
    """Rejects Admin calls without a valid admin token, and Telemetry calls
    without a valid telemetry token when any is configured."""

    def __init__(self, admin_tokens: tuple[str, ...], telemetry_tokens: tuple[str, ...] = ()) -> None:
        if not admin_tokens:
            raise ValueError("at least one non-empty admin token is required")
        self._rules = [(ADMIN_METHOD_PREFIX, _encoded(admin_tokens, "admin"), False)]
        if telemetry_tokens:
            self._rules.append((TELEMETRY_METHOD_PREFIX, _encoded(telemetry_tokens, "telemetry"), True))

    @staticmethod
    def _valid(header: str, tokens: tuple[bytes, ...]) -> bool:
        if not header.startswith(BEARER):
            return False
        given = header[len(BEARER):].strip().encode()
        # compare_digest against every token: no early exit that leaks which.
        return any([hmac.compare_digest(given, t) for t in tokens])

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        for prefix, tokens, streaming in self._rules:
            if not method.startswith(prefix):
                continue
            header = dict(handler_call_details.invocation_metadata or ()).get(AUTH_HEADER)
            if header is None:
                return _reject("missing 'authorization: Bearer <token>' metadata", streaming)
            if not self._valid(header, tokens):
                return _reject(f"invalid {'telemetry' if streaming else 'admin'} token", streaming)
        return continuation(handler_call_details)
