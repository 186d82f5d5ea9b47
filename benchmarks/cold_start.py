"""A dataplane's start on an empty Triton cache, with and without a kernel manifest.

    python benchmarks/cold_start.py --preset mixtral-8x7b --out cold_start.json [--workers 0]

Starts of the same synthetic model (each its own process, warm-up on;
``--starts``, default cold,precompiled,warm):

* ``cold``: an empty Triton cache; writes the kernel manifest of what it
  compiled (DataplaneConfig.kernel_manifest_out). Always first.
* ``precompiled``: another empty cache; the manifest of ``cold`` is compiled
  in parallel threads of the dataplane's process before the build
  (dataplane/kernel_precompile.py).
* ``warm``: the ``precompiled`` cache again, no manifest: a restart on the
  same machine.

Per start: seconds of the precompile, the build, the warm-up and the whole
start to serving, and the Triton cache entries the warm-up added (the
variants it compiled itself: what the manifest missed). Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT_PREFIX = "COLD_START_RESULT "


# Names of the cache entries the warm-up added that the result lists.
LISTED_NEW_ENTRIES = 60


def cache_entries(cache_dir: Path) -> set[str]:
    """Triton's disk cache holds one folder per compiled variant (and per
    launcher stub it builds)."""
    return {p.name for p in cache_dir.iterdir() if p.is_dir()} if cache_dir.exists() else set()


def entry_kinds(cache_dir: Path, entries: set[str]) -> dict[str, int]:
    """How many of ``entries`` hold each file stem (a kernel's name, or
    __triton_launcher for a launcher stub)."""
    kinds: dict[str, int] = {}
    for entry in entries:
        stems = {f.name.split(".")[0] for f in (cache_dir / entry).iterdir() if not f.name.startswith("__grp__")}
        for stem in stems:
            kinds[stem] = kinds.get(stem, 0) + 1
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:LISTED_NEW_ENTRIES])


def missing_by_name(manifest: Path, used: Path) -> dict[str, int]:
    """Per kernel, the variants in ``used`` that ``manifest`` lacks."""
    from dataplane.kernel_manifest import read_manifest

    known = set(read_manifest(manifest))
    missing: dict[str, int] = {}
    for variant in read_manifest(used):
        if variant not in known:
            missing[variant.qualname] = missing.get(variant.qualname, 0) + 1
    return missing


def child(args: argparse.Namespace) -> None:
    """One start in this process (TRITON_CACHE_DIR set by the parent)."""
    import torch

    from dataplane.app import Dataplane
    from dataplane.config import DataplaneConfig

    cache_dir = Path(os.environ["TRITON_CACHE_DIR"])
    t0 = time.perf_counter()
    config = DataplaneConfig(synthetic=args.preset, initial_expert_bits=args.bits, warm_up=True, port=0,
                             kernel_manifest=args.manifest_in, kernel_manifest_out=args.manifest_out,
                             precompile_workers=args.workers)
    dataplane = Dataplane(config)
    built = time.perf_counter()
    entries_before_warm_up = cache_entries(cache_dir)
    dataplane.start()
    serving = time.perf_counter()
    added = cache_entries(cache_dir) - entries_before_warm_up
    dataplane.stop()
    pre = dataplane.precompiled
    result = {
        "precompile_s": pre.seconds if pre else 0.0,
        "precompile": None if pre is None else {"variants": pre.variants, "compiled": pre.compiled,
                                                "failed": pre.failed, "workers": pre.workers,
                                                "failures": pre.failures},
        "build_s": built - t0 - (pre.seconds if pre else 0.0),
        "warm_up_s": dataplane.warmup.seconds if dataplane.warmup else None,
        "start_to_serving_s": serving - t0,
        "cache_entries_before_warm_up": len(entries_before_warm_up),
        "cache_entries_added_by_warm_up": len(added),
        "added_by_warm_up_per_name": entry_kinds(cache_dir, added),
        "manifest_variants_written": len(dataplane.variants.variants()) if dataplane.variants else None,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": _triton_version(),
    }
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def run_start(name: str, args: argparse.Namespace, cache_dir: Path, manifest_in: Path | None,
              manifest_out: Path | None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--preset", args.preset, "--bits", str(args.bits),
           "--workers", str(args.workers), "--out", "-"]
    if manifest_in is not None:
        cmd += ["--manifest-in", str(manifest_in)]
    if manifest_out is not None:
        cmd += ["--manifest-out", str(manifest_out)]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache_dir)}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"start {name!r} failed (rc {proc.returncode})")
    return {"name": name, "process_wall_s": wall, **json.loads(lines[-1][len(RESULT_PREFIX):])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="mixtral-8x7b")
    p.add_argument("--bits", type=int, default=4, help="initial expert bits")
    p.add_argument("--workers", type=int, default=0, help="precompile threads (0: one per core)")
    p.add_argument("--out", required=True)
    p.add_argument("--commit", help="commit of the measured tree (the GPU machine's .git is stale)")
    p.add_argument("--timeout", type=float, default=590.0, help="seconds one start may take")
    p.add_argument("--starts", default="cold,precompiled,warm",
                   help="comma list: cold (first), precompiled, warm (the precompiled cache again)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--manifest-in", help=argparse.SUPPRESS)
    p.add_argument("--manifest-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return

    from benchmarks.provenance import git_commit

    root = Path(tempfile.mkdtemp(prefix="cold_start_"))
    manifest = Path(args.out).with_suffix(".manifest.json")
    starts: list[dict] = []
    record = {
        "benchmark": "cold_start",
        "command": " ".join(["benchmarks/cold_start.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(args.commit),
        "gpu": None,
        "preset": args.preset,
        "bits": args.bits,
        "cpu_cores": len(os.sched_getaffinity(0)),
        "manifest": str(manifest),
        "starts": starts,
    }
    # Every start writes the manifest of what it used: the precompiled start's
    # against the cold one's shows variants a start needed that the other did not.
    used = {name: manifest.with_name(f"{manifest.stem}.{name}.json") for name in ("precompiled", "warm")}
    known = {"cold": (root / "cache-cold", None, manifest),
             "precompiled": (root / "cache-pre", manifest, used["precompiled"]),
             "warm": (root / "cache-pre", None, used["warm"])}
    names = args.starts.split(",")
    if names[0] != "cold" or not set(names) <= set(known):
        raise SystemExit(f"--starts: cold first, then any of {', '.join(list(known)[1:])}")
    plan = [(name, *known[name]) for name in names]
    for name, cache_dir, manifest_in, manifest_out in plan:
        starts.append(run_start(name, args, cache_dir, manifest_in, manifest_out))
        record.update(gpu=starts[0]["device"], torch=starts[0]["torch"], triton=starts[0]["triton"])
        if name in used and used[name].exists():
            record[f"{name}_used_not_in_manifest"] = missing_by_name(manifest, used[name])
        Path(args.out).write_text(json.dumps(record, indent=1))  # after each start: a cut run keeps what it measured
    print(f"{args.preset}, {record['gpu']}, {record['cpu_cores']} cores")
    print(f"{'start':<12} {'precompile s':>12} {'build s':>8} {'warm-up s':>9} {'to serving s':>12} "
          f"{'warm-up compiles':>16} {'variants':>9}")
    for s in starts:
        pre = s["precompile"]
        variants = f"{pre['compiled']}/{pre['variants']}" if pre else str(s["manifest_variants_written"] or "")
        print(f"{s['name']:<12} {s['precompile_s']:>12.1f} {s['build_s']:>8.1f} {s['warm_up_s'] or 0:>9.1f} "
              f"{s['start_to_serving_s']:>12.1f} {s['cache_entries_added_by_warm_up']:>16} {variants:>9}")


if __name__ == "__main__":
    main()
