"""Does ``JITFunction.preload`` of a recorded variant reach the disk-cache key
that the launch compiled under? (GPU diagnostic for dataplane/kernel_precompile.py.)

    python benchmarks/preload_key_probe.py --out preload_key_probe.json

On the H100 (benchmarks/results/cold_start_h100_s45*.json) the precompiled
start still compiled 12-15 MoE variants (prep, gate/up, down) that its
manifest held and its workers had preloaded, while the other kernels' variants
loaded from the cache. Here, in one process: Triton's ``get_cache_key`` is
wrapped to record each key's parts; the MoE layer (B = 1 and 16) and an RMS
norm are launched (the JIT's keys); then each recorded variant is preloaded
with the wrapper raising right after it records (no compile): the preload's
keys. Per variant: equal or not, and which part differs (the source hash's
kernel cache key / attrs / signature / constants, the options' hash, the
environment). Prints a table last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.provenance import git_commit  # noqa: E402


class _Recorded(Exception):
    """Raised by the wrapper in preload mode: the key is recorded, skip the compile."""


def key_parts(src, backend, options, env_vars) -> dict:
    sorted_sig = [v for _, v in sorted(src.signature.items())]
    get_key = lambda x: x.cache_key if hasattr(x, "cache_key") else str(x)  # noqa: E731 (Triton's rule)
    return {
        "kernel": getattr(src.fn, "__name__", str(src.fn)),
        "fn_cache_key": hashlib.sha256(src.fn.cache_key.encode()).hexdigest()[:16],
        "attrs": str(src.attrs),
        "signature": str(sorted_sig),
        "constants": "-".join(get_key(v) for _, v in sorted(src.constants.items())),
        "backend": backend.hash(),
        "options": options.hash(),
        "options_dict": {k: str(v) for k, v in sorted(options.__dict__.items())},
        "env": str(sorted(env_vars.items())),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--commit")
    args = p.parse_args()

    import triton
    from triton.compiler import compiler as tcompiler

    from dataplane.kernel_compiles import CompileWatch
    from dataplane.kernel_manifest import VariantRecorder
    from dataplane.kernel_precompile import resolve_kernel
    from kernels.moe_mixed import fused_moe_mixed
    from kernels.moe_tile_choice import choose_tiles
    from kernels.rmsnorm import rmsnorm
    from tests.kernels.paged_store import random_moe

    records: list[dict] = []
    mode = {"preload": False}
    original = tcompiler.get_cache_key

    def recording_get_cache_key(src, backend, backend_options, env_vars):
        records.append(key_parts(src, backend, backend_options, env_vars))
        if mode["preload"]:
            raise _Recorded
        return original(src, backend, backend_options, env_vars)

    tcompiler.get_cache_key = recording_get_cache_key
    recorder = VariantRecorder()
    jit_index: list[int] = []  # per recorded variant, the index its compile's key will have

    def on_variant(variant) -> None:
        before = len(recorder.variants())
        recorder.add(variant)
        if len(recorder.variants()) > before:
            jit_index.append(len(records))

    watch = CompileWatch(lambda name: None, on_variant)
    watch.install()
    hidden, ffn, experts = 256, 384, 5
    weights = random_moe(1, experts, hidden, ffn, lambda l, e, proj: 3, 8192, "cuda")
    gen = torch.Generator().manual_seed(0)
    for tokens in (1, 16):
        x = torch.randn(tokens, hidden, generator=gen).to("cuda")
        ids = torch.stack([torch.randperm(experts, generator=gen)[:2] for _ in range(tokens)]).to("cuda", torch.int32)
        tw = torch.rand(tokens, 2, generator=gen).to("cuda")
        tiles = choose_tiles(tokens, 2, experts, hidden, ffn, use_asm=True)
        fused_moe_mixed(x, ids, tw, weights, 0, experts, ffn, tiles)
    rmsnorm(torch.randn(3, hidden, device="cuda", dtype=torch.bfloat16),
            torch.ones(hidden, device="cuda", dtype=torch.bfloat16), 1e-5)
    torch.cuda.synchronize()
    watch.uninstall()

    rows = []
    mode["preload"] = True
    for variant, index in zip(recorder.variants(), jit_index):
        jit = records[index] if index < len(records) else None
        start = len(records)
        error = None
        try:
            resolve_kernel(variant.module, variant.qualname).preload(variant.specialization)
            error = "preload compiled without reaching get_cache_key"
        except _Recorded:
            pass
        except Exception as err:  # noqa: BLE001 (a probe: every failure is a finding)
            error = f"{type(err).__name__}: {err}"
        pre = records[start] if len(records) > start else None
        differs = [] if jit is None or pre is None else [k for k in jit if k != "options_dict" and jit[k] != pre[k]]
        row = {"kernel": variant.qualname, "equal": jit is not None and pre is not None and not differs,
               "differs": differs, "error": error}
        for part in differs:
            row[f"jit_{part}"], row[f"preload_{part}"] = jit[part], pre[part]
        if "options" in differs:
            row["options_dict_diff"] = {k: (jit["options_dict"].get(k), pre["options_dict"].get(k))
                                        for k in set(jit["options_dict"]) | set(pre["options_dict"])
                                        if jit["options_dict"].get(k) != pre["options_dict"].get(k)}
        rows.append(row)
    tcompiler.get_cache_key = original

    result = {"benchmark": "preload_key_probe", "gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
              "torch": torch.__version__, "commit": git_commit(args.commit),
              "command": " ".join(["benchmarks/preload_key_probe.py", *sys.argv[1:]]), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'kernel':<24} {'equal':>5}  differs / error")
    for row in rows:
        print(f"{row['kernel']:<24} {str(row['equal']):>5}  {','.join(row['differs'])} {row['error'] or ''}")
        for part in row["differs"]:
            print(f"    jit     {part}: {str(row['jit_' + part])[:300]}")
            print(f"    preload {part}: {str(row['preload_' + part])[:300]}")


if __name__ == "__main__":
    main()
