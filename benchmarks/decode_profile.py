"""Kernel time per decode step by kernel name (torch.profiler), for
benchmarks/e2e_decode.py --profile-batches."""

from __future__ import annotations

from benchmarks.decode_batch import run_batch

PROFILE_PROMPT_LEN = 8  # one short prefill step, then decode steps only
PROFILE_TOP = 15


def profile_decode(engine, batch: int, steps: int, bits: str, graphs: bool, pdl_max_rows: int) -> dict:
    """GPU kernel time per decode step by kernel name.

    Two profiled requests of the same batch: prefill + 1 token, and prefill +
    steps + 1 tokens; the per-kernel difference over steps is the decode
    steps alone (at B=64 the prefill of 64 prompts is hundreds of launches,
    which a single profile spread over the steps). pdl_max_rows: the
    engine's DataplaneConfig.pdl_max_rows (whether these launches take part
    in PDL)."""
    from torch.profiler import ProfilerActivity, profile

    on_gpu = engine.arena.device.type == "cuda"
    run_batch(engine, batch, PROFILE_PROMPT_LEN, 4, f"pw-{batch}")  # capture the bucket first

    def spent(e) -> float:  # microseconds (CPU self time in a dry run on the CPU)
        return e.device_time_total if on_gpu else e.self_cpu_time_total

    def kernel_times(new_tokens: int, tag: str) -> dict[str, tuple[float, int]]:
        with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
            run_batch(engine, batch, PROFILE_PROMPT_LEN, new_tokens, tag)
        return {e.key[:80]: (spent(e), e.count) for e in prof.key_averages() if spent(e) > 0}

    base = kernel_times(1, f"p0-{batch}")
    full = kernel_times(steps + 1, f"p-{batch}")
    per_step = {}  # name -> (us, calls) per decode step
    for name, (us, calls) in full.items():
        base_us, base_calls = base.get(name, (0.0, 0))
        per_step[name] = ((us - base_us) / steps, (calls - base_calls) / steps)
    top = sorted(per_step.items(), key=lambda kv: kv[1][0], reverse=True)[:PROFILE_TOP]
    result = {
        "batch": batch,
        "bits": bits,
        "graphs": graphs,
        "steps": steps,
        "method": "profile(prefill + steps + 1 tokens) - profile(prefill + 1 token), per step",
        # Launches with programmatic dependent launch start before the previous
        # grid ends and wait in the kernel: their durations include that wait,
        # so at these sizes the kernel times overlap and their sum exceeds the step.
        "pdl_inflates_durations": on_gpu and batch <= pdl_max_rows,
        "gpu_ms_per_step": sum(us for us, _ in per_step.values()) / 1e3,
        "kernels": [{"name": name, "calls_per_step": calls, "ms_per_step": us / 1e3} for name, (us, calls) in top],
    }
    print(f"\nprofile B={batch} bits {bits}: GPU {result['gpu_ms_per_step']:.2f} ms/step"
          + (" (PDL launches: durations include their waits)" if result["pdl_inflates_durations"] else ""))
    for k in result["kernels"]:
        print(f"  {k['ms_per_step']:7.3f} ms {k['calls_per_step']:6.1f}x  {k['name']}")
    return result
