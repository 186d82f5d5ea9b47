"""Builds an Engine from a DataplaneConfig: model, memory plan, arena, KV.

Memory: the model's parameters and a step workspace are fixed residents; the
rest of the budget becomes ONE arena of pages of ``kv_block_bytes`` (one KV
block for all layers), from which KV blocks (and later expert-weight pages)
are allocated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from dataplane.checkpoint import Checkpoint, TokenizerInfo
from dataplane.config import DataplaneConfig
from dataplane.engine import Engine
from dataplane.cuda_graphs import DecodeGraphs
from dataplane.kv_cache import KVCacheManager, blocks_for_tokens, kv_block_bytes
from dataplane.memory.arena import Arena
from dataplane.model_info import ModelInfo
from dataplane.models.mixtral import MixtralSpec
from dataplane.models.registry import build_model
from dataplane.models.synthetic import build_synthetic, synthetic_expert_blocks
from dataplane.runner import ModelRunner
from dataplane.sampler import Sampler
from dataplane.precision.controller import PrecisionController
from dataplane.precision.ladder import WalkLimits, step_watermarks
from dataplane.scheduler import ReclaimPages, Scheduler, SchedulerConfig
from dataplane.weights.layout import expert_tile_bytes
from dataplane.weights.transform import quantize_experts
from kernels.moe_workspace import workspace_bytes
from kernels.paged_attention import MIN_DOT
from kernels.pdl import PdlPolicy

log = logging.getLogger(__name__)

# Activations alive at once per batched token, in hidden-size units: residual,
# normed input, attention output, MoE output, and the q/k/v projections.
WORKSPACE_HIDDEN_COPIES = 8
LOGITS_COPIES = 3  # logits, softmax and the sampler's filtered copy (float32)
FLOAT32_BYTES = 4
PAGE_ALIGN = 16  # smallest page the arena accepts


@dataclass(frozen=True)
class MemoryPlan:
    """How the budget splits: fixed residents, then arena pages."""

    param_bytes: int
    workspace_bytes: int
    page_bytes: int
    num_pages: int

    @property
    def fixed_resident_bytes(self) -> int:
        return self.param_bytes + self.workspace_bytes


def resident_bytes(model: nn.Module, exclude: Callable[[str], bool] | None = None) -> int:
    """Bytes of the model's parameters and buffers (shared tensors once).

    ``exclude(name)`` drops tensors that will not stay resident, e.g. the
    dense experts once a weight store moves them into the arena.
    """
    seen: set[int] = set()
    total = 0
    named = list(model.named_parameters()) + list(model.named_buffers())
    for name, tensor in named:
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen or (exclude is not None and exclude(name)):
            continue
        seen.add(ptr)
        total += tensor.untyped_storage().nbytes()
    return total


def estimate_workspace_bytes(spec: MixtralSpec, config: DataplaneConfig, dtype: torch.dtype) -> int:
    """Peak activation bytes of one step (an estimate, counted as resident).

    The MoE block takes the larger of its two paths: the torch path's gate,
    up and SiLU outputs, or the fused kernels' scratch (kernels/moe_workspace.py:
    fp32 gate/up pre-activations, two planes of h and of x, the fp32 output)."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = config.max_batched_tokens
    torch_moe = tokens * spec.top_k * 3 * spec.intermediate_size * elem
    fused_moe = workspace_bytes(tokens, spec.top_k, spec.hidden_size, spec.intermediate_size, spec.num_experts)
    logits = config.max_running_seqs * spec.vocab_size * FLOAT32_BYTES * LOGITS_COPIES
    return tokens * WORKSPACE_HIDDEN_COPIES * spec.hidden_size * elem + max(torch_moe, fused_moe) + logits


def plan_memory(
    config: DataplaneConfig,
    spec: MixtralSpec,
    model: nn.Module,
    device: torch.device,
    dtype: torch.dtype,
    exclude: Callable[[str], bool] | None = None,
) -> MemoryPlan:
    """Sizes the arena from the budget; ValueError when the budget cannot hold the model.

    ``exclude``: see ``resident_bytes``.
    """
    block = kv_block_bytes(config.kv_block_size, spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype)
    # The widest 64-row tile of an expert field must fit a page (it may then
    # straddle at most one boundary, which the MoE kernels handle).
    tile = expert_tile_bytes(spec.hidden_size, spec.intermediate_size)
    # A power of two: weight pages are addressed with shifts (docs/WEIGHT_LAYOUT.md);
    # a KV block smaller than its page just leaves the page's tail unused.
    page_bytes = max(PAGE_ALIGN, 1 << (max(block, tile) - 1).bit_length())
    params = resident_bytes(model, exclude)
    workspace = (
        config.workspace_bytes
        if config.workspace_bytes is not None
        else estimate_workspace_bytes(spec, config, dtype)
    )
    if config.memory_budget_bytes is not None:
        pool = config.memory_budget_bytes - params - workspace
        if pool < page_bytes:
            raise ValueError(
                f"memory budget {config.memory_budget_bytes / 2**30:.2f} GiB leaves no room for KV: "
                f"parameters take {params / 2**30:.2f} GiB and the workspace {workspace / 2**30:.2f} GiB"
            )
    elif device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        pool = int(free * config.gpu_memory_utilization) - workspace
    else:
        pool = config.cpu_arena_bytes
    num_pages = pool // page_bytes
    if config.max_arena_pages is not None:
        num_pages = min(num_pages, config.max_arena_pages)
    if num_pages < 1:
        raise ValueError(f"no memory left for even one KV block of {page_bytes} bytes")
    return MemoryPlan(params, workspace, page_bytes, num_pages)


