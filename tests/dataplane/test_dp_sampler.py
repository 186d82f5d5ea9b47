"""Sampler: greedy, seeds, top-k and top-p support."""

from __future__ import annotations

import torch

from dataplane.sampler import Sampler, bias_logits, filter_logits, greedy_tokens, penalize
from dataplane.sampling_params import SamplingParams
from dataplane.sequence import Sequence

VOCAB = 50
DRAWS = 200


def seqs(params: SamplingParams, n: int = 1) -> list[Sequence]:
    return [Sequence(f"s{i}", [1], params, arrival=i) for i in range(n)]


def logits(seed: int = 0, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def draw_many(params: SamplingParams, row: torch.Tensor, n: int = DRAWS) -> list[int]:
    sampler, seq = Sampler(seed=1), seqs(params)
    return [sampler.sample(row[None], seq)[0] for _ in range(n)]


def test_greedy_is_argmax_and_deterministic():
    x = logits(rows=4)
    want = x.argmax(dim=-1).tolist()
    for seed in (0, 1):
        assert Sampler(seed).sample(x, seqs(SamplingParams(), 4)) == want


def test_same_seed_same_tokens_different_seed_different_tokens():
    x = logits()[0]
    a = draw_many(SamplingParams(temperature=1.0, seed=42), x, 30)
    b = draw_many(SamplingParams(temperature=1.0, seed=42), x, 30)
    c = draw_many(SamplingParams(temperature=1.0, seed=43), x, 30)
    assert a == b and a != c


def test_seeded_request_ignores_its_batch_neighbours():
    x = logits(rows=3)
    params = SamplingParams(temperature=0.8, seed=7)
    alone_sampler, alone = Sampler(0), seqs(params)
    alone_tokens = [alone_sampler.sample(x[1:2], alone)[0] for _ in range(10)]
    mixed_sampler = Sampler(5)
    batch = [Sequence("n0", [1], SamplingParams(temperature=1.0), 0), seqs(params)[0],
             Sequence("n2", [1], SamplingParams(), 2)]
    mixed_tokens = [mixed_sampler.sample(x, batch)[1] for _ in range(10)]
    assert alone_tokens == mixed_tokens


def test_top_k_restricts_the_support():
    x = logits()[0]
    allowed = set(torch.topk(x, 3).indices.tolist())
    tokens = draw_many(SamplingParams(temperature=5.0, top_k=3), x)
    assert set(tokens) <= allowed and len(set(tokens)) == 3  # hot: all three appear
    assert set(draw_many(SamplingParams(temperature=1.0, top_k=1), x, 20)) == {int(x.argmax())}


def test_top_p_keeps_the_smallest_nucleus():
    x = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = torch.isfinite(filter_logits(x, 1.0, 0, 0.7)).tolist()
    assert kept == [True, True, False, False]  # 0.5 < 0.7 <= 0.5 + 0.3
    kept = torch.isfinite(filter_logits(x, 1.0, 0, 0.5)).tolist()
    assert kept == [True, False, False, False]
    assert torch.isfinite(filter_logits(x, 1.0, 0, 0.01)).sum() == 1  # the top token always stays
    wide = logits()[0]
    probs = wide.softmax(-1)
    order = probs.argsort(descending=True)
    nucleus = set(order[: int((probs[order].cumsum(0) < 0.6).sum()) + 1].tolist())
    tokens = draw_many(SamplingParams(temperature=1.0, top_p=0.6), wide)
    assert set(tokens) <= nucleus


def test_invalid_sampling_values_are_named():
    bad = [
        SamplingParams(temperature=-0.1),
        SamplingParams(temperature=float("nan")),
        SamplingParams(top_p=1.5),
        SamplingParams(top_p=0.0),
        SamplingParams(top_k=-1),
        SamplingParams(max_tokens=0),
        SamplingParams(stop_token_ids=(VOCAB,)),
        SamplingParams(presence_penalty=2.5),
        SamplingParams(frequency_penalty=float("inf")),
        SamplingParams(logprobs=21),
        SamplingParams(logit_bias=((VOCAB, 1.0),)),
        SamplingParams(logit_bias=((3, 100.5),)),
        SamplingParams(logit_bias=((3, float("nan")),)),
        SamplingParams(logit_bias=tuple((t % VOCAB, 1.0) for t in range(301))),
    ]
    for params in bad:
        try:
            params.validate(VOCAB)
        except ValueError:
            continue
        raise AssertionError(f"accepted {params}")
    SamplingParams(temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=(3,)).validate(VOCAB)
    SamplingParams(logit_bias=((0, -100.0), (VOCAB - 1, 100.0))).validate(VOCAB)


def mixed_batch() -> tuple[list[Sequence], list[Sequence]]:
    """A greedy, a top-p and a top-k sequence (seeded), and fresh twins of them."""
    mixed = [
        Sequence("g", [1], SamplingParams(), arrival=0),
        Sequence("t", [1], SamplingParams(temperature=0.9, top_p=0.8, seed=11), arrival=1),
        Sequence("k", [1], SamplingParams(temperature=1.3, top_k=5, seed=12), arrival=2),
    ]
    return mixed, [Sequence(s.seq_id, [1], s.sampling, arrival=s.arrival) for s in mixed]


def test_pick_keeps_tokens_on_the_device_and_agrees_with_sample():
    rows = logits(seed=3, rows=3)
    mixed, twins = mixed_batch()
    a, b = Sampler(seed=1), Sampler(seed=1)
    for _ in range(20):  # each call draws once from each generator, on both paths
        picked = a.pick(rows, mixed)
        assert isinstance(picked, torch.Tensor) and picked.shape == (3,) and picked.dtype == torch.int64
        assert picked.tolist() == b.sample(rows, twins)
    assert picked[0].item() == rows[0].argmax().item()


def test_bf16_logits_sample_as_their_float32_cast():
    # A decode graph hands the sampler its logits in the model's dtype; the
    # cast to float32 is exact, so greedy picks and seeded draws must equal
    # those from the float32 logits.
    rows = logits(seed=5, rows=3).to(torch.bfloat16)
    batch, twins = mixed_batch()
    a, b = Sampler(seed=1), Sampler(seed=1)
    for _ in range(10):
        assert a.sample(rows, batch) == b.sample(rows.float(), twins)
    assert greedy_tokens(rows).tolist() == rows.float().argmax(dim=-1).tolist()


def test_pick_takes_the_callers_greedy_picks():
    rows = logits(seed=6, rows=2)
    given = torch.tensor([7, 3])  # not the argmax: the sampler must use them as they are
    greedy_only = seqs(SamplingParams(), 2)
    assert Sampler(0).pick(rows, greedy_only, given).tolist() == [7, 3]
    mixed = [greedy_only[0], Sequence("t", [1], SamplingParams(temperature=1.0, seed=4), arrival=1)]
    twin = [greedy_only[0], Sequence("t", [1], SamplingParams(temperature=1.0, seed=4), arrival=1)]
    picked = Sampler(0).pick(rows, mixed, given)
    assert picked[0].item() == 7 and picked[1].item() == Sampler(0).pick(rows, twin)[1].item()


def test_greedy_tokens_never_pick_nan():
    x = logits(rows=2)
    x[0, 4] = float("nan")
    x[0, 9] = 100.0
    x[1] = float("nan")
    assert greedy_tokens(x).tolist() == [9, 0]


def test_penalties_lower_the_generated_tokens_logits():
    row = logits()[0]  # [V]
    generated = [4, 9, 4, 4]
    got = penalize(row, generated, presence=0.5, frequency=0.25)
    want = row.clone()
    want[4] -= 0.5 + 3 * 0.25
    want[9] -= 0.5 + 1 * 0.25
    assert torch.equal(got, want)
    assert penalize(row, [], 1.0, 1.0) is row


def test_greedy_with_a_penalty_avoids_what_it_generated():
    row = logits(seed=3)  # [1, V]
    top = int(row.argmax())
    seq = Sequence("p", [1], SamplingParams(frequency_penalty=2.0), arrival=0)
    seq.output_token_ids = [top] * 50  # lowers the favourite by 100
    runner_up = int(row[0].topk(2).indices[1])
    assert Sampler().sample(row, [seq]) == [runner_up]
    plain = Sequence("q", [1], SamplingParams(), arrival=1)
    plain.output_token_ids = [top] * 50
    assert Sampler().sample(row, [plain]) == [top]  # no penalty, no effect


def test_logit_bias_adds_to_the_listed_tokens_only():
    row = logits()[0]  # [V]
    got = bias_logits(row, ((2, 1.5), (7, -100.0)))
    want = row.clone()
    want[2] += 1.5
    want[7] -= 100.0
    assert torch.equal(got, want)
    assert bias_logits(row, ()) is row


def test_logit_bias_steers_greedy_and_sampled_picks():
    row = logits(seed=5)  # [1, V]
    top, runner_up = row[0].topk(2).indices.tolist()
    banned = Sequence("g", [1], SamplingParams(logit_bias=((top, -100.0),)), arrival=0)
    assert Sampler().sample(row, [banned]) == [runner_up]
    forced_token = int(row.argmin())
    for seed in range(5):
        forced = Sequence(f"s{seed}", [1], SamplingParams(temperature=1.0, seed=seed,
                                                          logit_bias=((forced_token, 100.0),)), arrival=0)
        assert Sampler().sample(row, [forced]) == [forced_token]
    plain = Sequence("p", [1], SamplingParams(), arrival=1)
    # A biased row beside a plain one: each row keeps its own rule.
    assert Sampler().sample(row.repeat(2, 1), [banned, plain]) == [runner_up, top]
