"""Offline sensitivity profiler: the quality cost of every expert block at
every bitwidth, written beside the model as ``sensitivity.json`` (the
controlplane's format, controlplane/sensitivity.py).

    python -m dataplane.profiling.sensitivity --model models/pw-moe-tiny --corpus-dir data/tokens [--tokens N]

Calibration: ``--tokens`` tokens of the TRAIN split, equal shares per domain,
in windows of ``--seq-len`` spread evenly over each split (corpus.py). The
model runs them in float32 while ``RecordingExperts`` (moments.py)
accumulates, per expert, the second moments of its blocks' inputs over the
tokens routed to it.

Cost of block W [N, K] at view b, per routed token, with dW = W - decode_b(encode(W))
(the project's codec, so the error is exactly what a b-bit block serves):

    cost(b) = trace(R dW S dW^T) = sum_f R_f (dW S dW^T)_ff

* weighting "input" (plain): S = E[x x^T] over routed tokens, R = I. For gate
  and up x is the routed hidden state, for down the intermediate
  h = silu(W1 x) * (W3 x). cost = mean squared error of the block's output.
* weighting "output" (default): every projection in the units of the MoE
  layer's output, g = the token's routing weight for the expert:
  down: S = E[g^2 h h^T], R = I  (exact: the error the block adds to the output);
  gate/up: S = E[g^2 x x^T], R_f = ||W2[:, f]||^2 E[g^2 d_f^2] / E[g^2] with
  d_f = dh_f / d(W x)_f (silu'(a_f) u_f for gate, silu(a_f) for up): the error
  of row f carried through h to the output, neglecting W2's column
  correlations and the correlation of d_f with x.

The table stores cost(b) - cost(8) clipped at 0 and made non-increasing in
bits (more bits never cost more); bits 0 (host-only) gets cost(8) = 0, because
a host-only block is read in place at the master view (dataplane/weights/store.py;
its price is the read stall, which the planner charges). By
default (``kl_windows_per_domain`` > 0) the costs are then rescaled per
(layer, projection) into KL units measured on calibration windows
(kl_calibration.py): the raw errors of different layers are not comparable
(on the default model a unit of layer-0 error costs ~10x the KL of a unit of
layer-3 error), and a planner fed raw units does worse than uniform bits. An
expert no calibration token was routed to is costed with its layer's pooled
moments (its weights' error under typical inputs), so it stays ordered by its
own quantization error. A sidecar ``sensitivity_profile.json`` records the
calibration (split, tokens per domain, sha256 of the token ids) and per-expert
routed counts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from controlplane.sensitivity import BITS_AXIS, CEILING_BITS, SENSITIVITY_FILE, SensitivityTable, save
from dataplane.checkpoint import Checkpoint
from dataplane.models.registry import build_model
from dataplane.profiling.corpus import corpus_domains, split_windows, windows_digest
from dataplane.profiling.kl_calibration import (
    ExpertViews,
    calibrated_table,
    calibrated_table_per_view,
    group_kl,
    kl_scales,
    view_scales,
)
from dataplane.profiling.moments import ExpertMoments, RecordingExperts, attach_recorders
from dataplane.profiling.window_forward import WindowForward
from dataplane.weights.codec import decode, encode
from dataplane.weights.layout import NUM_PROJ, PROJ_DOWN, PROJ_GATE, PROJ_UP, VIEW_BITS

PROFILE_SIDECAR = "sensitivity_profile.json"
WEIGHTINGS = ("input", "output")
UNITS = {
    "input": "mean squared error of the block's output per routed token, relative to the 8-bit view",
    "output": "squared error added to the MoE layer output per routed token (routing-weighted), "
              "relative to the 8-bit view",
    "kl": "predicted KL(p_8bit || p) in nats per token added by serving the block at these bits "
          "while its expert gets an even share of its layer's routings",
}


@dataclass(frozen=True)
class ProfileConfig:
    tokens: int = 65536  # calibration tokens over all domains (equal shares)
    seq_len: int = 512
    batch: int = 8  # windows per forward pass
    weighting: str = "output"
    split: str = "train"
    # KL calibration (kl_calibration.py): windows per domain taken from the
    # calibration windows (0 = keep the raw units), and the view it measures.
    kl_windows_per_domain: int = 4
    kl_bits: int = 3
    # Views measured by the KL calibration; more than one gives each view its
    # own scale (kl_calibration.view_scales). () = only kl_bits.
    kl_views: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.tokens < self.seq_len or self.seq_len <= 1 or self.batch <= 0:
            raise ValueError("need tokens >= seq_len > 1 and batch > 0")
        if self.kl_windows_per_domain < 0 or self.kl_bits not in VIEW_BITS[:-1]:
            raise ValueError(f"kl_windows_per_domain must be >= 0 and kl_bits one of {VIEW_BITS[:-1]}")
        if any(b not in VIEW_BITS[:-1] for b in self.kl_views):
            raise ValueError(f"kl_views must be among {VIEW_BITS[:-1]}")


@dataclass(frozen=True)
class BlockStats:
    """Moments of one expert normalised per routed token (module doc)."""

    count: int
    gate_sq: float  # E[g^2]
    x: torch.Tensor  # [H, H] E[x x^T]
    x_g2: torch.Tensor  # [H, H] E[g^2 x x^T]
    h: torch.Tensor  # [F, F] E[h h^T]
    h_g2: torch.Tensor  # [F, F] E[g^2 h h^T]
    gate_row: torch.Tensor  # [F] E[g^2 (dh/da)^2]
    up_row: torch.Tensor  # [F] E[g^2 silu(a)^2]


def expert_stats(m: ExpertMoments, expert: int) -> BlockStats:
    """The expert's moments per routed token; its layer's pooled moments
    when no token was routed to it (module doc)."""
    sel = slice(expert, expert + 1) if int(m.count[expert]) > 0 else slice(None)
    n = int(m.count[sel].sum())
    if n == 0:
        raise ValueError("no calibration token reached this layer's experts")
    return BlockStats(
        count=int(m.count[expert]),
        gate_sq=float(m.gate_sq[sel].sum()) / n,
        x=m.x_sum[sel].sum(0) / n, x_g2=m.x_g2[sel].sum(0) / n,
        h=m.h_sum[sel].sum(0) / n, h_g2=m.h_g2[sel].sum(0) / n,
        gate_row=m.gate_row[sel].sum(0) / n, up_row=m.up_row[sel].sum(0) / n,
    )


def quadratic_cost_rows(delta: torch.Tensor, sigma: torch.Tensor, row_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The diagonal of R dW S dW^T, float64 [N]: delta [N, K], sigma [K, K], row_weight [N] (R = I when None)."""
    d = delta.double()
    per_row = ((d @ sigma.double()) * d).sum(dim=1)  # [N]
    return per_row if row_weight is None else row_weight.double() * per_row