def load_model(
    config: DataplaneConfig, device: torch.device, dtype: torch.dtype, *, dense_experts: bool = True
) -> tuple[ModelInfo, nn.Module]:
    """The model (from its folder or synthetic) and what to tell clients about it.

    dense_experts=False (synthetic only): expert stacks stay on ``meta``; the
    caller pages them from ``synthetic_expert_blocks``.
    """
    if config.synthetic is not None:
        spec, model = build_synthetic(config.synthetic, device, dtype, seed=config.seed, dense_experts=dense_experts)
        _fuse_projections(model, device, config)
        return _model_info(config, spec, config.synthetic, "", None), model
    assert config.model_path is not None
    ckpt = Checkpoint(config.model_path)
    tokenizer = ckpt.tokenizer_info()
    model = build_model(ckpt.spec, device, dtype)
    model.load_weights(ckpt.iter_tensors(device=device))
    _fuse_projections(model, device, config)
    return _model_info(config, ckpt.spec, ckpt.name, str(ckpt.path.resolve()), tokenizer), model.eval()


def _fuse_projections(model: nn.Module, device: torch.device, config: DataplaneConfig) -> None:
    """Transforms applied to a loaded model (MixtralForCausalLM.fuse_qkv, then
    use_dense_gemv for DataplaneConfig.dense_gemv_max_tokens, use_dense_mma
    for DataplaneConfig.dense_mma_max_tokens and
    use_qkv_rotary_gemv for DataplaneConfig.fuse_qkv_rotary)."""
    if config.fuse_qkv:
        model.fuse_qkv()
        if device.type == "cuda":
            # The unfused weights' blocks go back to the driver: plan_memory sizes
            # the arena from the device's free memory.
            torch.cuda.empty_cache()
    if config.dense_gemv_max_tokens:
        model.use_dense_gemv(config.dense_gemv_max_tokens)
    if config.dense_mma_max_tokens:
        model.use_dense_mma(config.dense_mma_max_tokens)
    model.use_qkv_rotary_gemv(config.fuse_qkv_rotary)


def _model_info(
    config: DataplaneConfig, spec: MixtralSpec, default_name: str, path: str, tokenizer: TokenizerInfo | None
) -> ModelInfo:
    context = spec.max_position_embeddings
    if config.max_context_length is not None:
        context = min(context, config.max_context_length)
    return ModelInfo(
        name=config.model_name or default_name,
        family=spec.family,
        model_path=path,
        context_length=context,
        vocab_size=spec.vocab_size,
        tokenizer_json=tokenizer.tokenizer_json if tokenizer else "",
        chat_template=tokenizer.chat_template if tokenizer else "",
        bos_token=tokenizer.bos_token if tokenizer else "",
        eos_token=tokenizer.eos_token if tokenizer else "",
        eos_token_ids=tokenizer.eos_token_ids if tokenizer else spec.eos_token_ids,
        num_layers=spec.num_layers,
        num_experts=spec.num_experts,
        top_k=spec.top_k,
        hidden_size=spec.hidden_size,
        ffn_size=spec.intermediate_size,
    )


@dataclass
class BuiltEngine:
    """An engine and, with paged experts, the controller of their precision."""

    engine: Engine
    precision: PrecisionController | None


def build_engine(config: DataplaneConfig, reclaim_pages: ReclaimPages | None = None) -> Engine:
    """The engine of ``build`` (see there)."""
    return build(config, reclaim_pages).engine


def is_expert_param(name: str) -> bool:
    """Dense expert tensors, which leave the fixed residents once paged."""
    return ".experts." in name


