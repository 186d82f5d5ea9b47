"""OpenAI-shaped errors: one exception type the handlers raise, one renderer.

Every error the gateway returns, on any route, has the body
`{"error": {"message", "type", "param", "code"}}` that OpenAI clients parse.
"""

from __future__ import annotations

from http import HTTPStatus

from fastapi.responses import JSONResponse

from gateway.dataplane_client import DataplaneError, DataplaneErrorKind
from gateway.protocol import ErrorBody, ErrorResponse

# OpenAI's error "type" values, by the HTTP status they go with.
INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVICE_UNAVAILABLE = "service_unavailable_error"
TIMEOUT = "timeout_error"
INTERNAL = "internal_error"


class APIError(Exception):
    """An error answered to the client as an OpenAI error body.

    `headers` travel with the response (e.g. Retry-After on 429).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str = INVALID_REQUEST,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorBody(message=self.message, type=self.type, param=self.param, code=self.code)
        )

    def response(self) -> JSONResponse:
        return JSONResponse(self.body().model_dump(), status_code=self.status, headers=self.headers)


def invalid_request(message: str, *, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(HTTPStatus.BAD_REQUEST, message, INVALID_REQUEST, param=param, code=code)


def context_length_exceeded(message: str, *, param: str | None = "messages") -> APIError:
    return APIError(
        HTTPStatus.BAD_REQUEST, message, INVALID_REQUEST, param=param, code="context_length_exceeded"
    )


def model_not_found(model: str) -> APIError:
    return APIError(
        HTTPStatus.NOT_FOUND,
        f"The model `{model}` does not exist.",
        INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


def unauthorized(message: str) -> APIError:
    return APIError(
        HTTPStatus.UNAUTHORIZED,
        message,
        AUTHENTICATION,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def too_many_requests(message: str, retry_after_s: int) -> APIError:
    return APIError(
        HTTPStatus.TOO_MANY_REQUESTS,
        message,
        RATE_LIMIT,
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after_s)},
    )


def unavailable(message: str) -> APIError:
    return APIError(HTTPStatus.SERVICE_UNAVAILABLE, message, SERVICE_UNAVAILABLE, code="dataplane_unavailable")


def timeout(message: str) -> APIError:
    return APIError(HTTPStatus.GATEWAY_TIMEOUT, message, TIMEOUT, code="timeout")


def internal(message: str) -> APIError:
    return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, message, INTERNAL)


def dataplane_api_error(error: DataplaneError) -> APIError:
    """The HTTP error a client sees for a dataplane failure."""
    if error.kind is DataplaneErrorKind.UNAVAILABLE:
        return unavailable(error.message)
    if error.kind is DataplaneErrorKind.INVALID_ARGUMENT:
        return invalid_request(f"the dataplane rejected the request: {error.message}")
    if error.kind is DataplaneErrorKind.OVERLOADED:
        return APIError(
            HTTPStatus.SERVICE_UNAVAILABLE,
            f"the engine is overloaded: {error.message}",
            SERVICE_UNAVAILABLE,
            code="engine_overloaded",
        )
    if error.kind is DataplaneErrorKind.TIMEOUT:
        return timeout(f"the request did not finish in time: {error.message}")
    return internal(f"dataplane error: {error.message}")
