"""Serving under memory pressure at real shapes: static 8-bit, static 4-bit
and the dynamic precision ladder in one memory budget.

One command (GPU), writes JSON and prints a short table last:

    python benchmarks/memory_pressure.py --preset mixtral-8x7b --out benchmarks/results/memory_pressure_h200.json
    python benchmarks/memory_pressure.py --model models/pw-moe-tiny --out ...   # a checkpoint instead

The budget: the arena (weights and KV cache share it) holds the experts at 8
bits plus the KV cache of ``--kv-seqs`` full sequences, nothing more.
``--requests`` requests (``--prompt-len`` prompt tokens, ``--max-tokens``
generated, ignore_eos) arrive at once (a burst) or, with ``--arrival-rate``,
as a seeded Poisson stream (the same arrival times in every case), under which
the load rises above and falls below what 8-bit experts leave room for. Cases:

* ``static-8``: experts stay at 8 bits; the scheduler can only hold what the
  KV room allows (the quality ceiling, the throughput floor);
* ``static-4``: experts stay at 4 bits; half the expert bytes go to KV;
* ``dynamic``: experts start at 8 bits and the dataplane walks its precision
  ladder (no controlplane: its local fallback order) as KV demand rises, then
  climbs back while a trickle of single short requests follows the burst;
* ``planned``: the same, following a real controlplane's ladders
  (benchmarks/pressure_cases.py says how it is run: its own process);
* ``planned-inline``: ``planned`` with the controlplane's server in the
  engine's process (what sharing the GIL with it costs);
* ``planned-floor``: ``planned`` with no block below ``--floor-bits``.

``--prompt-domains`` takes the prompts from the corpus's validation split
(``--tokens-dir``), so that the routing the controlplane plans from is that of
real text; otherwise prompts are arbitrary token ids. ``--history-requests``
serves that many requests first, in groups that fit next to 8-bit experts, so
that the controlplane's activity already holds the workload (a server that
has run a while); ``--planner`` overrides PlannerConfig fields (JSON) for the
planned cases. With a checkpoint and
``--quality-windows N``, each case's deepest state (every block's bits where
its mean bits were lowest during the burst) is scored afterwards on N test
windows per domain: KL to the all-8-bit model and perplexity
(benchmarks/quality_eval.py, CPU).

The watermarks are fractions of the arena (``--low-watermark`` /
``--high-watermark``, recorded). The dataplane's defaults, 5 % / 15 %, were
set on the default model; on a ~48 GB Mixtral arena 15 % holds ~7 GB free,
which no tight budget has. Pick ``--kv-seqs`` so that its KV room is above the
high watermark, or the dynamic case cannot climb back to all 8 bits at idle.

Each case runs in its own process: a Mixtral-8x7B build holds ~54 GB of pinned
host masters, and two at once do not fit the machine's host memory. A probe
process first builds the model once to count the arena pages the experts take
at 8 bits (the budget is exact, not estimated). On a GPU, a further process
then serves the burst's prompts for a few tokens each and is thrown away, so
that Triton's on-disk cache holds the kernels of the burst's shapes before
any case is timed (pressure_cases.warm_compile_cache: without it the first
case lost ~4 s in two steps to compilation (reversing the order moved the
loss with it, session 42), which made the
"20 %" planned-against-fallback gap of session 40; benchmarks/NOTES.md,
session 41).

Recorded per case: the burst's wall time and generated tokens per second,
time to first token (median, p90 and max, each from its request's submission),
preemptions, running requests (mean over steps, peak), the mean bits per
expert weight over the burst's steps (every block weighted by its weights) and
its minimum, the block bits at the deepest step and at ``--served-states``
quantiles of the tokens generated (with ``--quality-windows``: their KL, the
served KL being the mean over the quantile states, i.e. the KL of the
average token the burst produced; when static-8 ran, the same states are also
scored on its requests, prompt plus greedy continuation, counting the
generated tokens: the text a server of this workload serves, where the test
windows are the corpus's), where the time went (median and p90 wall time
of an engine iteration, the seconds spent in the precision controller's
hook), the demotions and promotions the burst took (and their bytes), and
for the dynamic cases the seconds until every block was back at 8 bits
during the trickle. Kernels are compiled
and graphs captured by a warm-up of short requests at the batch buckets before
anything is timed.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.pressure_cases import CASES, probe, run_case, warm_compile_cache  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.quality_eval import PagedModel, evaluate, load_domain_windows, mean_quality  # noqa: E402
from dataplane.kv_cache import blocks_for_tokens  # noqa: E402
from dataplane.profiling.corpus import corpus_domains  # noqa: E402
from models.train.lm_eval import IGNORE, EvalWindows  # noqa: E402

QUALITY_SEQ_LEN = 256
QUALITY_BATCH = 8
QUALITY_SPLIT = "test"


def child(args: argparse.Namespace) -> int:
    """One case (or the probe) in this process; its JSON goes to ``--row-out``.
    The dataplane's log (its warm-up rounds, the arena) goes to stderr."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.case == "probe":
        row = probe(args)
    elif args.case == "warm":
        row = warm_compile_cache(args, args.max_arena_pages)
    else:
        row = run_case(args, args.case, args.max_arena_pages)
    args.row_out.write_text(json.dumps(row, default=str))
    return 0


