"""Runs a batch of requests through the engine together (the e2e benchmarks' load)."""

from __future__ import annotations

from dataclasses import replace

from dataplane.engine_io import QueueSink
from dataplane.sampling_params import SamplingParams


def run_batch(engine, batch: int, prompt_len: int, new_tokens: int, tag: str,
              sampling: SamplingParams | None = None) -> list[list[int]]:
    """Runs ``batch`` requests together; returns each one's generated tokens.

    sampling: temperature / top-p, logprobs and penalties of every request
    (request i seeded with i); None = greedy and nothing more.
    """
    vocab = engine.model_info.vocab_size
    sinks = []
    for i in range(batch):
        sink = QueueSink()
        prompt = [(97 * i + 31 * j) % (vocab - 10) + 10 for j in range(prompt_len)]
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        if sampling is not None:
            params = replace(params, temperature=sampling.temperature, top_p=sampling.top_p, seed=i,
                             logprobs=sampling.logprobs, presence_penalty=sampling.presence_penalty,
                             frequency_penalty=sampling.frequency_penalty)
        engine.add_request(f"{tag}-{i}", prompt, params, sink)
        sinks.append(sink)
    return [[t for out in sink.outputs(timeout=900) for t in out.new_token_ids] for sink in sinks]
