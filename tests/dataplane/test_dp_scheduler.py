"""Scheduler: continuous batching, token budget, preemption, reclaim, abort.

Plain Python over an accounting-only arena (no tensors, no model).
"""

from __future__ import annotations

import torch

from dataplane.kv_cache import KVCacheManager
from dataplane.memory.arena import KV_TAG, Arena, PageTag
from dataplane.sampling_params import SamplingParams
from dataplane.scheduler import Scheduler, SchedulerConfig
from dataplane.sequence import FinishReason, Sequence, SequenceStatus

BLOCK = 4
EOS = frozenset({99})
TOKEN = 7  # what the fake model "samples"


def make(num_pages=16, max_seqs=8, budget=64, max_len=128, reclaim=None, prefix_caching=False) -> Scheduler:
    """Without the prefix cache unless asked: these prompts share their starts."""
    # One layer, one kv head, head_dim 1, fp32: a block is 4 * 2 * 4 = 32 bytes.
    arena = Arena(num_pages, 32, allocate_storage=False)
    kv = KVCacheManager(arena, BLOCK, num_layers=1, num_kv_heads=1, head_dim=1, dtype=torch.float32,
                        prefix_caching=prefix_caching)
    return Scheduler(SchedulerConfig(max_seqs, budget, max_len), kv, reclaim)


def seq(i: int, n_prompt: int, **sampling) -> Sequence:
    params = SamplingParams(**{"max_tokens": 100, **sampling})
    return Sequence(f"s{i}", list(range(10, 10 + n_prompt)), params, arrival=i)


def step(sched: Scheduler, token: int = TOKEN):
    out = sched.schedule()
    sampled = {item.seq.seq_id: token for item in out.scheduled if item.samples}
    finished = sched.update(out.scheduled, sampled, EOS)
    return out, finished


def shares(out) -> dict[str, int]:
    return {item.seq.seq_id: item.num_new_tokens for item in out.scheduled}


def test_requests_join_and_leave_the_running_batch():
    sched = make()
    a, b = seq(0, 5, max_tokens=3), seq(1, 3)
    sched.add(a)
    sched.add(b)
    out, _ = step(sched)
    assert shares(out) == {"s0": 5, "s1": 3}  # two prefills
    out, _ = step(sched)
    assert shares(out) == {"s0": 1, "s1": 1}  # two decodes
    c = seq(2, 6)
    sched.add(c)
    out, finished = step(sched)
    assert shares(out) == {"s0": 1, "s1": 1, "s2": 6}  # decodes and a prefill in one step
    assert finished == [a] and a.finish_reason == FinishReason.LENGTH
    assert a.output_token_ids == [TOKEN] * 3
    assert sched.kv.num_blocks("s0") == 0  # a's blocks are back
    out, _ = step(sched)
    assert shares(out) == {"s1": 1, "s2": 1}
    assert [s.seq_id for s in sched.running] == ["s1", "s2"]


def test_token_budget_chunks_long_prompts_and_samples_only_at_the_end():
    sched = make(budget=16)
    short, long = seq(0, 2), seq(1, 40)
    sched.add(short)
    sched.add(long)
    out = sched.schedule()
    assert shares(out) == {"s0": 2, "s1": 14}
    assert [item.samples for item in out.scheduled] == [True, False]
    sched.update(out.scheduled, {"s0": TOKEN}, EOS)
    assert long.num_computed_tokens == 14 and long.output_token_ids == []
    out, _ = step(sched)
    assert shares(out) == {"s0": 1, "s1": 15}
    out, _ = step(sched)
    assert shares(out) == {"s0": 1, "s1": 11}
    assert long.output_token_ids == [TOKEN]  # sampled once the prompt was complete
    assert out.num_tokens <= 16


def test_running_batch_is_capped_by_max_running_seqs():
    sched = make(max_seqs=2)
    for i in range(3):
        sched.add(seq(i, 2, max_tokens=2))
    out, _ = step(sched)
    assert set(shares(out)) == {"s0", "s1"}
    assert [s.seq_id for s in sched.waiting] == ["s2"]
    _, finished = step(sched)
    assert {s.seq_id for s in finished} == {"s0", "s1"}
    out, _ = step(sched)
    assert shares(out) == {"s2": 2}


