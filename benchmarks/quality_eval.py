"""Quality of a paged multi-precision model against its 8-bit self (CPU).

``PagedModel`` loads a checkpoint into the dataplane model, moves its experts
into a WeightStore (every block encoded once with the project's codec) and
sets per-block bits by demoting/promoting blocks, exactly as the dataplane
does. ``evaluate`` measures, per domain on a fixed subset of windows:

* perplexity of the next-token targets (models/train/lm_eval.py counting rule);
* mean KL(p_8bit || p) per counted position, nats; the 8-bit log-probs are
  computed once per domain and kept in memory (float32, windows x S x vocab).

Shared by benchmarks/frontier.py and benchmarks/domain_shift.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.precision_states import set_block_bits
from controlplane.planner import NUM_PROJECTIONS, ModelShape
from dataplane.memory.arena import Arena
from dataplane.profiling.corpus import split_windows
from dataplane.profiling.sensitivity import load_model
from dataplane.profiling.window_forward import WindowForward
from dataplane.routing_stats import RoutingStats
from dataplane.weights.layout import HOST_ONLY_BITS, VIEW_BITS
from dataplane.weights.transform import quantize_experts
from models.train.lm_eval import IGNORE, EvalWindows

# Small pages so that footprints are the blocks' real bytes (the engine's KV
# pages of this tiny model are 64 KiB: larger than a whole 2-bit block).
PAGE_BYTES = 1024
ARENA_PAGES = 1 << 16  # 64 MiB: every expert block of the default model at 8 bits (~10.4 MiB)
CEILING = VIEW_BITS[-1]


@dataclass(frozen=True)
class Quality:
    perplexity: float
    kl: float  # mean KL(p_8bit || p) per counted position, nats
    nll: float  # mean nats per counted target
    tokens: int  # counted positions

    def as_dict(self) -> dict:
        return {"perplexity": round(self.perplexity, 5), "kl": float(f"{self.kl:.6g}"),
                "nll": round(self.nll, 6), "tokens": self.tokens}


class PagedModel:
    """The checkpoint with its experts in a WeightStore (CPU, float32)."""

    def __init__(self, model_path: str | Path, seq_len: int, batch: int) -> None:
        self.model, ckpt = load_model(model_path)
        self.spec = ckpt.spec
        spec = self.spec
        arena = Arena(ARENA_PAGES, PAGE_BYTES)  # quantize_experts raises OutOfPages when 8 bits do not fit
        self.store = quantize_experts(self.model, arena, initial_bits=CEILING, progress=False)
        self.num_layers, self.num_experts = spec.num_layers, spec.num_experts
        self.shape = ModelShape(
            num_layers=spec.num_layers, num_experts=spec.num_experts, top_k=spec.top_k, view_bits=VIEW_BITS,
            footprint_bytes=tuple(
                {b: self.store.footprint_bytes(p, b) for b in (HOST_ONLY_BITS, *VIEW_BITS)}
                for p in range(NUM_PROJECTIONS)
            ),
        )
        self.runner = WindowForward(self.model, spec, batch, seq_len)
        self.batch = batch

    def bits(self) -> np.ndarray:
        """[L, E, 3] committed bits."""
        return np.asarray(self.store.block_bits(), dtype=np.int64).reshape(self.num_layers, self.num_experts, 3)

    def set_bits(self, bits: np.ndarray) -> None:
        """Moves every block to bits [L, E, 3] (views only)."""
        bits = np.asarray(bits).reshape(self.num_layers, self.num_experts, NUM_PROJECTIONS)
        set_block_bits(self.store, [int(b) for b in bits.reshape(-1)])  # [L, E, 3] flat is block order

    def expert_bytes(self, bits: np.ndarray | None = None) -> int:
        return self.shape.expert_bytes(self.bits() if bits is None else np.asarray(bits))

    def routing(self, windows: EvalWindows) -> tuple[np.ndarray, np.ndarray]:
        """(routed tokens, router prob mass), each [L, E], over all positions of ``windows``."""
        routed = np.zeros((self.num_layers, self.num_experts))
        mass = np.zeros((self.num_layers, self.num_experts))
        for start in range(0, windows.inputs.shape[0], self.batch):
            _, stats = self.runner.hidden(windows.inputs[start:start + self.batch])
            routed += stats.routed_tokens.numpy()
            mass += stats.prob_mass.double().numpy()
        return routed, mass

    def window_routing(self, inputs: torch.Tensor) -> RoutingStats:
        """Routing of one batch of windows [B, S]."""
        return self.runner.hidden(inputs)[1]


def load_domain_windows(tokens_dir: str | Path, domains: list[str], split: str, seq_len: int,
                        windows: int) -> dict[str, EvalWindows]:
    return {d: split_windows(tokens_dir, d, split, seq_len, windows) for d in domains}


def routing_over(paged: PagedModel, windows: Mapping[str, EvalWindows]) -> tuple[np.ndarray, np.ndarray]:
    """(routed tokens, router prob mass), each [L, E], summed over every domain's windows."""
    routed = np.zeros((paged.num_layers, paged.num_experts))
    mass = np.zeros_like(routed)
    for win in windows.values():
        r, m = paged.routing(win)
        routed, mass = routed + r, mass + m
    return routed, mass


