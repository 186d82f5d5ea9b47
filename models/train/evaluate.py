"""Evaluates a trained pw-moe-tiny folder; writes the report JSON.

    python3 models/train/evaluate.py --model models/pw-moe-tiny --tokens data/tokens --out models/pw-moe-tiny/report.json

Measures, per domain (float32 compute on the stored weights, transformers'
eager experts, windows of ``--seq-len`` tokens, counting rule in lm_eval.py):
* validation and test loss (nats/token), perplexity, bits per byte
  (total nats / UTF-8 text bytes / ln 2);
* expert usage per layer on the validation split, cold experts (< 5 % of the
  domain's routings) and the Jensen-Shannon divergence between domains;
* the same losses with every expert weight round-to-nearest quantized
  (rtn.py; uniform 8, 6, 4, 3, 2 bits, group 128) — attention, router,
  embeddings and norms stay as stored.

``--max-windows N`` evaluates only the first N windows per split (a CPU smoke
test); bits per byte are then pro-rated and the report says ``partial``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script on the GPU machine: make `models.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.train.lm_eval import EvalWindows, expert_counts, make_windows, nll_sum  # noqa: E402
from models.train.routing_metrics import usage_report  # noqa: E402
from models.train.rtn import GROUP, expert_parameters, quantize_experts_  # noqa: E402
from models.train.tokenize_corpus import load_meta, load_stream  # noqa: E402

EVAL_SPLITS = ("validation", "test")
RTN_BITS = (8, 6, 4, 3, 2)
LN2 = math.log(2)


def split_metrics(nats: float, counted: int, text_bytes: float) -> dict:
    loss = nats / counted
    return {"loss": round(loss, 5), "perplexity": round(math.exp(loss), 4),
            "bits_per_byte": round(nats / text_bytes / LN2, 5), "tokens": counted}


def evaluate_quality(model, windows: dict, byte_counts: dict, batch: int, device) -> dict:
    """{domain: {split: metrics}} for the model as it is now."""
    result = {}
    for domain, per_split in windows.items():
        result[domain] = {}
        for split, win in per_split.items():
            nats, counted = nll_sum(model, win, batch, device, autocast=False)
            result[domain][split] = split_metrics(nats, counted, byte_counts[domain][split])
    return result


def _byte_counts(meta: dict, windows: dict[str, dict[str, EvalWindows]], full: dict) -> dict:
    """Text bytes per split, pro-rated by the counted tokens when windows are limited."""
    out = {}
    for domain, per_split in windows.items():
        out[domain] = {}
        for split, win in per_split.items():
            share = win.counted / full[domain][split]
            out[domain][split] = meta["domains"][domain][split]["text_bytes"] * share
    return out


def expert_share(model) -> dict:
    experts = sum(p.numel() for p in expert_parameters(model).values())
    total = sum(p.numel() for p in model.parameters())
    return {"expert_parameters": experts, "total_parameters": total, "expert_fraction": round(experts / total, 4)}


def run(args) -> dict:
    from transformers import MixtralForCausalLM

    device = torch.device(args.device)
    meta = load_meta(args.tokens)
    domains = list(meta["domains"])
    model = MixtralForCausalLM.from_pretrained(args.model, dtype=torch.float32, experts_implementation="eager")
    model.to(device).eval()
    cfg = model.config
    windows, full_counts = {}, {}
    for d in domains:
        windows[d], full_counts[d] = {}, {}
        for split in EVAL_SPLITS:
            stream = load_stream(args.tokens, d, split)
            windows[d][split] = make_windows(stream, args.seq_len, meta["bos_id"], args.max_windows)
            full_counts[d][split] = make_windows(stream, args.seq_len, meta["bos_id"]).counted
    byte_counts = _byte_counts(meta, windows, full_counts)
    partial = args.max_windows is not None
    t0 = time.time()
    log_file = Path(args.model) / "train_log.json"
    name = json.loads(log_file.read_text())["config"]["name"] if log_file.is_file() else Path(args.model).name
    report: dict = {
        "model": name,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "eval_dtype": "float32 compute on the stored weights",
        "seq_len": args.seq_len,
        "partial": partial,
        "counting_rule": "non-overlapping windows; every next token counted except <|bos|> targets; "
                         "<|end|> counted; bits/byte = nats / UTF-8 text bytes / ln 2",
        "architecture": {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                         "layers": cfg.num_hidden_layers, "experts": cfg.num_local_experts,
                         "top_k": cfg.num_experts_per_tok, "vocab_size": cfg.vocab_size, **expert_share(model)},
        "tokens": {d: {s: meta["domains"][d][s] for s in ("train", *EVAL_SPLITS)} for d in domains},
    }
    base = evaluate_quality(model, windows, byte_counts, args.batch, device)
    report["quality"] = base
    counts = {d: expert_counts(model, windows[d]["validation"], args.batch, device, cfg.num_experts_per_tok)
              for d in domains}
    report["expert_usage"] = {"split": "validation", **usage_report(counts)}
    original = {name: p.detach().clone() for name, p in expert_parameters(model).items()}
    rtn = {"group": GROUP, "scheme": "asymmetric min-max round-to-nearest along the input dim; experts only",
           "bits": {}}
    for bits in RTN_BITS:
        errors = quantize_experts_(model, bits)
        quality = evaluate_quality(model, windows, byte_counts, args.batch, device)
        for domain, per_split in quality.items():
            for split, m in per_split.items():
                m["ppl_increase_pct"] = round(100 * (m["perplexity"] / base[domain][split]["perplexity"] - 1), 3)
        rtn["bits"][str(bits)] = {"mean_relative_weight_error": round(sum(errors.values()) / len(errors), 5),
                                  "quality": quality}
        with torch.no_grad():
            for name, p in expert_parameters(model).items():
                p.data.copy_(original[name])
        print(f"[eval] RTN {bits} bits done ({time.time() - t0:.1f} s)", flush=True)
    report["rtn"] = rtn
    report["eval_seconds"] = round(time.time() - t0, 1)
    return report


def summary_table(report: dict) -> str:
    """A short plain-text table (test split): ppl at full precision and under RTN."""
    bits = list(report["rtn"]["bits"])
    lines = [f"{'domain':<9} {'test ppl':>9} {'bpb':>6} " + " ".join(f"{b + 'b':>8}" for b in bits)]
    for domain, per_split in report["quality"].items():
        test = per_split["test"]
        cells = [f"{report['rtn']['bits'][b]['quality'][domain]['test']['ppl_increase_pct']:>+7.1f}%" for b in bits]
        lines.append(f"{domain:<9} {test['perplexity']:>9.3f} {test['bits_per_byte']:>6.3f} " + " ".join(cells))
    lines.append("mean JS divergence per layer (bits): " + " ".join(
        f"{x:.3f}" for x in report["expert_usage"]["mean_js_divergence_bits"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(summary_table(report))


if __name__ == "__main__":
    main()
