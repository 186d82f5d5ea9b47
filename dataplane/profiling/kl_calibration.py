"""Calibrates the sensitivity table's units to KL divergence, per (layer, projection).

The activation-weighted error of a block measures the damage at the block's
own layer; how much of it reaches the next-token distribution depends on the
layer (on the default model a unit of layer-0 error costs ~15x the KL of a
unit of layer-3 error, whose residual stream is larger) and on the projection.
So the profiler measures, for every (layer l, projection p), the KL added when
all experts' p blocks of layer l are served at ``bits`` (every other block at
8 bits) on calibration windows, and rescales that group's costs so that the
table predicts it:

    scale[l, p] = KL[l, p] / sum_e f[l, e] * c[l, e, p](bits)
    table[l, e, p, :] = scale[l, p] * c[l, e, p, :] * top_k / E

where c is the per-routed-token cost and f[l, e] the routed tokens of expert
e per token on the KL windows (sum over e = top_k). With several measured
views (``view_scales``), each view gets its own scale[l, p, bits] (the
KL-per-error ratio differs between 2 and 6 bits); a view with no usable
measurement borrows the nearest measured view's scale, and the table is made
non-increasing in bits again afterwards. The factor top_k / E makes
the planner's dQ = importance * cost (importance = E * routed share, 1 for an
even share) the predicted KL of the demotion in nats per token: a table entry
is the KL its demotion adds while the expert gets an even share of its layer's
routings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from tqdm import tqdm

from dataplane.layers.experts import DenseExperts
from dataplane.profiling.window_forward import WindowForward
from dataplane.weights.codec import EncodedBlock, decode, encode
from dataplane.weights.layout import NUM_PROJ, VIEW_BITS

CEILING = VIEW_BITS[-1]
# A measured group KL below this (nats/token) is float noise: the group keeps scale 0.
MIN_KL = 1e-12


class ExpertViews:
    """Serves the blocks of DenseExperts modules at codec views, in place.

    The original weights are encoded once; ``set`` overwrites a group's
    parameters with the decoded view (what a WeightStore at those bits serves)."""

    def __init__(self, experts: Sequence[DenseExperts]) -> None:
        self._experts = list(experts)
        self._blocks: list[list[list[EncodedBlock]]] = [
            [[encode(w[e].detach().float()) for e in range(w.shape[0])] for w in self._params(m)]
            for m in self._experts
        ]  # [layer][proj][expert]

    @staticmethod
    def _params(m: DenseExperts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return m.w1, m.w3, m.w2  # gate, up, down (projection order)

    @torch.no_grad()
    def set(self, layer: int, proj: int, bits: int) -> None:
        param = self._params(self._experts[layer])[proj]
        for e, block in enumerate(self._blocks[layer][proj]):
            param[e].copy_(decode(block, bits).to(param.dtype))

    def set_all(self, bits: int) -> None:
        for layer in range(len(self._experts)):
            for proj in range(NUM_PROJ):
                self.set(layer, proj, bits)


def _log_probs(runner: WindowForward, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [B, S, V], routed tokens [L, E]) of a batch of windows [B, S]."""
    hidden, routing = runner.hidden(windows)
    logits = runner.model.compute_logits(hidden.flatten(0, 1))  # [B * S, V]
    return torch.log_softmax(logits, dim=-1).view(*windows.shape, -1), routing.routed_tokens.cpu()


@torch.inference_mode()
def group_kl(runner: WindowForward, views: ExpertViews, windows: torch.Tensor, bits: int, batch: int,
             num_layers: int, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(KL [L, 3] mean nats per position when group (l, p) is at ``bits``,
    routed tokens per position [L, E]) on windows [N, S]; views end at 8 bits."""
    views.set_all(CEILING)
    refs, routed = [], None
    for s in range(0, windows.shape[0], batch):
        lp, r = _log_probs(runner, windows[s:s + batch])
        refs.append(lp)
        routed = r if routed is None else routed + r
    positions = windows.numel()
    kl = np.zeros((num_layers, NUM_PROJ))
    bar = tqdm(total=num_layers * NUM_PROJ, desc=f"KL calibration at {bits} bits", unit="group",
               disable=not progress)
    with bar:
        for layer in range(num_layers):
            for proj in range(NUM_PROJ):
                views.set(layer, proj, bits)
                total = 0.0
                for i, s in enumerate(range(0, windows.shape[0], batch)):
                    lp, _ = _log_probs(runner, windows[s:s + batch])
                    total += float((refs[i].exp() * (refs[i] - lp)).sum(dim=-1).double().sum())
                kl[layer, proj] = max(total / positions, 0.0)
                views.set(layer, proj, CEILING)
                bar.update(1)
    assert routed is not None
    return kl, routed.double().numpy() / positions


def kl_scales(cost: np.ndarray, kl: np.ndarray, routed_per_token: np.ndarray, bits_index: int) -> np.ndarray:
    """scale [L, 3] of the module doc; cost [L, E, 3, bits] (per routed token)."""
    predicted = np.einsum("le,lep->lp", routed_per_token, cost[..., bits_index])  # [L, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where((predicted > 0) & (kl > MIN_KL), kl / np.where(predicted > 0, predicted, 1.0), 0.0)
    return scale


def calibrated_table(cost: np.ndarray, scale: np.ndarray, top_k: int) -> np.ndarray:
    """table [L, E, 3, bits] in KL units (module doc)."""
    num_experts = cost.shape[1]
    return cost * scale[:, None, :, None] * (top_k / num_experts)


def view_scales(cost: np.ndarray, kl_by_bits: dict[int, np.ndarray], routed_per_token: np.ndarray,
                bits_axis: Sequence[int]) -> np.ndarray:
    """scale [L, 3, len(bits_axis)]: one per measured view (kl_by_bits: bits -> KL [L, 3]);
    views not measured, or measured as free, take the nearest measured view's
    scale (the lower one on a tie); the host-only slot (0) takes the lowest view's."""
    num_layers = cost.shape[0]
    scale = np.zeros((num_layers, NUM_PROJ, len(bits_axis)))
    for bits, kl in kl_by_bits.items():
        scale[..., bits_axis.index(bits)] = kl_scales(cost, kl, routed_per_token, bits_axis.index(bits))
    views = [b for b in bits_axis if b != 0]
    for layer in range(num_layers):
        for proj in range(NUM_PROJ):
            measured = [b for b in views if scale[layer, proj, bits_axis.index(b)] > 0]
            if not measured:
                continue
            for b in views:
                if b not in measured:
                    near = min(measured, key=lambda m: (abs(m - b), m))
                    scale[layer, proj, bits_axis.index(b)] = scale[layer, proj, bits_axis.index(near)]
    if 0 in bits_axis:
        scale[..., bits_axis.index(0)] = scale[..., bits_axis.index(min(views))]
    return scale


def calibrated_table_per_view(cost: np.ndarray, scale: np.ndarray, top_k: int) -> np.ndarray:
    """table [L, E, 3, bits] in KL units from per-view scales [L, 3, bits]; non-increasing in bits."""
    num_experts = cost.shape[1]
    table = cost * scale[:, None, :, :] * (top_k / num_experts)
    return np.maximum.accumulate(table[..., ::-1], axis=-1)[..., ::-1]
