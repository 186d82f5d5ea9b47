"""Kernel time per decode step by kernel name (torch.profiler), for
benchmarks/e2e_decode.py --profile-batches.

Two views of the same trace: each kernel's duration, and its share of the
step's critical path: the time by which its end moves the latest end seen so
far in stream order (end - max(previous ends, its start)). With PDL a launch
starts early and waits inside, so its duration includes the previous
kernel's tail; its critical-path share does not, and the shares add up to
the GPU's busy time. Idle time between kernels (launch gaps without PDL,
waits on the host) is counted apart.

A share is not what removing the kernel would save: under PDL the next
launch becomes resident and ramps up while a short kernel runs, and pays
that ramp itself once the kernel is gone (the rotary launch's 2.0 us a
layer, fused away in kernels/qkv_rotary_gemv.py, saved nothing)."""

from __future__ import annotations

from benchmarks.decode_batch import run_batch

PROFILE_PROMPT_LEN = 8  # one short prefill step, then decode steps only
PROFILE_TOP = 15
IDLE = "(idle)"  # critical_path's key for the time no kernel runs


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

    def kernel_times(new_tokens: int, tag: str) -> tuple[dict[str, tuple[float, int]], dict[str, float]]:
        with profile(activities=[ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]) as prof:
            run_batch(engine, batch, PROFILE_PROMPT_LEN, new_tokens, tag)
        durations = {e.key[:80]: (spent(e), e.count) for e in prof.key_averages() if spent(e) > 0}
        return durations, critical_path(prof.events() if on_gpu else [])

    base, base_critical = kernel_times(1, f"p0-{batch}")
    full, full_critical = kernel_times(steps + 1, f"p-{batch}")
    per_step = {}  # name -> (us, calls) per decode step
    for name, (us, calls) in full.items():
        base_us, base_calls = base.get(name, (0.0, 0))
        per_step[name] = ((us - base_us) / steps, (calls - base_calls) / steps)
    top = sorted(per_step.items(), key=lambda kv: kv[1][0], reverse=True)[:PROFILE_TOP]
    critical = {name: (us - base_critical.get(name, 0.0)) / steps for name, us in full_critical.items()}
    critical_top = sorted(((n, us) for n, us in critical.items() if n != IDLE), key=lambda kv: kv[1],
                          reverse=True)[:PROFILE_TOP]
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
        "critical_path": {
            "busy_ms_per_step": sum(us for n, us in critical.items() if n != IDLE) / 1e3,
            "idle_ms_per_step": critical.get(IDLE, 0.0) / 1e3,
            "kernels": [{"name": name, "ms_per_step": us / 1e3} for name, us in critical_top],
        },
    }
    print(f"\nprofile B={batch} bits {bits}: GPU {result['gpu_ms_per_step']:.2f} ms/step"
          + (" (PDL launches: durations include their waits)" if result["pdl_inflates_durations"] else ""))
    for k in result["kernels"]:
        print(f"  {k['ms_per_step']:7.3f} ms {k['calls_per_step']:6.1f}x  {k['name']}")
    path = result["critical_path"]
    print(f"critical path: busy {path['busy_ms_per_step']:.3f} ms/step, idle {path['idle_ms_per_step']:.3f}")
    for k in path["kernels"]:
        print(f"  {k['ms_per_step']:7.3f} ms  {k['name']}")
    return result



def critical_path(events) -> dict[str, float]:
    """Microseconds of the trace's device busy time by kernel name, each
    kernel taking end - max(latest earlier end, its start) in start order
    (the module docstring); the gaps with no kernel running under IDLE."""
    from torch.autograd import DeviceType

    kernels = sorted((e for e in events if e.device_type == DeviceType.CUDA),
                     key=lambda e: (e.time_range.start, e.time_range.end))
    shares: dict[str, float] = {}
    latest_end = None
    for e in kernels:
        start, end = e.time_range.start, e.time_range.end
        if latest_end is None:
            share = end - start
        else:
            shares[IDLE] = shares.get(IDLE, 0.0) + max(0.0, start - latest_end)
            share = max(0.0, end - max(latest_end, start))
            end = max(end, latest_end)
        name = e.key[:80]
        shares[name] = shares.get(name, 0.0) + share
        latest_end = end
    return shares
