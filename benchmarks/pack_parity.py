"""How far the Triton packer's codes are from the codec's on a full-size
block. One command (GPU), writes JSON and prints a short table last:

    python benchmarks/pack_parity.py --commit <sha> --out benchmarks/results/pack_parity_h200.json

Per field: weights whose field value differs between kernels/quant_pack.py
(least squares) and dataplane/weights/codec.encode, and for the 8-bit code q
rebuilt from all five fields: how many weights differ, the largest |dq|, and
how far those weights' (w - lo) / s lay from a rounding tie (x.5).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataplane.weights.codec import _group_min_max, encode, field_from_bytes, unpack_field  # noqa: E402
from dataplane.weights.layout import FIELD_WIDTHS, GROUP, NUM_FIELDS  # noqa: E402
from kernels.quant_pack import quant_pack  # noqa: E402

SHAPES = {"gate": (14336, 4096), "down": (4096, 14336)}


def parity(n: int, k: int, seed: int, device: str) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.empty(n, k, device=device, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=gen)
    blk = encode(w)
    packed = quant_pack(w, least_squares=True)
    q_codec = torch.zeros(n, k, dtype=torch.int64, device=device)
    q_pack = torch.zeros_like(q_codec)
    shift, fields = 8, []
    for f in range(NUM_FIELDS):
        shift -= FIELD_WIDTHS[f]
        a = unpack_field(blk.fields[f], f)
        b = unpack_field(field_from_bytes(packed[f], n, k, f)[0], f)
        fields.append(int((a != b).sum()))
        q_codec |= a << shift
        q_pack |= b << shift
    diff = q_codec != q_pack
    wg = w.float().reshape(n, k // GROUP, GROUP)
    lo, s, _ = _group_min_max(wg)  # the codec's 8-bit grid
    x = ((wg - lo) / s).reshape(n, k)  # the value both round
    tie_dist = (x[diff] - x[diff].floor() - 0.5).abs()
    return {"shape": [n, k], "weights": n * k, "field_mismatches": fields, "q_mismatches": int(diff.sum()),
            "max_abs_dq": int((q_codec - q_pack).abs().max()),
            "max_tie_distance": float(tie_dist.max()) if tie_dist.numel() else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = {name: parity(n, k, seed, "cuda") for seed, (name, (n, k)) in enumerate(SHAPES.items())}
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "commit": args.commit,
                                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                    "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "blocks": rows}, indent=1))
    print("block  weights     field mismatches          q mismatches  max|dq|  max tie distance")
    for name, r in rows.items():
        print(f"{name:5s} {r['weights']:10d}  {str(r['field_mismatches']):24s} {r['q_mismatches']:8d} "
              f"{r['max_abs_dq']:8d}  {r['max_tie_distance']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
