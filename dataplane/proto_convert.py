"""Conversions between the engine's Python types and the protobuf contracts."""

from __future__ import annotations

from pagedweight.v1 import inference_pb2

from dataplane.engine_io import EngineStats, RequestOutput
from dataplane.logprobs import TokenLogprobs
from dataplane.model_info import ModelInfo
from dataplane.sampling_params import SamplingParams, StructuredOutput
from dataplane.sequence import FinishReason

_FINISH = {
    None: inference_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: inference_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: inference_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: inference_pb2.FINISH_REASON_ABORT,
}


def sampling_from_proto(pb: inference_pb2.SamplingParams) -> SamplingParams:
    """Maps the wire message; top_p 0 means disabled (1). Not validated here."""
    return SamplingParams(
        temperature=pb.temperature,
        top_p=pb.top_p if pb.top_p != 0 else 1.0,
        top_k=pb.top_k,
        seed=pb.seed if pb.HasField("seed") else None,
        max_tokens=pb.max_tokens,
        stop_token_ids=tuple(pb.stop_token_ids),
        ignore_eos=pb.ignore_eos,
        logprobs=pb.logprobs if pb.HasField("logprobs") else None,
        prompt_logprobs=pb.prompt_logprobs if pb.HasField("prompt_logprobs") else None,
        presence_penalty=pb.presence_penalty,
        frequency_penalty=pb.frequency_penalty,
        logit_bias=tuple(sorted(pb.logit_bias.items())),
        structured_output=_structured_from_proto(pb.structured_output) if pb.HasField("structured_output") else None,
    )


def _structured_from_proto(pb: inference_pb2.StructuredOutput) -> StructuredOutput:
    kind = pb.WhichOneof("kind")
    if kind == "json_schema":
        return StructuredOutput("json_schema", pb.json_schema)
    # json_object, or a message with neither set (read as the least constraint).
    return StructuredOutput("json_object")


def output_to_proto(out: RequestOutput) -> inference_pb2.GenerateResponse:
    return inference_pb2.GenerateResponse(
        request_id=out.request_id,
        token_ids=out.new_token_ids,
        finish_reason=_FINISH[out.finish_reason],
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        logprobs=[_logprobs_to_proto(entry) for entry in out.new_logprobs],
        prompt_logprobs=[_logprobs_to_proto(entry) for entry in out.prompt_logprobs],
        cached_prompt_tokens=out.cached_prompt_tokens,
    )


def _logprobs_to_proto(entry: TokenLogprobs) -> inference_pb2.TokenLogprobs:
    return inference_pb2.TokenLogprobs(
        logprob=entry.logprob, top_token_ids=entry.top_token_ids, top_logprobs=entry.top_logprobs
    )


def stats_to_proto(stats: EngineStats) -> inference_pb2.EngineStats:
    arena = stats.arena
    arena_pb = inference_pb2.ArenaStats(fixed_resident_bytes=stats.fixed_resident_bytes)
    if arena is not None:
        arena_pb.page_bytes = arena.page_bytes
        arena_pb.total_pages = arena.total_pages
        arena_pb.free_pages = arena.free_pages
        arena_pb.kv_pages = arena.kv_pages
        arena_pb.cached_pages = arena.cached_pages
        arena_pb.weight_pages_by_bits.update(arena.weight_pages_by_bits)
    return inference_pb2.EngineStats(
        running_requests=stats.running_requests,
        waiting_requests=stats.waiting_requests,
        kv_blocks_used=stats.kv_blocks_used,
        kv_blocks_free=stats.kv_blocks_free,
        kv_block_size=stats.kv_block_size,
        generated_tokens_total=stats.generated_tokens_total,
        prompt_tokens_total=stats.prompt_tokens_total,
        preemptions_total=stats.preemptions_total,
        finished_requests_total=stats.finished_requests_total,
        aborted_requests_total=stats.aborted_requests_total,
        arena=arena_pb,
        steps_total=stats.steps_total,
        prefix_cached_tokens_total=stats.prefix_cached_tokens_total,
        kernel_compiles_total=stats.kernel_compiles_total,
    )


def model_info_to_proto(info: ModelInfo) -> inference_pb2.ModelInfo:
    return inference_pb2.ModelInfo(
        model_name=info.name,
        context_length=info.context_length,
        tokenizer_json=info.tokenizer_json,
        chat_template=info.chat_template,
        eos_token_ids=list(info.eos_token_ids),
        bos_token=info.bos_token,
        eos_token=info.eos_token,
        family=info.family,
    )