def test_preemption_recomputes_the_latest_arrival_when_kv_runs_out():
    sched = make(num_pages=4)
    a, b = seq(0, 7), seq(1, 7)
    sched.add(a)
    sched.add(b)
    step(sched)  # prefills: 2 blocks each, pool full; both have 8 tokens now
    out, _ = step(sched)  # decode position 7 still fits in 2 blocks
    assert not out.preempted
    out, _ = step(sched)  # position 8 needs a third block for a
    assert out.preempted == [b]
    assert shares(out) == {"s0": 1}
    assert b.status == SequenceStatus.WAITING and b.num_computed_tokens == 0
    assert sched.kv.num_blocks("s1") == 0 and list(sched.waiting) == [b]
    assert b.output_token_ids == [TOKEN, TOKEN]  # kept: recomputed, not regenerated
    assert sched.preemptions_total == 1
    sched.abort("s0")
    out, _ = step(sched)  # b comes back and recomputes prompt + outputs in one prefill
    assert shares(out) == {"s1": 9}
    assert b.output_token_ids == [TOKEN] * 3


def test_reclaim_callback_runs_before_any_preemption():
    arena_pages = 6
    events: list[tuple[str, int]] = []
    holder: dict[str, list[int]] = {}

    def reclaim(n_pages: int) -> int:
        freed = holder["weights"][:n_pages]
        holder["weights"] = holder["weights"][n_pages:]
        sched.kv.arena.free(freed)
        events.append(("reclaim", n_pages))
        return len(freed)

    sched = make(num_pages=arena_pages, reclaim=reclaim)
    holder["weights"] = sched.kv.arena.alloc(2, PageTag("weight", 8))  # demotable weight pages
    a, b = seq(0, 7), seq(1, 7)
    sched.add(a)
    sched.add(b)
    step(sched)
    step(sched)  # 4 KV pages + 2 weight pages: full
    out, _ = step(sched)  # a and b each need a block: the weights give them back
    assert events == [("reclaim", 1), ("reclaim", 1)] and not out.preempted
    assert shares(out) == {"s0": 1, "s1": 1}
    assert holder["weights"] == [] and sched.kv.arena.snapshot().kv_pages == arena_pages
    # Positions 9..11 fit in the third blocks; at 12 a needs a fourth block.
    for _ in range(3):
        out, _ = step(sched)
        assert not out.preempted
    calls_before = len(events)
    out, _ = step(sched)
    assert events[calls_before:] == [("reclaim", 1)]  # asked first, got nothing
    assert out.preempted == [b] and sched.preemptions_total == 1


def test_admission_also_asks_for_pages_but_never_preempts():
    events: list[int] = []
    sched = make(num_pages=2, reclaim=lambda n: events.append(n) or 0)
    sched.add(seq(0, 6))  # 2 blocks, room for 8 tokens
    step(sched)
    sched.add(seq(1, 3))
    out, _ = step(sched)
    assert shares(out) == {"s0": 1}
    assert events == [1]  # s1 asked for a page before waiting
    assert not out.preempted and [s.seq_id for s in sched.waiting] == ["s1"]


def test_abort_frees_blocks_of_running_and_waiting_sequences():
    sched = make(num_pages=3, max_seqs=1)
    a, b = seq(0, 9), seq(1, 2)
    sched.add(a)
    sched.add(b)
    step(sched)
    assert sched.kv.used_blocks == 3 and list(sched.waiting) == [b]
    assert sched.abort("s0") is a
    assert a.finish_reason == FinishReason.ABORT and sched.kv.used_blocks == 0
    assert sched.kv.arena.free_pages == 3
    assert sched.abort("s1") is b and not sched.has_work()
    assert sched.abort("nope") is None


def test_sequences_the_arena_cannot_hold_alone_are_rejected():
    sched = make(num_pages=2)
    grower = seq(0, 8)
    sched.add(grower)
    step(sched)  # 8 prompt tokens fill both blocks; one token generated
    out, _ = step(sched)  # position 8 needs a third block that does not exist
    assert out.rejected == [grower] and grower.finish_reason == FinishReason.LENGTH
    assert sched.kv.used_blocks == 0
    huge = seq(1, 12)
    sched.add(huge)
    out, _ = step(sched)
    assert out.rejected == [huge] and huge.finish_reason == FinishReason.ABORT
    assert not sched.has_work()