def run_child(argv: list[str], extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "row.json"
        subprocess.run([sys.executable, __file__, *argv, *extra, "--row-out", str(out)], check=True)
        return json.loads(out.read_text())


def served_text_windows(texts: list[list[int]], prompt_len: int) -> EvalWindows:
    """The static 8-bit case's requests (prompt + its greedy continuation) as windows whose
    counted positions are the generated tokens."""
    seqs = torch.tensor(texts, dtype=torch.int64)  # [requests, prompt + generated]
    targets = seqs[:, 1:].clone()
    targets[:, : prompt_len - 1] = IGNORE  # positions that predict prompt tokens
    return EvalWindows(seqs[:, :-1], targets)


def score_states(args: argparse.Namespace, rows: list[dict]) -> dict:
    """Scores each case's deepest state and its served states (KL to the 8-bit model,
    perplexity); the served KL is the mean over the token-quantile states."""
    paged = PagedModel(args.model, QUALITY_SEQ_LEN, QUALITY_BATCH)
    domains = corpus_domains(args.tokens_dir)
    windows = load_domain_windows(args.tokens_dir, domains, QUALITY_SPLIT, QUALITY_SEQ_LEN, args.quality_windows)
    distinct: dict[tuple[int, ...], str] = {}  # block bits -> config name (each state scored once)
    for row in rows:
        for bits in (row["deepest_block_bits"], *row["served_block_bits"]):
            distinct.setdefault(tuple(bits), f"state{len(distinct)}")
    configs = {name: np.asarray(bits).reshape(paged.bits().shape) for bits, name in distinct.items()}
    scored = {name: mean_quality(per_domain) for name, per_domain in evaluate(paged, windows, configs).items()}
    for row in rows:
        row["quality_at_deepest"] = scored[distinct[tuple(row["deepest_block_bits"])]]
        served = [scored[distinct[tuple(bits)]] for bits in row["served_block_bits"]]
        row["served_kl"] = float(np.mean([q["kl"] for q in served]))
        row["served_perplexity"] = float(np.mean([q["perplexity"] for q in served]))
    texts = next((row["served_token_ids"] for row in rows if "served_token_ids" in row), None)
    if texts is not None:
        on_text = evaluate(paged, {"served_text": served_text_windows(texts, args.prompt_len)}, configs)
        for row in rows:
            row["deepest_kl_on_served_text"] = on_text[distinct[tuple(row["deepest_block_bits"])]]["served_text"].kl
            row["served_kl_on_served_text"] = float(np.mean(
                [on_text[distinct[tuple(bits)]]["served_text"].kl for bits in row["served_block_bits"]]))
    return {"split": QUALITY_SPLIT, "windows_per_domain": args.quality_windows, "seq_len": QUALITY_SEQ_LEN,
            "states_scored": len(configs),
            "kl": "mean KL(p_8bit || p) per counted position, nats, mean over the domains "
                  "(benchmarks/quality_eval.py); served_kl: the mean over the token-quantile states",
            "served_text": "*_on_served_text: the same KL on the static 8-bit case's requests (prompt + "
                           "greedy continuation), counted on the generated tokens only"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="mixtral-8x7b", help="a synthetic model (dataplane/models/synthetic.py)")
    parser.add_argument("--model", help="a checkpoint folder instead of --preset")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--kv-seqs", type=int, default=16,
                        help="the budget's KV room next to 8-bit experts, in full sequences")
    parser.add_argument("--low-watermark", type=float, default=0.01)
    parser.add_argument("--high-watermark", type=float, default=0.03)
    parser.add_argument("--max-batched-tokens", type=int, default=4096)
    parser.add_argument("--cases", default="dynamic,static-4,static-8")
    parser.add_argument("--recovery-s", type=float, default=60.0,
                        help="dynamic cases: the longest the trickle after the burst may run")
    parser.add_argument("--arrival-rate", type=float, default=0.0,
                        help="requests a second, a seeded Poisson stream (0: all at once, one burst)")
    parser.add_argument("--history-requests", type=int, default=0,
                        help="requests served before the timed load, in groups that fit 8-bit experts "
                             "(the controlplane's activity then holds the workload's routing)")
    parser.add_argument("--planner", default="{}",
                        help="planned cases: PlannerConfig fields as JSON, over the defaults (A/B runs)")
    parser.add_argument("--floor-bits", type=int, default=4, help="planned-floor: the planner's default floor")
    parser.add_argument("--prompt-domains", default="",
                        help="comma list: prompts from these domains' validation windows (else arbitrary ids)")
    parser.add_argument("--tokens-dir", type=Path, default=Path("data/tokens"))
    parser.add_argument("--served-states", type=int, default=8,
                        help="block-bits states kept per case at the quantiles of the tokens generated")
    parser.add_argument("--quality-windows", type=int, default=0,
                        help="with --model: score each case's deepest state on this many test windows a domain")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu: a dry run of the script (tiny presets)")
    parser.add_argument("--compile-warm-up", action=argparse.BooleanOptionalAction, default=True,
                        help="on a GPU, fill Triton's cache with the burst's kernels before the cases (default on)")
    parser.add_argument("--engine-warm-up", action=argparse.BooleanOptionalAction, default=None,
                        help="the dataplane's start-up warm-up (dataplane/warmup.py; default: on a GPU)")
    parser.add_argument("--commit", default=None, help="commit of the measured tree (the GPU machine's .git is stale)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", choices=["probe", "warm", *CASES], help=argparse.SUPPRESS)  # child process
    parser.add_argument("--max-arena-pages", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--row-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case is None:
        if args.out is None:
            parser.error("--out is required")
        unknown = [c for c in args.cases.split(",") if c not in CASES]
        if unknown:
            parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
        if args.quality_windows and not args.model:
            parser.error("--quality-windows scores a checkpoint: give --model")
    return args


def main() -> int:
    args = parse_args()
    if args.case is not None:
        return child(args)
    common = [a for a in sys.argv[1:] if a not in ("--out", str(args.out))]
    shape = run_child(common, ["--case", "probe"])
    seq_pages = blocks_for_tokens(args.prompt_len + args.max_tokens, shape["kv_block_size"])
    budget_pages = shape["weight_pages_8bit"] + args.kv_seqs * seq_pages
    result = {
        "benchmark": "serving under memory pressure: static 8-bit, static 4-bit, dynamic precision",
        "command": " ".join(sys.argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else
        f"cpu, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "commit": git_commit(args.commit),
        "model": args.model or f"synthetic {args.preset}",
        "prompts": f"{args.prompt_domains} validation windows" if args.prompt_domains else "arbitrary token ids",
        "arrivals": f"Poisson, {args.arrival_rate:g} requests/s" if args.arrival_rate > 0 else "all at once",
        "planner_overrides": json.loads(args.planner),
        "history_requests": args.history_requests,
        "budget": {"arena_pages": budget_pages, "page_bytes": shape["page_bytes"],
                   "expert_pages_at_8_bits": shape["weight_pages_8bit"], "kv_pages_per_sequence": seq_pages,
                   "kv_seqs_next_to_8_bit_experts": args.kv_seqs,
                   "low_watermark": args.low_watermark, "high_watermark": args.high_watermark},
        "rows": [],
    }
    if args.compile_warm_up and args.device.startswith("cuda"):  # else Triton compiles for the first case alone
        result["compile_warm_up"] = run_child(common, ["--case", "warm", "--max-arena-pages", str(budget_pages)])
    for case in args.cases.split(","):
        result["rows"].append(run_child(common, ["--case", case, "--max-arena-pages", str(budget_pages)]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str))
    if args.quality_windows:
        result["quality"] = score_states(args, result["rows"])
        args.out.write_text(json.dumps(result, indent=2, default=str))
    print_table(args, shape, budget_pages, seq_pages, result)
    return 0


def print_table(args: argparse.Namespace, shape: dict, budget_pages: int, seq_pages: int, result: dict) -> None:
    print(f"\n{args.model or args.preset}: arena {budget_pages} pages of {shape['page_bytes'] / 2**10:.0f} KiB "
          f"(8-bit experts {shape['weight_pages_8bit']} + KV of {args.kv_seqs} x {seq_pages}); "
          f"{args.requests} requests x ({args.prompt_len} + {args.max_tokens}) tokens, {result['arrivals']}")
    print(f"{'case':14} {'tok/s':>8} {'s':>7} {'ttft med':>8} {'ttft p90':>8} {'preempt':>7} {'run mean':>8} "
          f"{'peak':>5} {'bits mean':>9} {'bits min':>8} {'recover s':>9} {'KL deep':>8} {'KL served':>9} "
          f"{'on text':>8} {'iter ms':>7} {'ctrl s':>6} {'demote':>6} {'promote':>7}")
    for r in result["rows"]:
        rec = r.get("recovery_seconds")
        kl = r.get("quality_at_deepest", {}).get("kl")
        served = r.get("served_kl")
        on_text = r.get("served_kl_on_served_text")
        print(f"{r['case']:14} {r['tok_per_s']:8.1f} {r['seconds']:7.2f} {r['first_token_s_median']:8.2f} "
              f"{r['first_token_s_p90']:8.2f} {r['preemptions']:7d} "
              f"{r['mean_running']:8.1f} {r['peak_running']:5d} {r['mean_expert_bits']:9.2f} "
              f"{r['min_expert_bits']:8.2f} {'-' if rec is None else f'{rec:.2f}':>9} "
              f"{'-' if kl is None else f'{kl:.4f}':>8} {'-' if served is None else f'{served:.4f}':>9} "
              f"{'-' if on_text is None else f'{on_text:.4f}':>8} {r['iteration_s_median'] * 1e3:7.1f} "
              f"{r['controller_s_total']:6.2f} {r['demotions']:6d} {r['promotions']:7d}")


if __name__ == "__main__":
    sys.exit(main())
