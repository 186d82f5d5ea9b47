"""Renders REPORT.md for a trained model folder from its report.json,
train_log.json, the corpus manifest and a hand-written notes file.

    .venv/bin/python -m models.train.render_report --model models/pw-moe-tiny --notes models/train/report_notes.md

Every number in the tables is read from those JSON files; nothing is typed in.
The commit that holds the model is left as the placeholder ``<COMMIT>``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from models.train.routing_metrics import HOT_COVERAGE, experts_to_cover

COMMIT_PLACEHOLDER = "<COMMIT>"
REBUILD_COMMANDS = """\
# on the CPU machine (Debian 12; the builder apt-get installs python3.11-doc and manpages-de(-dev) if missing)
.venv/bin/python -m models.corpus.build_corpus            # data/corpus/ + models/corpus/manifest.json
.venv/bin/python -m models.train.train_tokenizer          # models/pw-moe-tiny/tokenizer{,_config}.json
.venv/bin/python -m models.train.tokenize_corpus          # data/tokens/ (xz uint16 streams, ~8 MB)
# on the GPU machine (run tool, carry=["data/tokens"]), then copy $OUT/model/* into models/pw-moe-tiny/
python3 models/train/train.py --config models/train/config.json --tokens data/tokens --out $OUT/model
python3 models/train/evaluate.py --model $OUT/model --tokens data/tokens --out $OUT/model/report.json
# back on the CPU machine
.venv/bin/python -m models.train.render_report --model models/pw-moe-tiny --notes models/train/report_notes.md"""


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def files_section(model_dir: Path) -> str:
    rows = [[f"`{p.name}`", f"{p.stat().st_size:,}"] for p in sorted(model_dir.iterdir())
            if p.is_file() and p.name != "REPORT.md"]
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    return "## Files\n\n" + _table(["file", "bytes"], rows) + f"\n\nWeights (all safetensors shards): {weights:,} bytes.\n"


def corpus_section(manifest: dict, report: dict) -> str:
    rows = []
    for domain, entry in manifest["domains"].items():
        sp = entry["splits"]
        tok = report["tokens"][domain]
        rows.append([domain, entry["description"],
                     *(f"{sp[s]['files']} / {sp[s]['bytes'] / 1e6:.2f} MB / {tok[s]['tokens']:,}"
                       for s in ("train", "validation", "test"))])
    return ("## Corpus\n\nBuilt by `models/corpus/build_corpus.py`; sources, package versions, hashes and the "
            "held-out file lists are in `models/corpus/manifest.json`. Split by file with a seeded hash; "
            "the tokenizer and the model saw only the train split, checkpoint selection only validation.\n\n"
            + _table(["domain", "source", "train files / text / tokens", "validation", "test"], rows) + "\n")


def training_section(log: dict) -> str:
    cfg, tc = log["config"], log["config"]["train"]
    m = cfg["model"]
    rate = log["tokens_seen"] / log["train_seconds"]
    facts = [
        ["architecture", f"Mixtral: hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, "
                         f"{m['num_local_experts']} experts top-{m['num_experts_per_tok']}, expert FFN "
                         f"{m['intermediate_size']}, {m['num_attention_heads']} heads / {m['num_key_value_heads']} KV "
                         f"heads (head_dim {m['head_dim']}), vocab {m['vocab_size']}, tied embeddings, "
                         f"rope_theta {m['rope_theta']:g}, context {m['max_position_embeddings']}"],
        ["parameters", f"{log['parameters']:,}"],
        ["seed", cfg["seed"]],
        ["batch", f"{tc['batch_sequences']} x {tc['seq_len']} tokens, equal share per domain"],
        ["optimizer", f"AdamW lr {tc['peak_lr']} (warmup {tc['warmup_steps']}, cosine to x{tc['min_lr_ratio']}), "
                      f"betas ({tc['beta1']}, {tc['beta2']}), wd {tc['weight_decay']}, clip {tc['grad_clip']}"],
        ["router balance", f"per-layer Switch loss x {m['router_aux_loss_coef']} (balance_loss.py)"],
        ["steps", f"{log['steps_run']} run ({log['steps_planned']} planned; time guard: "
                  f"{log['calibration']['seconds_per_step'] * 1e3:.0f} ms/step measured)"],
        ["tokens seen", f"{log['tokens_seen']:,} ({rate:,.0f} tokens/s)"],
        ["training wall time", f"{log['train_seconds']} s loop, {log['total_seconds']} s with loading and saving"],
        ["device", f"{log['device']}, torch {log['torch']}"],
        ["selected checkpoint", f"step {log['best_step']} (best mean validation loss "
                                f"{log['best_mean_validation_loss']:.4f})"],
    ]
    domains = list(log["evals"][0]["validation_loss"])
    curve = [[e["step"], *(f"{e['validation_loss'][d]:.4f}" for d in domains), f"{e['mean']:.4f}"]
             for e in log["evals"]]
    return ("## Training\n\n" + _table(["", ""], facts) + "\n\nValidation loss during training (nats/token, "
            "bf16 autocast):\n\n" + _table(["step", *domains, "mean"], curve) + "\n")


def quality_section(report: dict) -> str:
    rows = []
    for domain, per_split in report["quality"].items():
        v, t = per_split["validation"], per_split["test"]
        rows.append([domain, v["loss"], v["perplexity"], v["bits_per_byte"], t["loss"], t["perplexity"],
                     t["bits_per_byte"], f"{v['tokens']:,} / {t['tokens']:,}"])
    return ("## Quality (float32 compute on the stored bf16 weights)\n\n" + report["counting_rule"] + ".\n\n"
            + _table(["domain", "val loss", "val ppl", "val bits/byte", "test loss", "test ppl", "test bits/byte",
                      "tokens val / test"], rows) + "\n")


def usage_section(report: dict) -> str:
    usage = report["expert_usage"]
    n_experts = report["architecture"]["experts"]
    parts = [f"## Expert usage ({usage['split']} split)\n\nShare of each domain's (token, slot) routings per "
             f"expert, per layer (uniform = {100 / n_experts:.1f} %). Cold = below {usage['cold_share_threshold']:.0%}; "
             f"hot set = fewest experts that take {HOT_COVERAGE:.0%} of the domain's routings.\n"]
    for domain, d in usage["per_domain"].items():
        rows = []
        for layer, row in enumerate(d["fractions"]):
            hot = experts_to_cover(torch.tensor([row]))[0]
            rows.append([layer, *(f"{100 * x:.1f}" for x in row), d["cold_experts"][layer], hot])
        parts.append(f"**{domain}**\n\n" + _table(["layer", *(f"e{i} %" for i in range(n_experts)), "cold", "hot set"],
                                                  rows) + "\n")
    pairs = usage["js_divergence_bits"]
    layers = len(usage["mean_js_divergence_bits"])
    rows = [[pair.replace("|", " vs "), *(f"{x:.3f}" for x in v)] for pair, v in pairs.items()]
    rows.append(["**mean**", *(f"{x:.3f}" for x in usage["mean_js_divergence_bits"])])
    parts.append("Jensen-Shannon divergence between domains' usage distributions (bits; 0 = same, 1 = disjoint):\n\n"
                 + _table(["pair", *(f"layer {i}" for i in range(layers))], rows) + "\n")
    return "\n".join(parts)


def rtn_section(report: dict) -> str:
    rtn = report["rtn"]
    bits = list(rtn["bits"])
    parts = [f"## Static round-to-nearest curve\n\nEvery expert weight quantized with {rtn['scheme']}, group "
             f"{rtn['group']}; everything else as stored. Perplexity and its increase over the stored model:\n"]
    for split in ("test", "validation"):
        rows = []
        for domain, per_split in report["quality"].items():
            cells = [f"{rtn['bits'][b]['quality'][domain][split]['perplexity']:.3f} "
                     f"({rtn['bits'][b]['quality'][domain][split]['ppl_increase_pct']:+.1f} %)" for b in bits]
            rows.append([domain, f"{per_split[split]['perplexity']:.3f}", *cells])
        parts.append(f"**{split}**\n\n" + _table(["domain", "stored", *(f"{b} bit" for b in bits)], rows) + "\n")
    rows = [[f"{b} bit", f"{rtn['bits'][b]['mean_relative_weight_error']:.4f}"] for b in bits]
    parts.append("Mean relative weight error ||W - Q(W)|| / ||W|| over expert matrices:\n\n"
                 + _table(["width", "error"], rows) + "\n")
    return "\n".join(parts)


def render(model_dir: Path, manifest_path: Path, notes_path: Path | None) -> str:
    report = json.loads((model_dir / "report.json").read_text())
    log = json.loads((model_dir / "train_log.json").read_text())
    manifest = json.loads(manifest_path.read_text())
    header = (f"# {report['model']}: PagedWeight's own Mixtral-architecture MoE\n\n"
              f"Commit: `{COMMIT_PLACEHOLDER}` · evaluated {report['date_utc']} on {report['device']} "
              f"(torch {report['torch']}, transformers {report['transformers']}) · machine-readable: "
              f"`report.json`, `train_log.json`\n")
    notes = notes_path.read_text().strip() + "\n" if notes_path else ""
    sections = [header, notes, files_section(model_dir), corpus_section(manifest, report), training_section(log),
                quality_section(report), usage_section(report), rtn_section(report),
                "## Rebuild\n\n```sh\n" + REBUILD_COMMANDS + "\n```\n"]
    return "\n".join(s for s in sections if s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("models/pw-moe-tiny"))
    parser.add_argument("--manifest", type=Path, default=Path("models/corpus/manifest.json"))
    parser.add_argument("--notes", type=Path, default=None)
    args = parser.parse_args(argv)
    (args.model / "REPORT.md").write_text(render(args.model, args.manifest, args.notes))
    print(f"wrote {args.model / 'REPORT.md'}")


if __name__ == "__main__":
    main()