def test_stop_conditions():
    sched = make(max_len=12)
    eos = seq(0, 2)
    stop = seq(1, 2, stop_token_ids=(55,))
    ignore = seq(2, 2, ignore_eos=True, max_tokens=2)
    long = seq(3, 9)  # context 12: stops after 3 generated tokens
    for s in (eos, stop, ignore, long):
        sched.add(s)
    out = sched.schedule()
    sampled = {"s0": 99, "s1": 55, "s2": 99, "s3": TOKEN}
    finished = sched.update(out.scheduled, sampled, EOS)
    assert {s.seq_id for s in finished} == {"s0", "s1"}
    assert eos.finish_reason == stop.finish_reason == FinishReason.STOP
    assert eos.output_token_ids == [99]  # the stop token is reported
    _, finished = step(sched)
    assert ignore in finished and ignore.finish_reason == FinishReason.LENGTH  # max_tokens
    _, finished = step(sched)
    assert finished == [long] and long.finish_reason == FinishReason.LENGTH
    assert long.num_tokens == 12


def test_kv_pages_carry_the_kv_tag():
    sched = make(num_pages=4)
    sched.add(seq(0, 5))
    step(sched)
    pages = sched.kv.block_table("s0")
    assert len(pages) == 2 and all(sched.kv.arena.tag_of(p) == KV_TAG for p in pages)


def test_schedule_ahead_is_the_next_decode_step_when_everyone_goes_on():
    sched = make(num_pages=4)
    a, b = seq(0, 3), seq(1, 2, max_tokens=3)
    sched.add(a)
    sched.add(b)
    step(sched)  # prefills: a holds 4 tokens, b 3
    out = sched.schedule()  # decode of positions 3 and 2
    ahead = sched.schedule_ahead(out.scheduled)
    assert ahead is not None
    assert [(i.seq.seq_id, i.start, i.num_new_tokens) for i in ahead] == [("s0", 4, 1), ("s1", 3, 1)]
    assert sched.kv.num_blocks("s0") == 2  # position 4 needed a second block, taken now
    assert not any(i.samples for i in ahead)  # until update appends this step's tokens
    sched.update(out.scheduled, {"s0": TOKEN, "s1": TOKEN}, EOS)
    assert all(i.samples for i in ahead)
    # The step after: b's next token is its last (max_tokens 3): no step ahead.
    assert sched.schedule_ahead(ahead) is None
    sched.update(ahead, {"s0": TOKEN, "s1": TOKEN}, EOS)
    assert b.finish_reason == FinishReason.LENGTH


def test_schedule_ahead_refuses_prefill_a_full_arena_and_waiting_requests():
    sched = make(num_pages=2)
    a = seq(0, 7)
    sched.add(a)
    out = sched.schedule()
    assert sched.schedule_ahead(out.scheduled) is None  # a prefill step
    sched.update(out.scheduled, {"s0": TOKEN}, EOS)
    out = sched.schedule()  # decode of position 7: a holds both blocks
    assert sched.kv.free_blocks == 0
    assert sched.schedule_ahead(out.scheduled) is None  # position 8 would need a third block
    sched2 = make(num_pages=2)
    b = seq(1, 3)
    sched2.add(b)
    step(sched2)  # b holds 1 block (4 tokens)
    out = sched2.schedule()
    sched2.add(seq(2, 1))
    assert sched2.schedule_ahead(out.scheduled) is None  # someone is waiting for admission


