"""CLI: ``python -m dataplane --model PATH --port N --controlplane HOST:PORT --gpu-memory-gb X``.

Builds the engine, serves gRPC (Inference + health), dials the controlplane
when one is given, prints the address it serves on, and runs until SIGINT or
SIGTERM. Flags override PW_DATAPLANE_* environment variables.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from typing import Any

from dataplane.app import Dataplane
from dataplane.config import GIB, DataplaneConfig

# How often the main thread looks for a received SIGINT / SIGTERM.
SIGNAL_POLL_S = 0.1


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    """Flags given on the command line, as DataplaneConfig field overrides."""
    p = argparse.ArgumentParser(prog="python -m dataplane", description="PagedWeight dataplane")
    p.add_argument("--model", dest="model_path", help="Hugging Face model folder")
    p.add_argument("--synthetic", help="synthetic preset (random weights at real shapes), e.g. mixtral-8x7b")
    p.add_argument("--model-name")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--controlplane", help="controlplane HOST:PORT")
    p.add_argument("--dataplane-id")
    p.add_argument("--gpu-memory-gb", type=float, help="memory budget in GiB (model + arena)")
    p.add_argument("--memory-budget-bytes", type=int)
    p.add_argument("--device")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"))
    p.add_argument("--kv-block-size", type=int)
    p.add_argument("--max-running-seqs", type=int)
    p.add_argument("--max-batched-tokens", type=int)
    p.add_argument("--max-context-length", type=int)
    p.add_argument("--telemetry-interval-ms", type=int)
    p.add_argument("--max-arena-pages", type=int, help="cap on arena pages (forces memory pressure)")
    p.add_argument("--expert-precision", choices=("paged", "dense"))
    p.add_argument("--initial-expert-bits", type=int, choices=(2, 3, 4, 6, 8))
    p.add_argument(
        "--static-precision", dest="dynamic_precision", action="store_false", default=None,
        help="never change expert precision at run time (the static baseline)",
    )
    p.add_argument(
        "--no-cuda-graphs", dest="cuda_graphs", action="store_false", default=None,
        help="run decode steps eagerly instead of replaying captured CUDA graphs",
    )
    p.add_argument(
        "--no-prefix-caching", dest="prefix_caching", action="store_false", default=None,
        help="compute every prompt in full instead of reusing the cached K/V of a shared prefix",
    )
    p.add_argument(
        "--warm-up", action=argparse.BooleanOptionalAction, default=None,
        help="compile kernels and capture decode graphs with synthetic requests before serving "
        "(default: on CUDA)",
    )
    p.add_argument("--kernel-manifest", help="kernel manifest whose Triton variants are compiled in parallel "
                   "before the model is built (dataplane/kernel_manifest.py)")
    p.add_argument("--kernel-manifest-out", help="write the manifest of the kernel variants this run compiled here")
    p.add_argument("--precompile-workers", type=int, help="threads that precompile the manifest (0: one per core)")
    p.add_argument("--low-watermark", type=float)
    p.add_argument("--high-watermark", type=float)
    p.add_argument("--min-residence-ms", type=int)
    p.add_argument("--log-level", default="INFO")
    args = vars(p.parse_args(argv))
    logging.basicConfig(level=args.pop("log_level"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gib = args.pop("gpu_memory_gb")
    if gib is not None:
        args["memory_budget_bytes"] = int(gib * GIB)
    return {k: v for k, v in args.items() if v is not None}


def main(argv: list[str] | None = None) -> None:
    config = DataplaneConfig(**parse_args(argv))
    # The handler only appends: a threading.Event set from a handler can
    # deadlock when the signal lands while the main thread holds the Event's
    # lock (inside Event.wait). Installed before starting, so a signal during
    # the start still ends in a clean stop.
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: received.append(signum))
    dataplane = Dataplane(config)
    address = dataplane.start()
    print(f"dataplane serving {dataplane.engine.model_info.name} on {address}", flush=True)
    while not received:
        time.sleep(SIGNAL_POLL_S)
    dataplane.stop()


if __name__ == "__main__":
    main()
