"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds.

Greedy rows are taken with one argmax. Every other row draws from its own
``torch.Generator`` (kept on the Sequence), seeded with the request's seed or,
when it has none, from the sampler's own generator, so a seeded request
gives the same tokens whatever else shares its batches.
"""

from __future__ import annotations

import torch

from dataplane.sequence import Sequence

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


class Sampler:
    """Picks the next token of each sequence from its logits row."""

    def __init__(self, seed: int = 0) -> None:
        # Seeds requests that bring none (reproducible runs of the engine).
        self._seeder = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits: [B, V] float32, row i for seqs[i]. Returns B token ids."""
        tokens: list[int | None] = [None] * len(seqs)
        greedy = [i for i, seq in enumerate(seqs) if seq.sampling.greedy]
        if greedy:
            rows = logits if len(greedy) == len(seqs) else logits[greedy]  # no index upload when all are greedy
            picks = rows.argmax(dim=-1).tolist()
            for i, token in zip(greedy, picks):
                tokens[i] = token
        for i, seq in enumerate(seqs):
            if tokens[i] is None:
                tokens[i] = self._draw(logits[i], seq)
        return [int(t) for t in tokens]  # type: ignore[arg-type]

    def _draw(self, row: torch.Tensor, seq: Sequence) -> int:
        params = seq.sampling
        if seq.generator is None:
            seed = params.seed
            if seed is None:
                seed = int(torch.randint(0, MAX_SEED, (), generator=self._seeder))
            seq.generator = torch.Generator(device=row.device).manual_seed(seed)
        probs = filter_logits(row, params.temperature, params.top_k, params.top_p).softmax(dim=-1)
        return int(torch.multinomial(probs, 1, generator=seq.generator))
