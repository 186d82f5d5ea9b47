"""Log-probabilities of generated tokens, for requests that ask for them.

Computed from the same logits row the token was picked from, under the
model's own distribution (log-softmax of the logits in float32, before
temperature, top-k and top-p: what OpenAI reports and vLLM does by default).
Only the rows of requests that asked are computed, so a batch without such
requests does no extra work. ``StepLogprobs`` holds one step's values as
tensors, first on the device (queued behind the pick, so a graph's logits
buffer may be overwritten by the next replay afterwards), then as host
copies; ``entries`` turns the host copies into one ``TokenLogprobs`` per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Most alternatives a request may ask for at each position (OpenAI's limit).
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated position: the picked token's log-probability and the
    `len(top_token_ids)` most likely tokens', most likely first."""

    logprob: float
    top_token_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


@dataclass(frozen=True)
class StepLogprobs:
    """The log-probabilities of some rows of a step's logits."""

    rows: list[int]  # row of each entry in the logits the step picked from
    top_n: list[int]  # alternatives each entry asked for (<= top_ids.shape[1])
    chosen: torch.Tensor  # [R] float32: log-probability of the picked token
    top_ids: torch.Tensor  # [R, N] int64: most likely tokens, N = max(top_n)
    top_values: torch.Tensor  # [R, N] float32: their log-probabilities

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> StepLogprobs:
        """The same entries with every tensor replaced by ``fn(tensor)`` (a host copy)."""
        return StepLogprobs(self.rows, self.top_n, fn(self.chosen), fn(self.top_ids), fn(self.top_values))

    def entries(self) -> list[TokenLogprobs]:
        """One entry per row, in ``rows`` order; the tensors must be on the host."""
        chosen, ids, values = self.chosen.tolist(), self.top_ids.tolist(), self.top_values.tolist()
        return [
            TokenLogprobs(chosen[i], tuple(ids[i][:n]), tuple(values[i][:n])) for i, n in enumerate(self.top_n)
        ]


def step_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_n: Sequence[int | None]
) -> StepLogprobs | None:
    """Log-probabilities of the rows whose ``top_n`` is not None, queued on
    the logits' device without a host wait; None when no row asks.

    logits: [S, V] float (float32 or the model's dtype). token_ids: [S] int64,
    the token picked from each row (on the logits' device). top_n[i]: how
    many alternatives row i wants, or None for no log-probabilities.
    """
    rows = [i for i, n in enumerate(top_n) if n is not None]
    if not rows:
        return None
    counts = [int(top_n[i]) for i in rows]  # type: ignore[arg-type]
    if len(rows) < logits.shape[0]:
        # non_blocking: no wait for the device (a graph step's picks are still queued).
        index = torch.tensor(rows, dtype=torch.int64).to(logits.device, non_blocking=True)
        logits, token_ids = logits.index_select(0, index), token_ids.index_select(0, index)
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # [R, V]
    chosen = log_probs.gather(1, token_ids[:, None])[:, 0]  # [R]
    top = torch.topk(log_probs, max(counts), dim=-1)  # values, indices: [R, N]
    return StepLogprobs(rows, counts, chosen, top.indices, top.values)