def quadratic_cost(delta: torch.Tensor, sigma: torch.Tensor, row_weight: torch.Tensor | None = None) -> float:
    """trace(R dW S dW^T): delta [N, K], sigma [K, K], row_weight [N] (R = I when None)."""
    return float(quadratic_cost_rows(delta, sigma, row_weight).sum())


def view_deltas(w: torch.Tensor) -> dict[int, torch.Tensor]:
    """{bits: W - decode_bits(encode(W))} for every view; w [N, K]."""
    w = w.detach().float()
    block = encode(w)
    return {b: w - decode(block, b) for b in VIEW_BITS}


def block_weighting(stats: BlockStats, proj: int, weighting: str,
                    w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(S, R) of the module doc for one block; w2 is the expert's down weight [H, F]."""
    if weighting == "input":
        return (stats.h if proj == PROJ_DOWN else stats.x), None
    if proj == PROJ_DOWN:
        return stats.h_g2, None
    col_sq = (w2.double() ** 2).sum(dim=0)  # [F] ||W2[:, f]||^2
    row = stats.gate_row if proj == PROJ_GATE else stats.up_row  # [F]
    return stats.x_g2, col_sq * row / max(stats.gate_sq, np.finfo(np.float64).tiny)


def raw_costs(weights: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], moments: list[ExpertMoments],
              weighting: str, progress: bool = True) -> np.ndarray:
    """Absolute cost(b) per block: [L, E, 3, len(VIEW_BITS)].

    weights[l] = (w1 [E, F, H], w3 [E, F, H], w2 [E, H, F]) of layer l."""
    num_layers, num_experts = len(weights), weights[0][0].shape[0]
    out = np.zeros((num_layers, num_experts, NUM_PROJ, len(VIEW_BITS)))
    bar = tqdm(total=num_layers * num_experts * NUM_PROJ, desc="block costs", unit="block", disable=not progress)
    with bar:
        for layer, (w1, w3, w2) in enumerate(weights):
            for expert in range(num_experts):
                stats = expert_stats(moments[layer], expert)
                for proj, w in ((PROJ_GATE, w1[expert]), (PROJ_UP, w3[expert]), (PROJ_DOWN, w2[expert])):
                    sigma, rows = block_weighting(stats, proj, weighting, w2[expert])
                    deltas = view_deltas(w)
                    out[layer, expert, proj] = [quadratic_cost(deltas[b], sigma, rows) for b in VIEW_BITS]
                    bar.update(1)
    return out


