"""Trains pw-moe-tiny (transformers' MixtralForCausalLM) from tokenized corpus streams.

    python3 models/train/train.py --config models/train/config.json --tokens data/tokens --out OUT_DIR

Every step draws ``batch_sequences / len(domains)`` random windows from each
domain's TRAIN stream (uniform domain mix; seeded generator). Loss = next-token
cross entropy (bf16 autocast, fp32 master weights) + router_aux_loss_coef x
transformers' load-balancing loss. AdamW, linear warmup then cosine decay.
Validation loss per domain is measured every ``eval_every`` steps on the whole
validation split; the weights with the best mean validation loss are saved
(test splits are never read here).

Time guard: after ``calibrate_steps`` (still in warmup) the step time is
measured; if ``steps`` would not fit in ``max_train_seconds`` the schedule is
shortened to what fits. ``train_log.json`` records planned and run steps.

Output: save_pretrained folder (config.json, generation_config.json, safetensors
shards + index) and train_log.json; with ``--tokenizer DIR`` also the tokenizer files.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

if __package__ in (None, ""):  # run as a script on the GPU machine: make `models.` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from models.train.balance_loss import per_layer_balance_loss  # noqa: E402
from models.train.lm_eval import IGNORE, make_windows, nll_sum  # noqa: E402
from models.train.sorted_experts import register_sorted_experts  # noqa: E402
from models.train.tokenize_corpus import load_meta, load_stream  # noqa: E402
from models.train.train_config import RunConfig, load_config, mixtral_config  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
EVAL_BATCH = 64
CALIBRATION_SKIP = 10  # first steps (CUDA and allocator warm-up) are left out of the step-time estimate
FORWARD_SHARE = 1 / 3  # a forward-only token costs about a third of a training token


def lr_at(step: int, total: int, cfg) -> float:
    """Linear warmup to peak_lr, then cosine down to peak_lr * min_lr_ratio at ``total``."""
    if step < cfg.warmup_steps:
        return cfg.peak_lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    floor = cfg.peak_lr * cfg.min_lr_ratio
    return floor + (cfg.peak_lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class DomainSampler:
    """Random training windows, the same number from every domain per step."""

    def __init__(self, streams: dict[str, np.ndarray], seq_len: int, per_domain: int, seed: int, device):
        self.streams = {d: torch.from_numpy(s.astype(np.int64)).to(device) for d, s in streams.items()}
        self.seq_len, self.per_domain, self.device = seq_len, per_domain, device
        self.generator = torch.Generator().manual_seed(seed)
        self.offsets = torch.arange(seq_len + 1, device=device)  # [L+1]

    def batch(self) -> torch.Tensor:  # [D*per_domain, L+1]
        rows = []
        for stream in self.streams.values():
            starts = torch.randint(0, stream.numel() - self.seq_len - 1, (self.per_domain,), generator=self.generator)
            rows.append(stream[starts.to(self.device)[:, None] + self.offsets])
        return torch.cat(rows)


def build_model(cfg: RunConfig, meta: dict, experts_impl: str, device):
    from transformers import MixtralForCausalLM

    hf_cfg = mixtral_config(cfg.model, pad_id=0, bos_id=meta["bos_id"], eos_id=meta["eos_id"])
    if meta["vocab_size"] != cfg.model.vocab_size:
        raise ValueError(f"tokenizer vocab {meta['vocab_size']} != model vocab {cfg.model.vocab_size}")
    torch.manual_seed(cfg.seed)
    model = MixtralForCausalLM._from_config(hf_cfg, experts_implementation=experts_impl)
    return model.to(device)


def param_groups(model, weight_decay: float) -> list[dict]:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def validate(model, windows: dict, device, autocast: bool) -> dict[str, float]:
    model.eval()
    losses = {}
    for domain, win in windows.items():
        nats, count = nll_sum(model, win, EVAL_BATCH, device, autocast)
        losses[domain] = nats / count
    model.train()
    return losses


def train(cfg: RunConfig, tokens_dir: Path, out: Path, tokenizer_dir: Path | None, device) -> dict:
    t_start = time.time()
    meta = load_meta(tokens_dir)
    tc = cfg.train
    streams = {d: load_stream(tokens_dir, d, "train") for d in cfg.domains}
    val_windows = {d: make_windows(load_stream(tokens_dir, d, "validation"), tc.seq_len, meta["bos_id"],
                                   tc.eval_max_windows)
                   for d in cfg.domains}
    use_cuda = device.type == "cuda"
    model = build_model(cfg, meta, register_sorted_experts(), device)
    n_params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(param_groups(model, tc.weight_decay), lr=tc.peak_lr,
                                  betas=(tc.beta1, tc.beta2), fused=use_cuda)
    sampler = DomainSampler(streams, tc.seq_len, tc.batch_sequences // len(cfg.domains), cfg.seed + 1, device)
    aux_coef = cfg.model.router_aux_loss_coef
    log: dict = {"config": asdict(cfg), "parameters": n_params,
                 "device": torch.cuda.get_device_name(device) if use_cuda else "cpu",
                 "torch": torch.__version__, "steps_planned": tc.steps, "history": [], "evals": []}
    total_steps = tc.steps
    best = {"loss": float("inf"), "step": -1, "state": None}
    tokens_per_step = tc.batch_sequences * tc.seq_len
    model.train()
    t_loop = time.time()
    t_calib = t_loop
    calib_skip = min(CALIBRATION_SKIP, tc.calibrate_steps // 2)
    val_tokens = sum(w.inputs.numel() for w in val_windows.values())
    step = 0
    while step < total_steps:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total_steps, tc)
        batch = sampler.batch()  # [B, L+1]
        inputs, targets = batch[:, :-1], batch[:, 1:].clone()  # [B, L] each
        targets[targets == meta["bos_id"]] = IGNORE
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_cuda):
            outputs = model(input_ids=inputs, output_router_logits=True)
            ce = F.cross_entropy(outputs.logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
            balance, shares = per_layer_balance_loss(outputs.router_logits, cfg.model.num_experts_per_tok)
            loss = ce + aux_coef * balance
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        optimizer.step()
        step += 1
        if step == calib_skip:
            _sync(use_cuda)
            t_calib = time.time()
        if step == tc.calibrate_steps:
            _sync(use_cuda)
            per_step = (time.time() - t_calib) / (step - calib_skip)
            eval_cost = per_step * FORWARD_SHARE * val_tokens / tokens_per_step  # seconds per validation pass
            total_steps = _apply_time_guard(step, total_steps, time.time() - t_loop, per_step, eval_cost, tc, log)
        if step % tc.log_every == 0 or step == total_steps:
            elapsed = time.time() - t_loop
            ce_value, balance_value = float(ce.detach()), float(balance.detach())
            lr, rate = optimizer.param_groups[0]["lr"], step * tokens_per_step / elapsed
            min_share = [round(float(x), 4) for x in shares.min(dim=-1).values]  # per layer
            log["history"].append({"step": step, "loss": ce_value, "balance_loss": balance_value,
                                   "min_expert_share_per_layer": min_share, "grad_norm": float(grad_norm),
                                   "lr": lr, "elapsed_s": round(elapsed, 2), "tokens_per_s": round(rate)})
            print(f"step {step}/{total_steps} loss {ce_value:.4f} balance {balance_value:.4f} "
                  f"min share {min(min_share):.3f} lr {lr:.2e} {rate:,.0f} tok/s", flush=True)
        if step % tc.eval_every == 0 or step == total_steps:
            losses = validate(model, val_windows, device, use_cuda)
            mean = sum(losses.values()) / len(losses)
            log["evals"].append({"step": step, "validation_loss": losses, "mean": mean})
            print(f"  eval step {step}: mean {mean:.4f} " + " ".join(f"{d} {v:.4f}" for d, v in losses.items()),
                  flush=True)
            if mean < best["loss"]:
                best = {"loss": mean, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
    log.update(steps_run=step, train_seconds=round(time.time() - t_loop, 1), tokens_seen=step * tokens_per_step,
               best_step=best["step"], best_mean_validation_loss=best["loss"])
    model.load_state_dict(best["state"])
    _save(model, tc, out, tokenizer_dir)
    log["total_seconds"] = round(time.time() - t_start, 1)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def _sync(use_cuda: bool) -> None:
    if use_cuda:
        torch.cuda.synchronize()


def _apply_time_guard(step: int, total_steps: int, elapsed: float, per_step: float, eval_cost: float,
                      tc, log: dict) -> int:
    """Shortens the schedule so the loop, evaluations included, fits ``max_train_seconds``."""
    per_step_with_evals = per_step + eval_cost / tc.eval_every
    fits = step + int((tc.max_train_seconds - elapsed) / per_step_with_evals)
    log["calibration"] = {"steps": step, "seconds_per_step": per_step, "seconds_per_eval": eval_cost,
                          "steps_that_fit": fits}
    print(f"calibration: {per_step * 1e3:.1f} ms/step, eval ~{eval_cost:.1f} s, {fits} steps fit", flush=True)
    if fits < total_steps:
        print(f"time guard: {per_step * 1e3:.1f} ms/step, schedule shortened {total_steps} -> {fits}", flush=True)
        return max(fits, tc.warmup_steps + 1)
    return total_steps


def _save(model, tc, out: Path, tokenizer_dir: Path | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    model = model.to(getattr(torch, tc.save_dtype))
    model.config.use_cache = True
    model.save_pretrained(out, max_shard_size=tc.max_shard_size)
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            shutil.copy(tokenizer_dir / name, out / name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=Path("models/train/config.json"))
    parser.add_argument("--tokens", type=Path, default=Path("data/tokens"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=None, help="copy tokenizer files from this folder")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    log = train(cfg, args.tokens, args.out, args.tokenizer, torch.device(args.device))
    print(f"trained {log['steps_run']} steps ({log['tokens_seen']:,} tokens) in {log['train_seconds']} s; "
          f"best step {log['best_step']} mean val loss {log['best_mean_validation_loss']:.4f}")


if __name__ == "__main__":
    main()
