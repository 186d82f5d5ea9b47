"""What int8 activations would cost in quality (CPU, the bundled model).

benchmarks/int8_product_probe.py times the MoE step with int8 products, which
need the experts' inputs in int8: x before gate/up and h = silu(gate) * up
before down, one step a per token and 128-wide group (a = absmax / 127,
round to nearest), as the probe stages them. Here both are fake-quantized
that way in the experts' plain-torch path (PagedExperts' CPU loop, mirrored
in _int8_forward), and the model's KL against its all-8-bit self is measured
with benchmarks/quality_eval.py at uniform 8, 4, 3 and 2 bits, with and
without, so that the activations' cost reads against what the weights'
bits cost.

    python3 benchmarks/int8_activation_quality.py --out benchmarks/results/int8_activation_quality_cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.quality_eval import (PagedModel, current_quality, load_domain_windows, mean_quality,  # noqa: E402
                                     reference_log_probs)
from dataplane.weights.paged_experts import PROJ_DOWN, PROJ_GATE, PROJ_UP, PagedExperts  # noqa: E402

GROUP = 128  # K of one activation step: the kernels' group
INT8_MAX = 127.0


def fake_int8(t: torch.Tensor) -> torch.Tensor:
    """[T, K] -> the same values through int8 with one step per token and
    GROUP-wide group (K a multiple of GROUP)."""
    g = t.float().view(t.shape[0], -1, GROUP)
    a = g.abs().amax(-1, keepdim=True).clamp_min(1e-12) / INT8_MAX
    return (torch.round(g / a).clamp(-INT8_MAX, INT8_MAX) * a).view_as(t).to(t.dtype)


def _int8_forward(self: PagedExperts, x: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor) -> torch.Tensor:
    # PagedExperts.forward's CPU loop with both products' inputs through fake_int8.
    out = torch.zeros_like(x)  # [T, H]
    for e in torch.unique(topk_ids).tolist():
        tok, pos = torch.where(topk_ids == e)  # [t_e], [t_e]
        xe = fake_int8(x[tok])  # [t_e, H]
        gate = xe @ self.weight(e, PROJ_GATE, x.dtype).T  # [t_e, F]
        up = xe @ self.weight(e, PROJ_UP, x.dtype).T  # [t_e, F]
        y = fake_int8(F.silu(gate) * up) @ self.weight(e, PROJ_DOWN, x.dtype).T  # [t_e, H]
        out.index_add_(0, tok, (y * topk_weights[tok, pos].unsqueeze(-1)).to(x.dtype))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    ap.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    ap.add_argument("--domains", default="english,german,c")
    ap.add_argument("--windows", type=int, default=16, help="test windows per domain")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--bits", default="8,4,3,2")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    paged = PagedModel(args.model, args.seq_len, args.batch)
    if paged.spec.hidden_size % GROUP or paged.spec.intermediate_size % GROUP:
        ap.error(f"hidden and intermediate sizes must be multiples of {GROUP}")
    windows = load_domain_windows(args.tokens_dir, args.domains.split(","), "test", args.seq_len, args.windows)
    shape = paged.bits().shape
    configs = {f"{b}-bit": np.full(shape, int(b)) for b in args.bits.split(",")}
    plain: dict = {name: {} for name in configs}
    int8: dict = {name: {} for name in configs}
    for domain, win in windows.items():
        refs = reference_log_probs(paged, win)  # all-8-bit weights, fp activations
        for name, bits in configs.items():
            paged.set_bits(bits)
            plain[name][domain] = current_quality(paged, win, refs)
            with mock.patch.object(PagedExperts, "forward", _int8_forward):
                int8[name][domain] = current_quality(paged, win, refs)
    results = {}
    for name in configs:
        results[name] = dict(fp=mean_quality(plain[name]), int8_activations=mean_quality(int8[name]))
        print(f"{name}: KL fp {results[name]['fp']['kl']:.5f}, int8 activations "
              f"{results[name]['int8_activations']['kl']:.5f} nats", flush=True)
    if args.out:
        args.out.write_text(json.dumps(dict(
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(), command=" ".join(sys.argv),
            model=str(args.model), domains=args.domains, windows=args.windows, seq_len=args.seq_len,
            reference="all-8-bit weights, fp activations", results=results), indent=1))


if __name__ == "__main__":
    main()