def _kl_and_nll(ref: torch.Tensor, lp: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """Sums over counted positions: ref, lp [B, S, V] log-probs; targets [B, S]."""
    keep = targets != IGNORE  # [B, S]
    r, q = ref[keep], lp[keep]  # [n, V]
    kl = float((r.exp() * (r - q)).sum(dim=-1).double().sum())
    nll = float(F.nll_loss(q, targets[keep], reduction="sum").double())
    return kl, nll


def reference_log_probs(paged: PagedModel, win: EvalWindows) -> list[torch.Tensor]:
    """Log-probs of the all-8-bit model, one [B, S, V] tensor per batch (the
    model is left at 8 bits)."""
    paged.set_bits(np.full(paged.bits().shape, CEILING))
    return [paged.runner.log_probs(win.inputs[s:s + paged.batch]) for s in range(0, win.inputs.shape[0], paged.batch)]


def current_quality(paged: PagedModel, win: EvalWindows, refs: list[torch.Tensor]) -> Quality:
    """Quality of the model at its current bits against the reference ``refs``."""
    kl_sum = nll_sum = 0.0
    for i, s in enumerate(range(0, win.inputs.shape[0], paged.batch)):
        lp = paged.runner.log_probs(win.inputs[s:s + paged.batch])
        kl, nll = _kl_and_nll(refs[i], lp, win.targets[s:s + paged.batch])
        kl_sum, nll_sum = kl_sum + kl, nll_sum + nll
    counted = win.counted
    return Quality(math.exp(nll_sum / counted), kl_sum / counted, nll_sum / counted, counted)


def evaluate(paged: PagedModel, windows: Mapping[str, EvalWindows], configs: Mapping[str, np.ndarray],
             on_done: Callable[[str, str, Quality], None] | None = None) -> dict[str, dict[str, Quality]]:
    """{config name: {domain: Quality}} for bits configs [L, E, 3]; the
    reference is the all-8-bit model. Domains run one at a time (one domain's
    reference log-probs in memory)."""
    out: dict[str, dict[str, Quality]] = {name: {} for name in configs}
    for domain, win in windows.items():
        refs = reference_log_probs(paged, win)
        for name, bits in configs.items():
            paged.set_bits(bits)
            q = current_quality(paged, win, refs)
            out[name][domain] = q
            if on_done is not None:
                on_done(name, domain, q)
        del refs
    return out


def mean_quality(per_domain: Mapping[str, Quality]) -> dict:
    """Unweighted mean over domains of ppl, KL and nll."""
    vals = list(per_domain.values())
    return {"perplexity": round(float(np.mean([q.perplexity for q in vals])), 5),
            "kl": float(f"{np.mean([q.kl for q in vals]):.6g}"),
            "nll": round(float(np.mean([q.nll for q in vals])), 6)}