# -- the prefix cache --------------------------------------------------------------
def test_a_repeated_prompt_computes_only_what_the_cache_lacks():
    sched = make(prefix_caching=True)
    a = seq(0, 10, max_tokens=2)
    sched.add(a)
    step(sched)
    step(sched)  # a finishes; its two full prompt blocks stay cached
    assert a.is_finished and sched.kv.cached_blocks == 2
    b = Sequence("s1", list(a.prompt_token_ids) + [55], SamplingParams(max_tokens=2), arrival=1)
    sched.add(b)
    out, _ = step(sched)
    assert shares(out) == {"s1": 3} and out.scheduled[0].start == 8
    assert b.num_cached_prompt_tokens == 8 and sched.cached_tokens_total == 8
    # A block-aligned prompt still computes its last token (its logits pick the next one).
    c = Sequence("s2", list(a.prompt_token_ids[:8]), SamplingParams(max_tokens=2), arrival=2)
    sched.add(c)
    out, _ = step(sched)
    assert shares(out)["s2"] == 4 and c.num_cached_prompt_tokens == 4


def test_a_preempted_sequence_recomputes_only_its_uncached_tail():
    sched = make(num_pages=4, prefix_caching=True)
    a, b = seq(0, 7), Sequence("s1", list(range(50, 57)), SamplingParams(max_tokens=100), arrival=1)
    sched.add(a)
    sched.add(b)
    step(sched)
    step(sched)
    out, _ = step(sched)  # a needs a third block: b (the latest) is preempted
    assert out.preempted == [b] and b.num_tokens == 9
    sched.abort("s0")
    out, _ = step(sched)  # b's first block (tokens 0..3) was cached when it was freed
    assert shares(out) == {"s1": 5} and out.scheduled[0].start == 4
    assert b.num_cached_prompt_tokens == 0  # it had generated tokens: not a prompt hit


def test_prompt_logprobs_requests_compute_their_whole_prompt():
    sched = make(prefix_caching=True)
    a = seq(0, 10, max_tokens=1)
    sched.add(a)
    step(sched)
    b = seq(1, 10, max_tokens=1, prompt_logprobs=0)
    sched.add(b)
    out, _ = step(sched)
    assert shares(out) == {"s1": 10} and sched.cached_tokens_total == 0


def test_a_waiting_sequence_holds_no_cached_pages():
    sched = make(num_pages=4, prefix_caching=True)
    a = seq(0, 8, max_tokens=1)
    sched.add(a)
    step(sched)  # a's two blocks are cached now, and free
    blocker = Sequence("s9", list(range(70, 81)), SamplingParams(max_tokens=100), arrival=1)
    sched.add(blocker)
    step(sched)  # takes three pages: a cached block is evicted
    b = seq(2, 12)  # its first block is still cached, but it needs 3 pages and 1 is free
    sched.add(b)
    out, _ = step(sched)
    assert "s2" not in shares(out) and b.status == SequenceStatus.WAITING
    assert sched.kv.num_blocks("s2") == 0 and b.num_computed_tokens == 0
    assert sched.kv.cached_blocks == 1 and sched.cached_tokens_total == 0


def test_choices_of_one_prompt_compute_it_once():
    sched = make(prefix_caching=True)
    choices = [Sequence(f"c{i}", list(range(10, 20)), SamplingParams(max_tokens=4), arrival=i) for i in range(4)]
    for choice in choices:
        sched.add(choice)
    out, _ = step(sched)
    assert shares(out) == {"c0": 10}  # the others wait for its blocks
    out, _ = step(sched)
    assert shares(out) == {"c0": 1, "c1": 2, "c2": 2, "c3": 2}  # two full blocks attached each
    assert sched.cached_tokens_total == 3 * 8
    plain = make(prefix_caching=False)
    for i in range(4):
        plain.add(Sequence(f"c{i}", list(range(10, 20)), SamplingParams(max_tokens=4), arrival=i))
    out, _ = step(plain)
    assert shares(out) == {f"c{i}": 10 for i in range(4)}


def test_admission_waits_only_for_blocks_it_could_attach():
    sched = make(prefix_caching=True)
    sched.add(seq(0, 10))
    sched.add(Sequence("other", list(range(50, 60)), SamplingParams(max_tokens=4), arrival=1))
    sched.add(Sequence("short", list(range(10, 14)), SamplingParams(max_tokens=4), arrival=2))
    out, _ = step(sched)
    # A different prompt shares nothing; a 4-token prompt has no block it could attach.
    assert shares(out) == {"s0": 10, "other": 10, "short": 4}