def build(config: DataplaneConfig, reclaim_pages: ReclaimPages | None = None) -> BuiltEngine:
    """Loads the model, plans memory, builds the arena and wires the engine (not started).

    Steps: ``load_model`` -> ``plan_memory`` -> ``Arena`` -> (paged experts:
    ``quantize_experts`` into the arena, a ``PrecisionController`` whose
    ``reclaim`` the scheduler calls before preempting) -> ``assemble_engine``.
    ``reclaim_pages`` overrides the controller's hook (tests).
    """
    device, dtype = config.resolved_device(), config.resolved_dtype()
    paged = config.expert_precision == "paged"
    # Synthetic paged experts are drawn block by block, never as dense stacks.
    lazy_experts = paged and config.synthetic is not None
    info, model = load_model(config, device, dtype, dense_experts=not lazy_experts)
    plan = plan_memory(config, model.spec, model, device, dtype, exclude=is_expert_param if paged else None)
    arena = Arena(plan.num_pages, plan.page_bytes, device=device)
    controller: PrecisionController | None = None
    before_step = None
    if paged:
        matrices = synthetic_expert_blocks(model.spec, device, config.seed) if lazy_experts else None
        # The model's norms round the experts' float32 output where they add it.
        store = quantize_experts(model, arena, initial_bits=config.initial_expert_bits, matrices=matrices,
                                 accumulator_out=True, fused_entry=config.fuse_moe_entry,
                                 moe_tuning=config.moe_tuning)
        controller = PrecisionController(
            store,
            arena,
            info.num_experts,
            local_walk_limits(config, arena.num_pages),
        )
        if config.dynamic_precision:
            reclaim_pages = reclaim_pages or controller.reclaim
            before_step = controller.on_step
        else:
            before_step = store.poll
    # After quantize_experts: it replaces the experts, whose launches take part too.
    model.use_pdl(PdlPolicy(config.pdl_max_rows, config.pdl_moe_weight_max_rows))
    engine = assemble_engine(
        config, info, model, arena, plan.fixed_resident_bytes, reclaim_pages, before_step=before_step
    )
    return BuiltEngine(engine, controller)


def step_kv_pages(config: DataplaneConfig) -> int:
    """The most KV pages one engine step can allocate: its token budget in
    whole blocks, plus one partly filled block for each running sequence
    (one arena page holds one KV block, dataplane/kv_cache.py)."""
    return blocks_for_tokens(config.max_batched_tokens, config.kv_block_size) + config.max_running_seqs


def local_walk_limits(config: DataplaneConfig, total_pages: int) -> WalkLimits:
    """The controller's limits until a plan sets its own: the configured
    watermarks, or those derived from one step's KV pages where unset (a
    derived one never crosses a configured one)."""
    step = step_kv_pages(config)
    low, high = step_watermarks(step, total_pages)
    if config.low_watermark is not None:
        low = config.low_watermark
        high = max(high, low)
    if config.high_watermark is not None:
        high = config.high_watermark
        low = min(low, high)
    limits = WalkLimits(
        low_watermark=low,
        high_watermark=high,
        min_residence_s=config.min_residence_ms / 1000.0,
        promotion_bytes_per_s=config.promotion_bytes_per_s,
    )
    log.info("local walk limits: watermarks %.4f / %.4f of %d pages (one step: %d KV pages)",
             low, high, total_pages, step)
    return limits


def decode_kernels_supported(block_size: int, spec: MixtralSpec) -> bool:
    """Whether the Triton decode attention handles this geometry (powers of two >= 16, no window)."""

    def pow2_at_least_16(n: int) -> bool:
        return n >= MIN_DOT and n & (n - 1) == 0

    return pow2_at_least_16(block_size) and pow2_at_least_16(spec.head_dim) and spec.sliding_window is None


def assemble_engine(
    config: DataplaneConfig,
    info: ModelInfo,
    model: nn.Module,
    arena: Arena,
    fixed_resident_bytes: int,
    reclaim_pages: ReclaimPages | None = None,
    before_step: Callable[[], None] | None = None,
) -> Engine:
    """Wires KV manager, scheduler, runner and engine around a loaded model and its arena."""
    spec: MixtralSpec = model.spec
    device, dtype = arena.device, config.resolved_dtype()
    log.info(
        "arena: %d pages x %d bytes (%.2f GiB); fixed residents %.2f GiB",
        arena.num_pages,
        arena.page_bytes,
        arena.num_pages * arena.page_bytes / 2**30,
        fixed_resident_bytes / 2**30,
    )
    kv = KVCacheManager(arena, config.kv_block_size, spec.num_layers, spec.num_kv_heads, spec.head_dim, dtype,
                        prefix_caching=config.prefix_caching)
    scheduler = Scheduler(
        SchedulerConfig(config.max_running_seqs, config.max_batched_tokens, info.context_length),
        kv,
        reclaim_pages,
    )
    decode_kernels = device.type == "cuda" and decode_kernels_supported(config.kv_block_size, spec)
    graphs = None
    if decode_kernels and config.cuda_graphs and config.expert_precision == "paged":
        # Dense experts sync with the host per layer; paged (fused) ones can be captured.
        max_blocks = blocks_for_tokens(info.context_length, config.kv_block_size)
        graphs = DecodeGraphs(model, kv, spec.num_layers, spec.num_experts, config.max_running_seqs, max_blocks)
    runner = ModelRunner(
        model,
        kv,
        spec.num_layers,
        spec.num_experts,
        device,
        spec.sliding_window,
        Sampler(config.seed),
        decode_kernels=decode_kernels,
        graphs=graphs,
    )
    return Engine(
        model_info=info,
        scheduler=scheduler,
        runner=runner,
        arena=arena,
        kv=kv,
        fixed_resident_bytes=fixed_resident_bytes,
        max_pending_requests=config.max_pending_requests,
        demand_decay=config.demand_decay,
        before_step=before_step,
        overlap_steps=config.overlap_steps,
    )
