"""The Inference service in process: protobuf in, protobuf out, over an Engine.

The gRPC servicer (dataplane/server.py) is a thin shell around it; tests and
in-process callers (e.g. a gateway test double) can use it directly. All
methods run on an asyncio event loop; engine outputs cross from the engine
thread into the loop through a per-request asyncio.Queue.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

from pagedweight.v1 import inference_pb2

from dataplane.engine import Engine
from dataplane.engine_io import RequestOutput
from dataplane.proto_convert import model_info_to_proto, output_to_proto, sampling_from_proto, stats_to_proto


class InferenceService:
    """Generate / GetModelInfo / GetEngineStats semantics of inference.proto.

    ``generate`` raises ``InvalidRequest`` or ``QueueFull`` (from
    dataplane.engine) before the first response; closing or cancelling the
    iterator early aborts the request and frees its KV blocks.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def generate(self, request: inference_pb2.GenerateRequest) -> AsyncIterator[inference_pb2.GenerateResponse]:
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[RequestOutput] = asyncio.Queue()

        def sink(out: RequestOutput) -> None:
            # Engine thread: hand over to the loop; a closed loop means the
            # caller is gone, and the engine must not die of it.
            try:
                loop.call_soon_threadsafe(outputs.put_nowait, out)
            except RuntimeError:
                pass

        request_id = request.request_id or uuid.uuid4().hex
        add = (request_id, list(request.prompt_token_ids), sampling_from_proto(request.sampling), sink)
        if request.sampling.HasField("structured_output"):
            # Compiling a grammar (the first one also reads the tokenizer's
            # whole vocabulary) may take long: not on the loop the other
            # requests' streams run on.
            await asyncio.to_thread(self.engine.add_request, *add)
        else:
            self.engine.add_request(*add)
        finished = False
        try:
            while not finished:
                out = await outputs.get()
                finished = out.finish_reason is not None
                yield output_to_proto(out)
        finally:
            if not finished:
                self.engine.abort(request_id)

    def model_info(self) -> inference_pb2.ModelInfo:
        return model_info_to_proto(self.engine.model_info)

    def engine_stats(self) -> inference_pb2.EngineStats:
        return stats_to_proto(self.engine.stats())