def relative_costs(raw: np.ndarray) -> np.ndarray:
    """[L, E, 3, views] absolute -> [L, E, 3, len(BITS_AXIS)] table costs (module doc)."""
    rel = np.clip(raw - raw[..., VIEW_BITS.index(CEILING_BITS), None], 0.0, None)
    rel = np.maximum.accumulate(rel[..., ::-1], axis=-1)[..., ::-1]  # non-increasing in bits
    by_bits = {b: rel[..., i] for i, b in enumerate(VIEW_BITS)}
    by_bits[0] = by_bits[CEILING_BITS]  # host-only is served at the master view
    return np.stack([by_bits[b] for b in BITS_AXIS], axis=-1)


def collect_moments(model: nn.Module, runner: WindowForward, windows: torch.Tensor, batch: int,
                    progress: bool = True) -> list[RecordingExperts]:
    """Runs windows [N, S] through ``model`` with recorders attached (in
    place); returns the recorders in layer order."""
    recorders = attach_recorders(model)
    for start in tqdm(range(0, windows.shape[0], batch), desc="calibration", unit="batch", disable=not progress):
        runner.hidden(windows[start:start + batch])
    return recorders


def load_model(model_path: str | Path) -> tuple[nn.Module, Checkpoint]:
    """The checkpoint's dataplane model in float32 on the CPU, eval mode."""
    ckpt = Checkpoint(model_path)
    model = build_model(ckpt.spec, torch.device("cpu"), torch.float32)
    model.load_weights(ckpt.iter_tensors(progress=False))
    return model.eval(), ckpt


