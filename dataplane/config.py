"""Typed configuration of the dataplane process.

The only place in the dataplane that reads environment variables: every field
can be set as ``PW_DATAPLANE_<FIELD>`` (e.g. ``PW_DATAPLANE_PORT=50051``);
explicit constructor arguments (the CLI) win over the environment. The config
is validated once here and passed down explicitly; nothing below reads it from
a global.
"""

from __future__ import annotations

import socket
from typing import Literal

import torch
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernels.moe_tuning import MoeTuning

GIB = 1 << 30
MIB = 1 << 20

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


class DataplaneConfig(BaseSettings):
    """Everything the dataplane process needs to start."""

    model_config = SettingsConfigDict(env_prefix="PW_DATAPLANE_", frozen=True, extra="forbid")

    # -- model ---------------------------------------------------------------
    # Hugging Face model folder; exactly one of model_path / synthetic is set.
    model_path: str | None = None
    # Synthetic mode: a preset name of dataplane.models.synthetic (random
    # weights at real shapes, built in memory; no files, no tokenizer).
    synthetic: str | None = None
    # Name reported to clients; defaults to the folder (or preset) name.
    model_name: str | None = None
    # Caps the context length below the model's max_position_embeddings.
    max_context_length: int | None = Field(default=None, ge=2)

    # -- serving -------------------------------------------------------------
    host: str = "127.0.0.1"
    # 0 picks a free port; the CLI prints the address it serves on.
    port: int = Field(default=0, ge=0, le=65535)
    # Controlplane "host:port"; None runs without telemetry.
    controlplane: str | None = None
    # Bearer token of the Telemetry stream, when the controlplane requires
    # one (its telemetry_tokens); best given as PW_DATAPLANE_CONTROLPLANE_TOKEN.
    controlplane_token: str | None = None
    # Stable id reported to the controlplane; defaults to "<hostname>-<port>".
    dataplane_id: str | None = None
    telemetry_interval_ms: int = Field(default=1000, ge=10)
    # Reconnect backoff of the telemetry stream: first delay and cap.
    telemetry_backoff_initial_s: float = Field(default=0.2, gt=0)
    telemetry_backoff_max_s: float = Field(default=10.0, gt=0)

    # -- device and memory ---------------------------------------------------
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    # Total memory the dataplane may use on its device (fixed residents +
    # arena). None: on CUDA a fraction of free memory, on CPU the CPU default.
    memory_budget_bytes: int | None = Field(default=None, gt=0)
    # Fraction of free GPU memory taken when no budget is given.
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    # Arena size on the CPU when no budget is given (only the pool, not the
    # model): enough KV blocks for tests and small demos.
    cpu_arena_bytes: int = Field(default=256 * MIB, gt=0)
    # Scratch for activations of one step, counted as a fixed resident. None:
    # estimated from max_batched_tokens and the model's shapes.
    workspace_bytes: int | None = Field(default=None, ge=0)
    # Upper bound on arena pages (tests use it to force KV pressure).
    max_arena_pages: int | None = Field(default=None, gt=0)

    # -- expert precision ----------------------------------------------------
    # "paged": expert weights live in the arena as multi-precision pages
    # (dataplane/weights); "dense": plain dense experts outside the arena.
    expert_precision: Literal["paged", "dense"] = "paged"
    # Bits every expert block starts at (one of 2, 3, 4, 6, 8).
    initial_expert_bits: int = 8
    # Walk the precision ladder under KV pressure (False: precision stays at
    # initial_expert_bits and KV pressure preempts, the static baseline).
    dynamic_precision: bool = True
    # Local walk limits, used until a controlplane plan sets its own. The
    # watermarks are fractions of the arena's pages; None (the default)
    # derives them from the KV pages one engine step can take
    # (dataplane/precision/ladder.py step_watermarks), which scales with the
    # arena where a fixed fraction does not.
    low_watermark: float | None = Field(default=None, ge=0, lt=1)
    high_watermark: float | None = Field(default=None, ge=0, lt=1)
    min_residence_ms: int = Field(default=2000, ge=0)
    promotion_bytes_per_s: int = Field(default=0, ge=0)  # 0 = unlimited

    # Decode-only steps on CUDA with paged experts replay CUDA graphs
    # captured per batch bucket up to max_running_seqs (dataplane/cuda_graphs.py);
    # False runs every step eagerly (the Triton decode kernels still apply).
    cuda_graphs: bool = True
    # Stack each layer's q/k/v projections into one after loading (one GEMM
    # instead of three per decode step); False keeps them apart (A/B runs).
    fuse_qkv: bool = True
    # At decode sizes, enter each MoE layer with one launch for the residual
    # add, the norm, the router and the MoE prep (kernels/moe_entry.py); False
    # keeps the three launches apart (A/B runs).
    fuse_moe_entry: bool = True
    # On CUDA, the attention projections of batches of up to this many rows by
    # kernels/dense_gemv.py instead of cuBLAS; 0: cuBLAS always. One row: end
    # to end 4.0 % faster at B=1; with it up to 2 or 4 rows, 1.2 % slower at
    # B=2 and 6.9 % at B=4 (e2e_h200_s20_{cublas,gemv_nopf,b2_*}.json).
    # At most kernels/dense_gemv.GEMV_MAX_TOKENS (a test holds them equal; the
    # config does not import Triton).
    dense_gemv_max_tokens: int = Field(default=1, ge=0, le=4)
    # On CUDA, the attention projections of batches past dense_gemv_max_tokens
    # and up to this many rows by kernels/dense_mma.py (a tensor-core product
    # taking part in PDL) instead of cuBLAS; 0: cuBLAS. End to end on the
    # H100 (synthetic Mixtral-8x7B, 4-bit, three interleaved rounds):
    # B=4 453.4 -> 464.6 tok/s, B=16 1373.0 -> 1399.5
    # (benchmarks/results/e2e_mma_*_h100_s50*.json); past 16 rows with the
    # small launches in the PDL chain (pdl_max_rows 64): B=32 2493.9 ->
    # 2529.1, B=64 4160.0 -> 4176.3 (kernels/pdl.py); alone at B=64 4164.6 ->
    # 4142.9. At most kernels/dense_mma.MMA_MAX_TOKENS (a test holds them
    # equal).
    dense_mma_max_tokens: int = Field(default=64, ge=0, le=64)
    # Decode steps whose fused q/k/v product takes that GEMV rotate q and k and
    # store k and v in its launch (kernels/qkv_rotary_gemv.py). Off: end to end
    # at B=1 it measured no gain (4-bit 296.5 / 298.3 against 299.0 / 298.7
    # tok/s in one interleaved call, e2e_h200_s27_c4_*.json); an A/B knob.
    fuse_qkv_rotary: bool = False
    # Pipeline depths and register cap of the fused MoE launches per token
    # tile (kernels/moe_tuning.py has the measurements behind the defaults);
    # as JSON in the environment, e.g.
    # PW_DATAPLANE_MOE_TUNING='{"tensor_core_stages": 3}' (A/B runs).
    moe_tuning: MoeTuning = MoeTuning()
    # On CUDA (sm_90+), the decode step's Triton launches over at most this
    # many token rows take part in programmatic dependent launch (each one's
    # programs become resident under the previous launch; kernels/pdl.py has
    # the measurements behind 64, kernels.pdl.PDL_MAX_ROWS, which a test holds
    # equal: the config does not import Triton); 0: no PDL (kernel-time
    # profiles, A/B runs).
    pdl_max_rows: int = Field(default=64, ge=0)
    # The MoE weight launches' own limit (gate/up and down; PdlPolicy.
    # moe_weight_max_rows, never above pdl_max_rows): 16, kernels.pdl.
    # PDL_MOE_WEIGHT_MAX_ROWS (a test holds them equal), so that a B=64 step
    # chains its small launches only; None: pdl_max_rows.
    pdl_moe_weight_max_rows: int | None = Field(default=16, ge=0)
    # Queue the next greedy decode step before the current one's tokens reach
    # the host (dataplane/engine.py); False: one step at a time (A/B runs).
    overlap_steps: bool = True

    # Before serving, run synthetic requests through the engine so its Triton
    # kernels are compiled and its decode graphs captured before the first
    # real request (dataplane/warmup.py). None: on when the device is CUDA
    # (on the CPU there is nothing to compile or capture).
    warm_up: bool | None = None
    # How long one warm-up round may wait for an output (the first compiles
    # of a fresh machine are slow) before the start fails.
    warm_up_round_timeout_s: float = Field(default=600.0, gt=0)
    # A kernel manifest (dataplane/kernel_manifest.py) whose Triton variants
    # are compiled in parallel, in threads of this process, into Triton's
    # disk and in-memory caches before the model is built, so the warm-up
    # finds them instead of compiling each in turn (why threads:
    # dataplane/kernel_precompile.py); None: none. Ignored on the CPU (the
    # interpreter compiles nothing).
    kernel_manifest: str | None = None
    # Where to write the manifest of the variants this dataplane compiled or
    # loaded (after the warm-up, and again at stop); None: nowhere.
    kernel_manifest_out: str | None = None
    # Threads that precompile the manifest; 0: one per usable CPU core.
    precompile_workers: int = Field(default=0, ge=0)

    # -- scheduling ----------------------------------------------------------
    kv_block_size: int = Field(default=16, gt=0)
    # Reuse the K/V of prompt prefixes computed before (dataplane/kv_cache.py);
    # cached blocks live only in free arena pages.
    prefix_caching: bool = True
    max_running_seqs: int = Field(default=64, gt=0)
    max_batched_tokens: int = Field(default=2048, gt=0)
    # Requests admitted to the engine but not finished; beyond it Generate
    # fails with RESOURCE_EXHAUSTED.
    max_pending_requests: int = Field(default=1024, gt=0)
    # Decay per token of each running sequence's mean routing distribution.
    demand_decay: float = Field(default=0.9, gt=0, lt=1)
    # Seed of the engine's generator for requests without a seed.
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> DataplaneConfig:
        if (self.model_path is None) == (self.synthetic is None):
            raise ValueError("set exactly one of model_path and synthetic")
        if self.max_batched_tokens < self.max_running_seqs:
            raise ValueError(
                "max_batched_tokens must be >= max_running_seqs so every running "
                "sequence can decode in one step"
            )
        if self.controlplane is not None and ":" not in self.controlplane:
            raise ValueError(f"controlplane must be host:port, got {self.controlplane!r}")
        if self.initial_expert_bits not in (2, 3, 4, 6, 8):
            raise ValueError(f"initial_expert_bits must be one of 2, 3, 4, 6, 8, got {self.initial_expert_bits}")
        if self.low_watermark is not None and self.high_watermark is not None \
                and self.low_watermark > self.high_watermark:
            raise ValueError("low_watermark must be <= high_watermark")
        if self.device != "auto" and not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"unknown device {self.device!r}")
        return self

    # -- resolved values -----------------------------------------------------
    def resolved_device(self) -> torch.device:
        """The device to run on: CUDA when available under "auto"."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> torch.dtype:
        """bf16 on GPU, fp32 on CPU under "auto"."""
        if self.dtype == "auto":
            return torch.bfloat16 if self.resolved_device().type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def resolved_warm_up(self) -> bool:
        """Whether to warm up before serving: on CUDA under None."""
        return self.warm_up if self.warm_up is not None else self.resolved_device().type == "cuda"

    def resolved_dataplane_id(self, port: int) -> str:
        return self.dataplane_id or f"{socket.gethostname()}-{port}"
