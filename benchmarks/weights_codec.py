"""Multi-precision codec measurements (CPU): scale fit, encode speed, model KL.

Writes JSON (default benchmarks/results/weights_codec_cpu.json):
* error of every view relative to round-to-nearest at the same bits, for the
  midpoint and the least-squares (scale, offset) fits, on Gaussian and
  heavy-tailed matrices;
* encode time per block for the default model's shapes and for the whole
  default model (4 layers x 8 experts x 3 blocks);
* KL(unquantized || b-bit) of a small random Mixtral at each uniform bitwidth,
  for both fits.

Run: .venv/bin/python benchmarks/weights_codec.py [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from dataplane.weights.codec import ScaleFit, decode, encode, rtn_quantize
from dataplane.weights.layout import VIEW_BITS

MATRIX_SHAPE = (1024, 1024)
WEIGHT_STD = 0.02
DEFAULT_MODEL_SHAPES = [(384, 256), (256, 384)]  # pw-moe-tiny: gate/up [F, H], down [H, F]
TIMING_REPEATS = 20


def _matrices() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    n, k = MATRIX_SHAPE
    return {
        "gaussian": torch.randn(n, k) * WEIGHT_STD,
        "student_t3": torch.distributions.StudentT(3.0).sample((n, k)) * WEIGHT_STD,
        "student_t2": torch.distributions.StudentT(2.0).sample((n, k)) * WEIGHT_STD,
    }


def scale_fit_table() -> dict:
    table: dict = {}
    for name, w in _matrices().items():
        row: dict = {}
        for fit in ScaleFit:
            block = encode(w, fit)
            row[fit.value] = {
                str(b): round(float((w - decode(block, b)).norm() / (w - rtn_quantize(w, b)).norm()), 4)
                for b in VIEW_BITS
            }
        row["rtn_relative_error"] = {
            str(b): round(float((w - rtn_quantize(w, b)).norm() / w.norm()), 5) for b in VIEW_BITS
        }
        table[name] = row
    return table


def encode_timing() -> dict:
    out: dict = {"threads": torch.get_num_threads()}
    for n, k in DEFAULT_MODEL_SHAPES:
        w = torch.randn(n, k) * WEIGHT_STD
        encode(w)
        start = time.perf_counter()
        for _ in range(TIMING_REPEATS):
            encode(w)
        out[f"{n}x{k}_ms"] = round((time.perf_counter() - start) / TIMING_REPEATS * 1e3, 3)
    gate_up, down = DEFAULT_MODEL_SHAPES
    experts, layers = 8, 4
    stacks = [torch.randn(experts, *shape) * WEIGHT_STD for _ in range(layers) for shape in (gate_up, gate_up, down)]
    start = time.perf_counter()
    for w in stacks:
        for block in w:
            encode(block)
    out["default_model_s"] = round(time.perf_counter() - start, 3)
    out["default_model_blocks"] = experts * len(stacks)
    return out


@torch.no_grad()
def model_kl() -> dict:
    from transformers import MixtralConfig, MixtralForCausalLM

    from dataplane.memory.arena import Arena
    from dataplane.weights.transform import quantize_experts

    cfg = MixtralConfig(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=512, initializer_range=0.05,
    )
    ids = torch.tensor(list(Path(__file__).read_bytes()[:384]))[None]
    out: dict = {}
    for fit in ScaleFit:
        torch.manual_seed(0)
        model = MixtralForCausalLM(cfg).eval()
        ref = model(ids).logits.log_softmax(-1)
        store = quantize_experts(model, Arena(8192, 4096), scale_fit=fit, progress=False)
        kl = {}
        for bits in sorted(VIEW_BITS, reverse=True):
            for b in range(store.num_blocks):
                store.demote(b, bits)
            logp = model(ids).logits.log_softmax(-1)
            kl[str(bits)] = float((ref.exp() * (ref - logp)).sum(-1).mean())
        out[fit.value] = kl
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/weights_codec_cpu.json"))
    args = parser.parse_args()
    result = {
        "date": date.today().isoformat(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "command": "benchmarks/weights_codec.py",
        "view_error_over_rtn": scale_fit_table(),
        "encode": encode_timing(),
        "random_mixtral_kl": model_kl(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
