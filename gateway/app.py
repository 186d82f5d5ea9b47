"""The gateway's HTTP app: routes, error rendering, admission, auth, metrics.

`create_app(settings, client)` builds an independent app (own registry, own
admission controller); nothing is shared between apps. The app closes
`client` when it shuts down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from http import HTTPStatus

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from gateway.admission import AdmissionController, AdmissionRejected
from gateway.auth import ApiKeyAuth
from gateway.config import GatewaySettings
from gateway.dataplane_client import DataplaneClient, DataplaneError
from gateway.errors import APIError, dataplane_api_error, internal, invalid_request, too_many_requests
from gateway.fanout import ClientDisconnected, wait_for_disconnect
from gateway.metrics import GatewayMetrics, HttpStatusCounter
from gateway.resume import ResumePolicy
from gateway.generation import GenerationService, PreparedGeneration
from gateway.protocol import CompletionRequest, DetokenizeRequest, ModelCard, ModelList, TokenizeRequest
from gateway.protocol_chat import ChatCompletionRequest
from gateway.serving_chat import ChatService
from gateway.serving_completion import CompletionService
from gateway.serving_tokenize import TokenizeService

logger = logging.getLogger(__name__)

# Not an HTTP standard code: nginx's "client closed request", used only for
# accounting (nobody receives the answer).
CLIENT_CLOSED_REQUEST = 499


class SlotStreamingResponse(StreamingResponse):
    """A streaming response that owns an admission slot: the slot is released
    and the body closed (cancelling generation) however the response ends,
    even when the body was never iterated."""

    def __init__(self, content: AsyncIterator[str], release: Callable[[], None], **kwargs: object) -> None:
        super().__init__(content, **kwargs)  # type: ignore[arg-type]
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            finally:
                self._release()


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first problems of a FastAPI validation error, OpenAI-shaped."""
    parts = []
    param = None
    for error in exc.errors():
        location = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        if error.get("type") == "json_invalid":
            parts.append(f"Invalid JSON body: {error.get('ctx', {}).get('error', error['msg'])}")
            continue
        param = param or location or None
        parts.append(f"{location}: {error['msg']}" if location else str(error["msg"]))
    return invalid_request("; ".join(parts) or "invalid request", param=param)


def create_app(settings: GatewaySettings, client: DataplaneClient) -> FastAPI:
    admission = AdmissionController(settings.max_concurrent_requests, settings.max_queued_requests)
    metrics = GatewayMetrics(admission)
    auth = ApiKeyAuth(settings.api_keys)
    resume = ResumePolicy(outages=settings.dataplane_outages, wait_s=settings.dataplane_wait_s)
    generation = GenerationService(client, metrics, settings.request_timeout_s, settings.model_name, resume)
    chat = ChatService(generation)
    completions = CompletionService(generation)
    tokenization = TokenizeService(generation)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.close()

    app = FastAPI(title="PagedWeight gateway", lifespan=lifespan)
    app.add_middleware(HttpStatusCounter, metrics=metrics)

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        error = APIError(exc.status_code, str(exc.detail), "invalid_request_error", headers=exc.headers)
        return error.response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error", exc_info=exc)
        return internal(f"internal error: {type(exc).__name__}").response()

    async def require_key(request: Request) -> None:
        auth.check(request.headers.get("authorization"))

    async def admit(prepared: PreparedGeneration) -> int:
        """Takes the request's admission slots (one per choice) or raises 429
        (queue full, or no slots before the request's deadline); returns them."""
        try:
            return await asyncio.wait_for(
                admission.acquire(len(prepared.sequences)), timeout=max(prepared.deadline_s - time.monotonic(), 0.0)
            )
        except AdmissionRejected as exc:
            raise too_many_requests(f"Too many requests: {exc}", settings.retry_after_s) from exc
        except TimeoutError as exc:
            raise too_many_requests(
                "Too many requests: no slot became free before the request timeout", settings.retry_after_s
            ) from exc

    async def respond(
        request: Request,
        prepared: PreparedGeneration,
        stream: bool,
        events: Callable[[Callable[[], Awaitable[None]]], AsyncIterator[str]],
        answer: Callable[[Callable[[], Awaitable[None]]], Awaitable[BaseModel]],
    ) -> Response:
        """Admits a prepared request and answers it as SSE or one JSON body;
        `events` / `answer` take the wait-for-disconnect callable."""
        slots = await admit(prepared)
        disconnected = partial(wait_for_disconnect, request.receive)
        if stream:
            return SlotStreamingResponse(
                events(disconnected),
                release=partial(admission.release, slots),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            body = await answer(disconnected)
        except ClientDisconnected:
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        finally:
            admission.release(slots)
        return JSONResponse(body.model_dump())

    @app.post("/v1/chat/completions", dependencies=[Depends(require_key)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        prepared = await chat.prepare(body)
        return await respond(
            request,
            prepared.generation,
            body.stream,
            lambda disconnected: chat.stream(prepared, disconnected),
            lambda disconnected: chat.complete(prepared, disconnected),
        )

    @app.post("/v1/completions", dependencies=[Depends(require_key)])
    async def text_completions(body: CompletionRequest, request: Request) -> Response:
        prepared = await completions.prepare(body)
        return await respond(
            request,
            prepared.generation,
            body.stream,
            lambda disconnected: completions.stream(prepared, disconnected),
            lambda disconnected: completions.complete(prepared, disconnected),
        )

    @app.post("/tokenize", dependencies=[Depends(require_key)])
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        return JSONResponse((await tokenization.tokenize(body)).model_dump())

    @app.post("/detokenize", dependencies=[Depends(require_key)])
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        return JSONResponse((await tokenization.detokenize(body)).model_dump())

    @app.get("/v1/models", dependencies=[Depends(require_key)])
    async def list_models() -> JSONResponse:
        model = await generation.served_model()
        card = ModelCard(id=model.name, created=created, max_model_len=model.context_length)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    async def health() -> JSONResponse:
        """200 when the dataplane answers an engine snapshot, else 503."""
        try:
            await client.engine_stats()
        except DataplaneError as error:
            raise dataplane_api_error(error) from error
        return JSONResponse({"status": "ok"}, status_code=HTTPStatus.OK)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        try:
            stats = await client.engine_stats()
        except DataplaneError:
            stats = None  # exported as pagedweight_engine_up 0
        return Response(metrics.render(stats), media_type=CONTENT_TYPE_LATEST)

    return app
