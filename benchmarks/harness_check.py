"""EleutherAI's lm-evaluation-harness against the served model (CPU, ~10 min).

Evaluation tools score a model through /v1/completions with echo + logprobs
(the prompt's log-probabilities). This runs the harness's `local-completions`
backend against the three-process stack at static expert precisions, and its
`hf` backend (transformers, float32) on the same checkpoint as the reference,
on two local tasks built from this Python's standard library source (the
default model was trained on Python source): a two-way multiple choice of
the true end of a line against another line's end (accuracy), and the
rolling log-likelihood of whole blocks of lines (bits per byte).

lm-eval is not a project dependency: install it in a venv of its own and
pass its `lm_eval` command (it needs no network with the local tasks):

    python3 -m venv /tmp/lmenv && /tmp/lmenv/bin/pip install torch==2.13.0 \
        "lm-eval[api]==0.4.13" transformers accelerate
    .venv/bin/python benchmarks/harness_check.py --lm-eval /tmp/lmenv/bin/lm_eval

Both backends get the tokenizer's BOS in front (`add_bos_token=True`): the
harness's API backend leaves it out by default, the model was trained with
it, and the two backends only compare on the same tokens. Writes JSON.
"""

from __future__ import annotations

import argparse
import email
import hashlib
import json
import os
import random
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.provenance import cpu_header  # noqa: E402
from launcher.processes import DEFAULT_MODEL, Stack, loopback_stack_config  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SOURCE_PACKAGE = Path(email.__file__).parent  # this Python's email package: real source, ~4700 usable lines
CHOICE_ITEMS = 400
ROLLING_DOCS = 40
LINES_PER_DOC = 10
LINE_CHARS = (30, 80)  # lines of this length make the multiple-choice items
SEED = 0
TASKS = "pw_code_mc,pw_code_ppl"
METRICS = {"pw_code_mc": "acc,none", "pw_code_ppl": "bits_per_byte,none"}


def source_lines() -> tuple[list[str], str]:
    """Lines of code (not comments) of the source package, shuffled; and a digest of the files read."""
    digest = hashlib.sha256()
    lines = []
    for path in sorted(SOURCE_PACKAGE.glob("*.py")):
        text = path.read_text()
        digest.update(text.encode())
        lines += [line.rstrip() for line in text.splitlines()]
    lines = [line for line in lines if LINE_CHARS[0] <= len(line) <= LINE_CHARS[1] and not line.lstrip().startswith("#")]
    random.Random(SEED).shuffle(lines)
    return lines, digest.hexdigest()[:16]


def write_tasks(folder: Path) -> str:
    """The two task YAMLs and their JSONL data under `folder`; returns the sources' digest."""
    lines, digest = source_lines()
    rng = random.Random(SEED)
    with open(folder / "code_mc.jsonl", "w") as out:
        for i in range(CHOICE_ITEMS):
            true, other = lines[i], lines[CHOICE_ITEMS + i]
            cut = len(true) * 2 // 3
            choices, label = [true[cut:], other[len(other) * 2 // 3 :]], 0
            if rng.random() < 0.5:
                choices, label = choices[::-1], 1
            out.write(json.dumps({"context": true[:cut], "choices": choices, "label": label}) + "\n")
    start = 2 * CHOICE_ITEMS
    with open(folder / "code_ppl.jsonl", "w") as out:
        for k in range(ROLLING_DOCS):
            block = lines[start + k * LINES_PER_DOC : start + (k + 1) * LINES_PER_DOC]
            out.write(json.dumps({"text": "\n".join(block)}) + "\n")
    data = {"mc": folder / "code_mc.jsonl", "ppl": folder / "code_ppl.jsonl"}
    (folder / "pw_code_mc.yaml").write_text(
        f"task: pw_code_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data['mc']}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\nmetric_list:\n  - metric: acc\n"
    )
    (folder / "pw_code_ppl.yaml").write_text(
        f"task: pw_code_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data['ppl']}\n"
        "test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: bits_per_byte\n"
    )
    return digest


def run_harness(lm_eval: str, folder: Path, model: str, model_args: str, tag: str) -> dict:
    """One harness run over both tasks; {task: metric value}."""
    out = folder / f"out_{tag}"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [lm_eval, "run", "--model", model, "--model_args", model_args, "--tasks", TASKS,
               "--include_path", str(folder), "--output_path", str(out)]
    if model == "hf":
        command += ["--device", "cpu"]
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    (results,) = list(out.rglob("results_*.json"))
    scores = json.loads(results.read_text())["results"]
    return {task: scores[task][metric] for task, metric in METRICS.items()}


def harness_version(lm_eval: str) -> str:
    """lm-eval's version as installed beside the `lm_eval` command."""
    python = Path(lm_eval).parent / "python"
    query = "import importlib.metadata as m; print(m.version('lm-eval'))"
    found = subprocess.run([str(python), "-c", query], capture_output=True, text=True)
    return f"lm-eval {found.stdout.strip() or 'unknown'}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lm-eval", required=True, help="the lm_eval command of a venv that has lm-eval[api]")
    parser.add_argument("--bits", default="8,4,3,2", help="static expert bits to serve, comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS / "harness_check_cpu.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        digest = write_tasks(folder)
        tokenizer = str(DEFAULT_MODEL)
        reference = run_harness(
            args.lm_eval, folder, "hf", f"pretrained={DEFAULT_MODEL},dtype=float32,add_bos_token=True", "hf"
        )
        served = {}
        for bits in [int(b) for b in args.bits.split(",")]:
            static = ["--static-precision", "--initial-expert-bits", str(bits)]
            stack = Stack(loopback_stack_config(DEFAULT_MODEL, folder / f"stack{bits}", secrets.token_urlsafe(16),
                                                extra_dataplane_args=static))
            stack.start()
            try:
                model_args = (f"model={DEFAULT_MODEL.name},base_url={stack.cfg.gateway_url}/v1/completions,"
                              f"tokenizer={tokenizer},tokenized_requests=True,num_concurrent=1,add_bos_token=True")
                served[bits] = run_harness(args.lm_eval, folder, "local-completions", model_args, f"served{bits}")
            finally:
                stack.stop()
            print(f"served at {bits} bits: {served[bits]} (transformers float32: {reference})", flush=True)
    result = {
        "benchmark": "lm-evaluation-harness through /v1/completions (echo + logprobs) against transformers",
        **cpu_header("benchmarks/harness_check.py", argv),
        "model": str(DEFAULT_MODEL.relative_to(DEFAULT_MODEL.parents[1])),
        "harness": harness_version(args.lm_eval),
        "tasks": {
            "pw_code_mc": f"{CHOICE_ITEMS} two-way choices of a line's true end (acc)",
            "pw_code_ppl": f"{ROLLING_DOCS} blocks of {LINES_PER_DOC} lines, rolling log-likelihood (bits_per_byte)",
            "source": f"{SOURCE_PACKAGE} (sha256 {digest})",
        },
        "transformers_float32": reference,
        "served_static_bits": {str(bits): scores for bits, scores in served.items()},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
