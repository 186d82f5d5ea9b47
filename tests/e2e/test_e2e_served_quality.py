"""The quality the server delivers at a precision state is the quality the
offline evaluator measures for that state (benchmarks/quality_eval.py, what
the quality-memory frontier is built from): a text scored through the HTTP
API (/v1/completions, echo + logprobs) on a dataplane held at static 4-bit
experts gets, token for token, the offline model's log-probabilities at
uniform 4 bits, and not the 8-bit ones."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
from tokenizers import Tokenizer

from benchmarks.quality_eval import PagedModel
from e2e_stack import DEFAULT_MODEL, print_logs, start_stack

TEXT = "def parse(text):\n    return [line.split() for line in text.splitlines()]\n"
SERVED_BITS = 4
ATOL = 1e-4


@pytest.fixture(scope="module")
def static_stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack4")
    running = start_stack(
        root, extra_dataplane_args=["--static-precision", "--initial-expert-bits", str(SERVED_BITS)]
    )
    yield running
    running.stop()
    print_logs(root)


def offline_log_probs(ids: list[int], bits: int) -> list[float]:
    """log p(ids[j + 1] | ids[: j + 1]) for every j, experts at uniform `bits`."""
    paged = PagedModel(DEFAULT_MODEL, seq_len=len(ids), batch=1)
    paged.set_bits(np.full(paged.bits().shape, bits))
    log_probs = paged.runner.log_probs(torch.tensor([ids]))[0]  # [S, V]
    return [log_probs[j, ids[j + 1]].item() for j in range(len(ids) - 1)]


def test_scored_text_matches_the_offline_evaluation(static_stack):
    api = openai.OpenAI(base_url=f"{static_stack.cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=120)
    name = api.models.list().data[0].id
    # max_tokens 0 with echo: the prompt scored, nothing generated (as OpenAI's scoring idiom).
    scored = api.completions.create(model=name, prompt=TEXT, max_tokens=0, echo=True, logprobs=0)
    ids = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json")).encode(TEXT).ids  # BOS first
    assert scored.choices[0].text == TEXT and scored.usage.completion_tokens == 0
    assert len(scored.choices[0].logprobs.token_logprobs) == len(ids)
    served = scored.choices[0].logprobs.token_logprobs[1:]
    at_served_bits = offline_log_probs(ids, SERVED_BITS)
    assert served == pytest.approx(at_served_bits, abs=ATOL)
    at_8_bits = offline_log_probs(ids, 8)
    assert max(abs(a - b) for a, b in zip(served, at_8_bits)) > 10 * ATOL  # the precision state shows
