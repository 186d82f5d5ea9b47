"""Issue 4's serving check: under a memory budget where 8-bit experts leave
little room for KV, demoting experts lets more sequences run without
preemption. Two real stacks on the same budget, read from the gateway's
/metrics: the static baseline (--static-precision) preempts, the dynamic one
does not and shows weight pages below 8 bits."""

from __future__ import annotations

import concurrent.futures
import re
import urllib.request

import openai
import pytest
import torch
from e2e_stack import DEFAULT_MODEL, print_logs, start_stack

from dataplane.checkpoint import Checkpoint
from dataplane.kv_cache import kv_block_bytes
from dataplane.weights.layout import NUM_FIELDS, field_size, pages_for

KV_BLOCK_TOKENS = 16  # the dataplane's default block size
SPARE_PAGES = 12  # arena pages left for KV next to 8-bit experts (one sequence fits alone)
SEQUENCES = 8
MAX_TOKENS = 96
CPU_DTYPE = torch.float32


def expert_pages_at_8_bits() -> int:
    """Arena pages the default model's experts take at 8 bits (docs/WEIGHT_LAYOUT.md)."""
    spec = Checkpoint(DEFAULT_MODEL).spec
    block = kv_block_bytes(KV_BLOCK_TOKENS, spec.num_layers, spec.num_kv_heads, spec.head_dim, CPU_DTYPE)
    page = 1 << (block - 1).bit_length()
    hidden, ffn = spec.hidden_size, spec.intermediate_size
    per_expert = sum(
        pages_for(field_size(n, k, f).total, page)
        for n, k in ((ffn, hidden), (ffn, hidden), (hidden, ffn))
        for f in range(NUM_FIELDS)
    )
    return spec.num_layers * spec.num_experts * per_expert


def metrics(stack) -> str:
    with urllib.request.urlopen(f"{stack.cfg.gateway_url}/metrics", timeout=10) as reply:
        return reply.read().decode()


def sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def run_load(stack) -> None:
    api = openai.OpenAI(base_url=f"{stack.cfg.gateway_url}/v1", api_key="unused", max_retries=0, timeout=300)
    name = api.models.list().data[0].id

    def one(i: int) -> int:
        reply = api.chat.completions.create(
            model=name, messages=[{"role": "user", "content": f"Explain item {i} of the list."}],
            max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True},
        )
        return reply.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(SEQUENCES) as pool:
        assert list(pool.map(one, range(SEQUENCES))) == [MAX_TOKENS] * SEQUENCES


@pytest.fixture(params=["static", "dynamic"])
def pressured_stack(request, tmp_path):
    pages = expert_pages_at_8_bits() + SPARE_PAGES
    args = ["--max-arena-pages", str(pages), "--min-residence-ms", "0"]
    if request.param == "static":
        args.append("--static-precision")
    stack = start_stack(tmp_path, extra_dataplane_args=args)
    yield request.param, stack
    stack.stop()
    print_logs(tmp_path)


def test_demotion_lets_more_sequences_fit_without_preemption(pressured_stack):
    mode, stack = pressured_stack
    if mode == "static":
        assert sample(metrics(stack), "pagedweight_engine_arena_pages_weights", '{bits="8"}') == expert_pages_at_8_bits()
    run_load(stack)
    after = metrics(stack)
    preemptions = sample(after, "pagedweight_engine_preemptions_total")
    low_bit_pages = sum(
        sample(after, "pagedweight_engine_arena_pages_weights", f'{{bits="{b}"}}') for b in (2, 3, 4, 6)
    )
    if mode == "static":
        assert preemptions > 0
        assert low_bit_pages == 0
    else:
        assert preemptions == 0
        assert low_bit_pages > 0