def profile(model_path: str | Path, tokens_dir: str | Path, cfg: ProfileConfig,
            progress: bool = True) -> tuple[SensitivityTable, dict]:
    """The sensitivity table of the model and the sidecar's record."""
    start = time.perf_counter()
    model, ckpt = load_model(model_path)
    domains = corpus_domains(tokens_dir)
    per_domain = max(1, cfg.tokens // (len(domains) * cfg.seq_len))
    parts = [split_windows(tokens_dir, d, cfg.split, cfg.seq_len, per_domain).inputs for d in domains]
    windows = torch.cat(parts)  # [N, S]
    runner = WindowForward(model, ckpt.spec, cfg.batch, cfg.seq_len)
    recorders = collect_moments(model, runner, windows, cfg.batch, progress)
    moments = [r.moments for r in recorders]
    weights = [(r.inner.w1.detach(), r.inner.w3.detach(), r.inner.w2.detach()) for r in recorders]
    raw = raw_costs(weights, moments, cfg.weighting, progress)
    cost = relative_costs(raw)
    kl_record: dict = {"enabled": cfg.kl_windows_per_domain > 0}
    if cfg.kl_windows_per_domain > 0:
        for r in recorders:
            r.enabled = False
        kl_windows = torch.cat([p[:cfg.kl_windows_per_domain] for p in parts])  # [N', S]
        views = ExpertViews([r.inner for r in recorders])
        if len(cfg.kl_views) > 1:
            kl_by_bits = {}
            for bits in cfg.kl_views:
                kl_by_bits[bits], routed = group_kl(runner, views, kl_windows, bits, cfg.batch, len(recorders),
                                                    progress)
            scale = view_scales(cost, kl_by_bits, routed, BITS_AXIS)
            cost = calibrated_table_per_view(cost, scale, ckpt.spec.top_k)
            kl_record.update(views=list(cfg.kl_views), tokens=int(kl_windows.numel()),
                             group_kl={str(b): kl.tolist() for b, kl in kl_by_bits.items()},
                             scale=scale.tolist(), scale_bits_axis=list(BITS_AXIS))
        else:
            kl, routed = group_kl(runner, views, kl_windows, cfg.kl_bits, cfg.batch, len(recorders), progress)
            scale = kl_scales(cost, kl, routed, BITS_AXIS.index(cfg.kl_bits))
            cost = calibrated_table(cost, scale, ckpt.spec.top_k)
            kl_record.update(bits=cfg.kl_bits, tokens=int(kl_windows.numel()), group_kl=kl.tolist(),
                             scale=scale.tolist())
    table = SensitivityTable(cost=cost, source=str(Path(model_path) / SENSITIVITY_FILE), is_fallback=False)
    record = {
        "model": str(model_path),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(cfg),
        "units": UNITS["kl"] if kl_record["enabled"] else UNITS[cfg.weighting],
        "kl_calibration": kl_record,
        "calibration": {
            "split": cfg.split,
            "windows_per_domain": {d: int(p.shape[0]) for d, p in zip(domains, parts)},
            "tokens": int(windows.numel()),
            "tokens_sha256": windows_digest(parts),
        },
        "routed_tokens": [m.count.tolist() for m in moments],  # [L][E]
        "absolute_cost_8bit": raw[..., VIEW_BITS.index(CEILING_BITS)].tolist(),  # [L][E][3]
        "wall_s": round(time.perf_counter() - start, 1),
        "torch": torch.__version__,
    }
    return table, record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="model folder (the table is written into it)")
    parser.add_argument("--corpus-dir", type=Path, required=True, help="tokenized corpus (data/tokens)")
    parser.add_argument("--tokens", type=int, default=ProfileConfig.tokens)
    parser.add_argument("--seq-len", type=int, default=ProfileConfig.seq_len)
    parser.add_argument("--batch", type=int, default=ProfileConfig.batch)
    parser.add_argument("--weighting", choices=WEIGHTINGS, default=ProfileConfig.weighting)
    parser.add_argument("--kl-windows-per-domain", type=int, default=ProfileConfig.kl_windows_per_domain,
                        help="windows per domain for the KL calibration of the units (0 = raw units)")
    parser.add_argument("--kl-bits", type=int, default=ProfileConfig.kl_bits)
    parser.add_argument("--kl-views", default=",".join(map(str, ProfileConfig.kl_views)),
                        help="comma list of views to calibrate each on its own, e.g. 2,3,4,6 ('' = only --kl-bits)")
    parser.add_argument("--out", type=Path, default=None, help=f"default: MODEL/{SENSITIVITY_FILE}")
    args = parser.parse_args(argv)
    cfg = ProfileConfig(tokens=args.tokens, seq_len=args.seq_len, batch=args.batch, weighting=args.weighting,
                        kl_windows_per_domain=args.kl_windows_per_domain, kl_bits=args.kl_bits,
                        kl_views=tuple(int(b) for b in args.kl_views.split(",") if b))
    table, record = profile(args.model, args.corpus_dir, cfg)
    out = args.out or args.model / SENSITIVITY_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    save(table, out, model_name=args.model.name, units=record["units"])
    (out.parent / PROFILE_SIDECAR).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} ({record['calibration']['tokens']} calibration tokens, {record['wall_s']} s)")


if __name__ == "__main__":
    main()
