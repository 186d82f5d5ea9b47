"""Language-model evaluation on token streams: loss over non-overlapping
windows, and the experts each token is routed to.

Counting rule (shared by training-time validation and the report): a stream is
cut into windows of ``seq_len`` inputs; every position predicts the next token;
targets that are ``<|bos|>`` (the start of the next document, known from the
``<|end|>`` before it) are not counted. ``<|end|>`` targets are counted; they
carry no text bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

IGNORE = -100


@dataclass(frozen=True)
class EvalWindows:
    inputs: torch.Tensor  # [N, L] int64
    targets: torch.Tensor  # [N, L] int64, IGNORE where not counted

    @property
    def counted(self) -> int:
        return int((self.targets != IGNORE).sum())


def make_windows(stream: np.ndarray, seq_len: int, bos_id: int, max_windows: int | None = None) -> EvalWindows:
    """Non-overlapping windows over ``stream`` [n]; the last one padded."""
    tokens = torch.from_numpy(stream.astype(np.int64))  # [n]
    n_pred = tokens.numel() - 1
    n_win = (n_pred + seq_len - 1) // seq_len
    if max_windows is not None:
        n_win = min(n_win, max_windows)
    inputs = torch.full((n_win * seq_len,), bos_id, dtype=torch.int64)
    targets = torch.full((n_win * seq_len,), IGNORE, dtype=torch.int64)
    used = min(n_pred, n_win * seq_len)
    inputs[:used] = tokens[:used]
    targets[:used] = tokens[1:used + 1]
    targets[targets == bos_id] = IGNORE
    return EvalWindows(inputs.view(n_win, seq_len), targets.view(n_win, seq_len))


@torch.no_grad()
def nll_sum(model, windows: EvalWindows, batch_size: int, device: torch.device, autocast: bool) -> tuple[float, int]:
    """(sum of nats over counted targets, number counted)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for start in range(0, windows.inputs.shape[0], batch_size):
        inputs = windows.inputs[start:start + batch_size].to(device)  # [B, L]
        targets = windows.targets[start:start + batch_size].to(device)  # [B, L]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=inputs).logits  # [B, L, V]
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
        total += loss.double()
    return float(total), windows.counted


@torch.no_grad()
def expert_counts(model, windows: EvalWindows, batch_size: int, device: torch.device, top_k: int) -> torch.Tensor:
    """[layers, experts] int64: how many (token, slot) routings each expert got,
    over the positions whose target is counted (real tokens of the stream)."""
    counts = None
    for start in range(0, windows.inputs.shape[0], batch_size):
        inputs = windows.inputs[start:start + batch_size].to(device)  # [B, L]
        keep = (windows.targets[start:start + batch_size] != IGNORE).flatten().to(device)  # [B*L]
        out = model(input_ids=inputs, output_router_logits=True)
        per_layer = []
        for logits in out.router_logits:  # each [B*L, E]
            chosen = torch.topk(logits.float().softmax(-1), top_k, dim=-1).indices[keep]  # [n, K]
            per_layer.append(torch.bincount(chosen.flatten(), minlength=logits.shape[-1]))
        batch_counts = torch.stack(per_layer).cpu()  # [layers, E]
        counts = batch_counts if counts is None else counts + batch_counts
    return counts
