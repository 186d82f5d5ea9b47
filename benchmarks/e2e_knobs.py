"""The engine's A/B knobs of benchmarks/e2e_decode.py: one flag per
DataplaneConfig field a run may vary (the fused launches, the dense decode
kernels, PDL, step overlap, every MoeTuning field), their config, and the
launch shapes set on the built model."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields

from dataplane.config import DataplaneConfig
from kernels.dense_mma import MmaTiles
from kernels.moe_tuning import MoeTuning


def add_knob_arguments(parser: argparse.ArgumentParser) -> None:
    """The knobs' flags, each defaulting to the shipped value."""
    parser.add_argument("--no-fuse-qkv", action="store_true", help="keep q/k/v as three projections")
    parser.add_argument("--no-fuse-moe-entry", action="store_true",
                        help="DataplaneConfig.fuse_moe_entry = False (add-norm, router and MoE prep apart)")
    config_int(parser, "dense_gemv_max_tokens", "attention projections of batches up to N rows by "
               "kernels/dense_gemv.py; 0: cuBLAS")
    config_int(parser, "dense_mma_max_tokens", "attention projections of batches past the GEMV's and up to N "
               "rows by kernels/dense_mma.py; 0: cuBLAS")
    parser.add_argument("--dense-mma-tiles", type=json.loads, default=None,
                        help="JSON object of kernels/dense_mma.MmaTiles fields for those projections "
                             "(A/B runs; default: its defaults)")
    parser.add_argument("--fuse-qkv-rotary", action="store_true",
                        help="DataplaneConfig.fuse_qkv_rotary = True (rotary and the KV store in the q/k/v GEMV's "
                             "launch at B=1; A/B runs)")
    config_int(parser, "pdl_max_rows", "launches over up to N rows take part in PDL; 0 for kernel-time "
               "profiles whose durations are not inflated by PDL waits")
    config_int(parser, "pdl_moe_weight_max_rows", "the MoE gate/up and down launches' own PDL limit; default: "
               "--pdl-max-rows")
    add_tuning_arguments(parser)
    parser.add_argument("--no-overlap", action="store_true",
                        help="DataplaneConfig.overlap_steps = False (one decode step at a time)")


def config_int(parser: argparse.ArgumentParser, name: str, what: str) -> None:
    """--name-with-dashes for the int DataplaneConfig field `name`, its default the field's."""
    parser.add_argument("--" + name.replace("_", "-"), type=int, default=DataplaneConfig.model_fields[name].default,
                        help=f"DataplaneConfig.{name} ({what})")


def knob_config(args: argparse.Namespace) -> dict:
    """DataplaneConfig keywords of the knobs' flags."""
    return {
        "fuse_qkv": not args.no_fuse_qkv, "fuse_moe_entry": not args.no_fuse_moe_entry,
        "dense_gemv_max_tokens": args.dense_gemv_max_tokens, "dense_mma_max_tokens": args.dense_mma_max_tokens,
        "fuse_qkv_rotary": args.fuse_qkv_rotary, "overlap_steps": not args.no_overlap,
        "pdl_max_rows": args.pdl_max_rows, "pdl_moe_weight_max_rows": args.pdl_moe_weight_max_rows,
        "moe_tuning": tuning_from_args(args),
    }


def apply_knobs(args: argparse.Namespace, model) -> None:
    """What the config does not carry, set on the built model before its
    first step: the dense decode kernel's launch shape (--dense-mma-tiles)."""
    if args.dense_mma_tiles is not None:
        model.use_dense_mma(args.dense_mma_max_tokens, MmaTiles(**args.dense_mma_tiles))


def add_tuning_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per MoeTuning field (--one-token-stages, --narrow-tile-maxnreg,
    ...), defaulting to the shipped value, for A/B runs; kernels/moe_tuning.py
    says what each is and what was measured. The flag's type follows the
    default's: a bool takes --name / --no-name, a tuple comma-separated ints
    (--down-group-cost 8,10,11,13,15), a None default an int."""
    for f in fields(MoeTuning):
        flag = "--" + f.name.replace("_", "-")
        help_text = f"DataplaneConfig.moe_tuning.{f.name} (kernels/moe_tuning.py; A/B runs)"
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        elif isinstance(f.default, tuple):
            parser.add_argument(flag, type=int_tuple, default=f.default, help=help_text)
        else:
            kind = int if f.default is None else type(f.default)
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)


def int_tuple(text: str) -> tuple[int, ...]:
    """'8,10,11' as (8, 10, 11); argparse reports the ValueError of a bad item."""
    return tuple(int(item) for item in text.split(","))


def tuning_from_args(args: argparse.Namespace) -> MoeTuning:
    """The MoeTuning that add_tuning_arguments' flags describe."""
    return MoeTuning(**{f.name: getattr(args, f.name) for f in fields(MoeTuning)})
