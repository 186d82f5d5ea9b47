"""Token sampling: greedy, temperature, top-k, top-p, logit bias, repetition
penalties, structured output's grammar mask, per-request seeds.

Greedy rows are taken with one argmax (``greedy_tokens``: on CUDA one Triton
launch over the logits in their own dtype, kernels/row_argmax.py; a decode
graph runs it inside the graph and hands its picks to ``pick``). Every other
row draws, in float32, from its own
``torch.Generator`` (kept on the Sequence, on the logits' device), seeded with
the request's seed or, when it has none, from the sampler's own generator, so
a seeded request gives the same tokens whatever else shares its batches.
``pick`` leaves the tokens on the device without waiting for them (a step
queued behind can read them); ``sample`` is ``pick`` brought to the host.
"""

from __future__ import annotations

import torch

from dataplane.sequence import Sequence
from kernels.row_argmax import row_argmax, row_argmax_reference

MAX_SEED = torch.iinfo(torch.int64).max  # exclusive bound of drawn seeds


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Scaled logits with tokens outside top-k / the top-p nucleus set to -inf.

    logits: [V] float32. Returns [V] float32. Nucleus: the smallest set of most
    likely tokens whose probability reaches top_p (the top token always stays).
    """
    scaled = logits / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [V]
        # Drop a token when the tokens before it already reach top_p.
        drop_sorted = (cumulative - sorted_logits.softmax(dim=-1)) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def penalize(logits: torch.Tensor, generated: list[int], presence: float, frequency: float) -> torch.Tensor:
    """OpenAI's repetition penalties: logits [V] float32 less ``presence`` for
    every token among ``generated`` and ``frequency`` times its count there.
    Returns [V] float32 (``logits`` itself when nothing was generated)."""
    if not generated:
        return logits
    # non_blocking: no wait for the device's queued work (the ids come from a host list).
    ids = torch.tensor(generated, dtype=torch.int64).to(logits.device, non_blocking=True)
    counts = torch.bincount(ids, minlength=logits.shape[-1])[: logits.shape[-1]].float()  # [V]
    return logits - frequency * counts - presence * (counts > 0).float()


def bias_logits(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    """OpenAI's logit_bias: logits [V] float32 with ``bias``'s (token id,
    value) pairs added. Returns [V] float32 (``logits`` itself when empty)."""
    if not bias:
        return logits
    # non_blocking: no wait for the device's queued work (the pairs come from the host).
    ids = torch.tensor([token for token, _ in bias], dtype=torch.int64).to(logits.device, non_blocking=True)
    values = torch.tensor([value for _, value in bias], dtype=torch.float32).to(logits.device, non_blocking=True)
    return logits.index_add(0, ids, values)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] logits (any float dtype) -> [B] int64: each row's first index of
    its maximum, NaN never picked (kernels/row_argmax.py's contract). On CUDA
    one capturable launch; elsewhere plain torch."""
    if logits.is_cuda and logits.stride(-1) == 1:
        return row_argmax(logits)
    return row_argmax_reference(logits)


class Sampler:
    """Picks the next token of each sequence from its logits row."""

    def __init__(self, seed: int = 0) -> None:
        # Seeds requests that bring none (reproducible runs of the engine).
        self._seeder = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits: [B, V] float (float32 or the model's dtype), row i for seqs[i]. Returns B token ids."""
        return self.pick(logits, seqs).tolist()

    def pick(self, logits: torch.Tensor, seqs: list[Sequence], greedy: torch.Tensor | None = None) -> torch.Tensor:
        """[B] int64 token ids on the logits' device, queued without a host wait.

        logits: [B, V] float (float32 or the model's dtype), row i for
        seqs[i]. greedy: [B] int64, ``greedy_tokens(logits)`` when the caller
        has it already (a decode graph's picks), else computed here. One draw
        from each non-greedy sequence's generator per call, as ``sample``.
        """
        best = greedy_tokens(logits) if greedy is None else greedy  # [B]
        plain = [seq.sampling.greedy and not seq.sampling.adjusts_logits for seq in seqs]
        if all(plain):
            return best
        return torch.stack([best[i] if plain[i] else self._draw(logits[i], seq) for i, seq in enumerate(seqs)])

    def _draw(self, row: torch.Tensor, seq: Sequence) -> torch.Tensor:
        """A 0-d int64 token drawn from ``row`` with the sequence's generator
        (or its argmax when greedy), after the logit bias, the repetition
        penalties and the grammar's mask."""
        params = seq.sampling
        row = bias_logits(row.float(), params.logit_bias)
        if params.penalized:
            row = penalize(row, seq.output_token_ids, params.presence_penalty, params.frequency_penalty)
        if seq.grammar is not None:  # last: no bias or penalty lifts a forbidden token
            row = seq.grammar.mask(row)
        if params.greedy:
            return torch.argmax(row)
        if seq.generator is None:
            seed = params.seed
            if seed is None:
                seed = int(torch.randint(0, MAX_SEED, (), generator=self._seeder))
            seq.generator = torch.Generator(device=row.device).manual_seed(seed)
        probs = filter_logits(row, params.temperature, params.top_k, params.top_p).softmax(dim=-1)
        return torch.multinomial(probs, 1, generator=seq.generator)[0]
