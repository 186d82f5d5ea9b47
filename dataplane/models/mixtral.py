"""Mixtral as a plain nn.Module over the flattened, paged batch layout.

Parameter names mirror the Hugging Face checkpoint
(``model.layers.N.self_attn.q_proj.weight`` ...) except the experts, which are
stacked per layer: ``model.layers.N.block_sparse_moe.experts.{w1,w2,w3}``
(see dataplane/layers/experts.py). ``load_weights`` maps both the classic
per-expert names and the fused transformers-5 names onto them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from dataplane.forward_context import ForwardContext
from dataplane.layers.attention import kernel_decode_attention, paged_attention, write_kv
from dataplane.layers.linear import Embedding, Linear
from dataplane.layers.moe import SparseMoeBlock
from dataplane.layers.norm import RMSNorm
from dataplane.layers.rotary import RotaryEmbedding
from kernels.dense_gemv import GEMV_DTYPES, GemvTiles
from kernels.dense_mma import MmaTiles
from kernels.pdl import DEFAULT_PDL, PdlPolicy
from kernels.qkv_rotary_gemv import qkv_rotary_gemv, qkv_rotary_gemv_suits

FAMILY = "mixtral"
DEFAULT_ROPE_THETA = 1e6  # transformers' Mixtral default when config.json has none
# The o projection's decode GEMV tile: 8 rows x 1024 of K, the best of session
# 27's sweep at Mixtral's 4096 x 4096 (11.1 us against the default 8 x 512's
# 11.5; benchmarks/results/gemv_sweep_s27_h200.json). The q/k/v product keeps
# the default, its best. End to end (4-bit B=1, three interleaved rounds in one
# call, benchmarks/NOTES.md session 30): 305.4-305.6 tok/s against 305.1-305.4
# with 8 x 512, ahead in every round by about the rounds' spread (that call's
# files of this tile were not returned; e2e_h200_s30_ab.json holds a second
# call's three runs of it, 305.2-305.6).
O_PROJ_GEMV_TILES = GemvTiles(block_k=1024)


@dataclass(frozen=True)
class MixtralSpec:
    """The hyperparameters of a Mixtral-family model (from config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int
    top_k: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    family = FAMILY

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"heads ({self.num_heads}) must be a multiple of kv heads ({self.num_kv_heads})")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k {self.top_k} outside 1..{self.num_experts}")

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> MixtralSpec:
        """Parses a Hugging Face ``config.json``; ValueError for another family."""
        model_type = cfg.get("model_type")
        if model_type != FAMILY:
            raise ValueError(f"not a Mixtral checkpoint: model_type is {model_type!r}")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} (Mixtral uses silu)")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"unsupported rope_type {rope_type!r}")
        theta = rope.get("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA))
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            num_experts=cfg["num_local_experts"],
            top_k=cfg["num_experts_per_tok"],
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            max_position_embeddings=cfg["max_position_embeddings"],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            sliding_window=cfg.get("sliding_window"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )


class MixtralAttention(nn.Module):
    """GQA self-attention with rotary embeddings over the paged KV cache."""

    def __init__(self, spec: MixtralSpec, layer_index: int, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = spec.head_dim**-0.5
        self.q_proj = Linear(spec.hidden_size, spec.num_heads * spec.head_dim, device, dtype)
        self.k_proj = Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, device, dtype)
        self.v_proj = Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, device, dtype)
        self.o_proj = Linear(spec.num_heads * spec.head_dim, spec.hidden_size, device, dtype)
        self.rotary = RotaryEmbedding(spec.head_dim, spec.rope_theta, device)
        self.pdl = DEFAULT_PDL  # the decode attention's launches (kernels/pdl.py; use_pdl)
        self.qkv_proj: Linear | None = None  # set by fuse_qkv (then q/k/v_proj are None)
        self.rotary_in_gemv = False  # use_qkv_rotary_gemv

    def fuse_qkv(self) -> None:
        """Replaces q_proj, k_proj and v_proj by one projection of their stacked
        weights: one GEMM per step instead of three (at decode each is a
        launch-bound GEMV). A transform applied after the weights are loaded;
        the three weights are freed."""
        if self.qkv_proj is not None:
            return
        parts = (self.q_proj.weight, self.k_proj.weight, self.v_proj.weight)
        fused = Linear(self.q_proj.in_features, sum(w.shape[0] for w in parts), torch.device("meta"), parts[0].dtype)
        fused.weight = nn.Parameter(torch.cat([w.detach() for w in parts]), requires_grad=False)  # [q+k+v, H]
        fused.gemv_max_tokens = self.q_proj.gemv_max_tokens
        fused.mma_max_tokens = self.q_proj.mma_max_tokens
        fused.mma_tiles = self.q_proj.mma_tiles
        self.qkv_proj = fused
        self.q_proj = self.k_proj = self.v_proj = None

    def use_dense_gemv(self, max_tokens: int) -> None:
        """Batches of up to max_tokens rows take the decode GEMV kernel in
        every projection of this layer (Linear.gemv_max_tokens; 0: torch);
        the o projection with O_PROJ_GEMV_TILES."""
        for proj in (self.qkv_proj, self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            if proj is not None:
                proj.gemv_max_tokens = max_tokens
        self.o_proj.gemv_tiles = O_PROJ_GEMV_TILES

    def use_dense_mma(self, max_tokens: int, tiles: MmaTiles | None = None) -> None:
        """Batches of up to max_tokens rows past the GEMV's take the decode
        tensor-core kernel in every projection of this layer
        (Linear.mma_max_tokens; 0: torch), at launch shape tiles (None: its
        default)."""
        for proj in (self.qkv_proj, self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            if proj is not None:
                proj.mma_max_tokens = max_tokens
                proj.mma_tiles = tiles

    def use_qkv_rotary_gemv(self, on: bool) -> None:
        """Decode steps whose fused q/k/v product takes the dense GEMV rotate
        and store k and v in its launch (kernels/qkv_rotary_gemv.py)."""
        self.rotary_in_gemv = on

    @staticmethod
    def _decode_kernels_apply(ctx: ForwardContext) -> bool:
        """A decode-only step over the KV arena: the Triton decode attention."""
        return ctx.kv_arena is not None and ctx.attn.sliding_window is None and ctx.attn.decode_only

    def _rotary_gemv_applies(self, x: torch.Tensor, ctx: ForwardContext) -> bool:
        return (self.rotary_in_gemv and self.qkv_proj is not None and x.is_cuda and self._decode_kernels_apply(ctx)
                and x.dtype in GEMV_DTYPES and x.dtype == self.qkv_proj.weight.dtype
                and x.shape[0] <= self.qkv_proj.gemv_max_tokens and qkv_rotary_gemv_suits(x.shape[0], self.head_dim))

    def _decode_output(self, q: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        # q: [T, heads, D] rotated, the step's k and v in the cache -> [T, H]
        out = kernel_decode_attention(q, ctx.kv_arena, self.layer_index, ctx.attn, self.scale, self.pdl)
        return self.o_proj(out.reshape(q.shape[0], self.num_heads * self.head_dim))

    def forward(self, x: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        # x: [T, H]; positions: [T]
        if self._rotary_gemv_applies(x, ctx):
            q = qkv_rotary_gemv(x, self.qkv_proj.weight, positions, self.rotary.inv_freq, ctx.kv_arena,
                                self.layer_index, ctx.attn.slot_mapping, self.num_heads, self.num_kv_heads,
                                pdl=self.pdl)
            return self._decode_output(q, ctx)
        tokens = x.shape[0]
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.qkv_proj is not None:
            # Views of one [T, q + 2 kv] output; rotary and the KV write take row strides.
            q, k, v = self.qkv_proj(x).split((q_size, kv_size, kv_size), dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(tokens, self.num_heads, self.head_dim)  # [T, heads, D]
        k = k.view(tokens, self.num_kv_heads, self.head_dim)  # [T, kvh, D]
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        meta = ctx.attn
        if self._decode_kernels_apply(ctx):
            q = self.rotary.rotate_into_cache(positions, q, k, v, ctx.kv_arena, self.layer_index, meta.slot_mapping)
            return self._decode_output(q, ctx)
        q, k = self.rotary(positions, q, k)
        k_cache, v_cache = ctx.kv_caches[self.layer_index]
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = paged_attention(q, k_cache, v_cache, meta, self.scale)  # [T, heads, D]
        return self.o_proj(out.reshape(tokens, self.num_heads * self.head_dim))


class MixtralDecoderLayer(nn.Module):
    def __init__(
        self,
        spec: MixtralSpec,
        layer_index: int,
        device: torch.device,
        dtype: torch.dtype,
        expert_device: torch.device | None = None,
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, device, dtype)
        self.self_attn = MixtralAttention(spec, layer_index, device, dtype)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, device, dtype)
        self.block_sparse_moe = SparseMoeBlock(
            layer_index,
            spec.hidden_size,
            spec.intermediate_size,
            spec.num_experts,
            spec.top_k,
            device,
            dtype,
            expert_device=expert_device,
        )

    def forward(
        self, delta: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor, ctx: ForwardContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MoE output, the residual stream before it): the
        residual add of each block is fused into the norm after it, so the
        caller adds the returned delta (next layer's input norm, or the final
        norm). residual None: delta is the embeddings (the first layer)."""
        # delta, residual: [T, H]
        if residual is None:
            residual, normed = delta, self.input_layernorm(delta)
        else:
            residual, normed = self.input_layernorm.add_forward(delta, residual)  # residual + delta, its norm
        attn = self.self_attn(normed, positions, ctx)
        return self.block_sparse_moe.add_norm_forward(attn, residual, self.post_attention_layernorm, ctx.routing)


class MixtralModel(nn.Module):
    def __init__(
        self, spec: MixtralSpec, device: torch.device, dtype: torch.dtype, expert_device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.embed_tokens = Embedding(spec.vocab_size, spec.hidden_size, device, dtype)
        self.layers = nn.ModuleList(
            MixtralDecoderLayer(spec, i, device, dtype, expert_device) for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, device, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        # input_ids, positions: [T] int64 -> [T, H]
        delta, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            delta, residual = layer(delta, residual, positions, ctx)
        return self.norm.add_forward(delta, residual)[1]


_EXPERT_NAME = re.compile(r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight")
_FUSED_NAME = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_FUSED_GATE = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.weight")


class MixtralForCausalLM(nn.Module):
    """Mixtral decoder + LM head. Parameters are allocated uninitialised.

    ``expert_device`` (default ``device``) holds the dense expert stacks;
    ``meta`` allocates nothing for them (their paged replacement is built
    separately, e.g. for synthetic models larger than device memory twice over).
    """

    def __init__(
        self, spec: MixtralSpec, device: torch.device, dtype: torch.dtype, expert_device: torch.device | None = None
    ) -> None:
        super().__init__()
        self.spec = spec
        self.model = MixtralModel(spec, device, dtype, expert_device)
        if spec.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(spec.hidden_size, spec.vocab_size, device, dtype)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Final hidden states [T, H] of the step's tokens (no LM head)."""
        return self.model(input_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        """hidden: [N, H] -> logits [N, vocab], in float32 or (float32=False) in
        the model's dtype: a decode graph picks greedy tokens from those
        directly and leaves the cast to the rows that sample (dataplane/sampler.py)."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        logits = torch.nn.functional.linear(hidden, weight)  # [N, vocab]
        return logits.float() if float32 else logits

    @torch.no_grad()
    def fuse_qkv(self) -> None:
        """Fuses every layer's q/k/v projections (MixtralAttention.fuse_qkv).
        After load_weights: the checkpoint names address the unfused ones."""
        for module in self.modules():
            if isinstance(module, MixtralAttention):
                module.fuse_qkv()

    def use_dense_gemv(self, max_tokens: int) -> None:
        """Every attention projection takes the decode GEMV kernel for batches
        of up to max_tokens rows (MixtralAttention.use_dense_gemv)."""
        for module in self.modules():
            if isinstance(module, MixtralAttention):
                module.use_dense_gemv(max_tokens)

    def use_dense_mma(self, max_tokens: int, tiles: MmaTiles | None = None) -> None:
        """Every attention projection takes the decode tensor-core kernel for
        batches of up to max_tokens rows past the GEMV's
        (MixtralAttention.use_dense_mma)."""
        for module in self.modules():
            if isinstance(module, MixtralAttention):
                module.use_dense_mma(max_tokens, tiles)

    def use_qkv_rotary_gemv(self, on: bool) -> None:
        """Every attention layer's decode steps that take the dense GEMV rotate
        and store k, v in its launch (MixtralAttention.use_qkv_rotary_gemv;
        DataplaneConfig.fuse_qkv_rotary)."""
        for module in self.modules():
            if isinstance(module, MixtralAttention):
                module.use_qkv_rotary_gemv(on)

    def use_pdl(self, policy: PdlPolicy) -> None:
        """Every module that launches a kernel taking part in PDL (those with a
        ``pdl`` attribute: norms, projections, rotary, attention, router,
        paged experts) passes ``policy`` to it (DataplaneConfig.pdl_max_rows).
        A transform: apply after quantize_experts, which replaces the experts."""
        for module in self.modules():
            if hasattr(module, "pdl"):
                module.pdl = policy

    # -- loading -------------------------------------------------------------
    @torch.no_grad()
    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies checkpoint tensors into the parameters, one at a time.

        Accepts classic names (``...experts.N.w1.weight``) and fused
        transformers-5 names (``...mlp.experts.gate_up_proj``). Raises
        ValueError for an unknown name or a wrong shape, and when a parameter
        was not fully covered by the checkpoint.
        """
        params = dict(self.named_parameters())
        filled: dict[str, int] = {}  # param name -> expert slices filled (1 for plain params)
        for name, tensor in tensors:
            for target, index, value in self._map_tensor(name, tensor):
                if target not in params:
                    raise ValueError(f"checkpoint tensor {name!r} has no matching parameter {target!r}")
                dest = params[target] if index is None else params[target][index]
                if tuple(dest.shape) != tuple(value.shape):
                    raise ValueError(f"{name}: shape {tuple(value.shape)} != expected {tuple(dest.shape)}")
                dest.copy_(value)
                filled[target] = filled.get(target, 0) + 1
        missing = []
        for target, param in params.items():
            want = self.spec.num_experts if target.endswith(("experts.w1", "experts.w2", "experts.w3")) else 1
            if filled.get(target, 0) < want:
                missing.append(target)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")

    def _map_tensor(self, name: str, tensor: torch.Tensor) -> list[tuple[str, int | None, torch.Tensor]]:
        """(parameter name, expert index or None, value) pieces of one checkpoint tensor."""
        if name == "lm_head.weight" and self.lm_head is None:
            return []  # tied: the embedding is the head
        if match := _EXPERT_NAME.fullmatch(name):
            layer, expert, which = match.groups()
            return [(f"model.layers.{layer}.block_sparse_moe.experts.{which}", int(expert), tensor)]
        if match := _FUSED_NAME.fullmatch(name):
            layer, which = match.groups()
            prefix = f"model.layers.{layer}.block_sparse_moe.experts"
            if which == "down_proj":
                return [(f"{prefix}.w2", e, tensor[e]) for e in range(tensor.shape[0])]
            ffn = tensor.shape[1] // 2  # gate rows first, then up rows
            return [
                piece
                for e in range(tensor.shape[0])
                for piece in ((f"{prefix}.w1", e, tensor[e, :ffn]), (f"{prefix}.w3", e, tensor[e, ffn:]))
            ]
        if match := _FUSED_GATE.fullmatch(name):
            return [(f"model.layers.{match.group(1)}.block_sparse_moe.gate.weight", None, tensor)]
        return [(name, None, tensor)]
