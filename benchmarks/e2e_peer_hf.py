"""The peer for benchmarks/e2e_decode.py: transformers' MixtralForCausalLM, bf16,
random weights at Mixtral-8x7B shapes, greedy decode with ``generate``.

    python benchmarks/e2e_peer_hf.py --batches 1,16 --out benchmarks/results/e2e_peer_h200.json

Decode time per step = (t(generate of 2 + S tokens) - t(generate of 2 tokens)) / S,
which cancels the prefill. Run in its own process: the bf16 model takes 93 GB.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from transformers import MixtralConfig, MixtralForCausalLM

BASE_TOKENS = 2


def mixtral_8x7b_config() -> MixtralConfig:
    return MixtralConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-5,
    )


def timed_generate(model, ids: torch.Tensor, new_tokens: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                   min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device("cuda"):
        model = MixtralForCausalLM._from_config(mixtral_8x7b_config(), dtype=torch.bfloat16).eval()
    build_s = time.perf_counter() - t0
    rows = []
    with torch.inference_mode():
        for b in [int(x) for x in args.batches.split(",")]:
            ids = torch.randint(10, 32000, (b, args.prompt_len), device="cuda")
            timed_generate(model, ids, BASE_TOKENS)  # warm-up
            base = timed_generate(model, ids, BASE_TOKENS)
            full = timed_generate(model, ids, BASE_TOKENS + args.steps)
            step = (full - base) / args.steps
            rows.append({"batch": b, "step_ms": step * 1e3, "tok_per_s": b / step})
            print(json.dumps(rows[-1]), flush=True)
    result = {
        "command": " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "commit": args.commit,
        "model": "MixtralForCausalLM, Mixtral-8x7B shapes, random init, bf16, eager",
        "prompt_len": args.prompt_len,
        "build_seconds": build_s,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\ntransformers {transformers.__version__} MixtralForCausalLM bf16 (built in {build_s:.0f} s)")
    print(f"{'B':>3} {'step ms':>9} {'tok/s':>8}")
    for r in rows:
        print(f"{r['batch']:3d} {r['step_ms']:9.2f} {r['tok_per_s']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
