"""Typed configuration of the controlplane process.

The only place in the controlplane that reads environment variables: every
field can be set as ``PW_CONTROLPLANE_<FIELD>`` (e.g.
``PW_CONTROLPLANE_PORT=50052``), planner fields as
``PW_CONTROLPLANE_PLANNER__<FIELD>`` (e.g.
``PW_CONTROLPLANE_PLANNER__LOW_WATERMARK=0.1``), and the admin tokens as a
JSON list (``PW_CONTROLPLANE_ADMIN_TOKENS='["t1","t2"]'``). Explicit
constructor arguments (the command line) win over the environment. The config
is validated once here and passed down explicitly.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

GIB = 1 << 30

# Bitwidths an operator may name: the weight views of WEIGHT_LAYOUT.md plus
# 0 = host-only.
ALLOWED_BITS = (0, 2, 3, 4, 6, 8)


class PlannerConfig(BaseModel):
    """Parameters of the precision planner (controlplane/planner.py).

    Importance of expert e in layer l (see planner.expert_importance):

        mix = (w_share * share + w_prob * prob + w_demand * demand)
              / (w_share + w_prob + w_demand)
        importance = (E * mix) ** importance_exponent + importance_floor

    where share, prob and demand are per-layer distributions over the E
    experts (decayed routed-token share, decayed router probability mass,
    running demand; uniform when nothing is known). A uniformly routed expert
    has importance 1 + importance_floor whatever the exponent.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Watermarks copied into every plan: demote when free pages fall below
    # low_watermark of the pool, promote only while they stay above
    # high_watermark. The band between them is the hysteresis. None (the
    # default) leaves them out of the plan, so each dataplane keeps its own,
    # derived from the KV pages one of its steps can take
    # (dataplane/precision/ladder.py step_watermarks): one fraction for every
    # arena size held ~7 GB free on a Mixtral-8x7B arena at 15 %.
    low_watermark: float | None = Field(default=None, ge=0.0, lt=1.0)
    high_watermark: float | None = Field(default=None, ge=0.0, lt=1.0)
    # A block keeps its bitwidth at least this long after a change.
    min_residence_ms: int = Field(default=2000, ge=0)
    # Host-to-device bytes per second the dataplane may spend on promotions.
    promotion_bytes_per_s: int = Field(default=2 * GIB, ge=0)

    # Importance weights (formula above).
    weight_share: float = Field(default=0.5, ge=0.0)
    weight_prob: float = Field(default=0.3, ge=0.0)
    weight_demand: float = Field(default=0.2, ge=0.0)
    # How a block's cost grows with its expert's routed share (relative to
    # an even share). The calibrated table holds the KL of a block at an
    # even share; the per-expert KL measured on the default model grows
    # about as share^1.8 (the quantized expert's error reaches more tokens
    # *and* the router leans on it harder), so 1 (linear) under-protects hot
    # experts, but the table's errors grow with the exponent too. Chosen on
    # the VALIDATION split (benchmarks/importance_exponent.py ->
    # benchmarks/results/importance_exponent_cpu.json): geometric-mean KL
    # ratio to the best fitting uniform over mix/python/german x budgets
    # uniform-3, 3.5, 4: 1.0 -> 0.632, 1.25 -> 0.619, 1.5 -> 0.622,
    # 1.8 -> 0.633, 2.0 -> 0.640, 2.5 -> 0.691.
    importance_exponent: float = Field(default=1.25, gt=0.0, le=4.0)
    # Added to every importance so that never-routed experts are still
    # ordered by their sensitivity instead of all costing zero.
    importance_floor: float = Field(default=0.01, ge=0.0)

    # Minimum bits of a block when no floor applies to it. 2 keeps host-only
    # (0) off unless an operator sets a floor of 0.
    default_floor_bits: int = 2
    # The host-only rung (rungs.RungCost): the MoE kernels read a host-only
    # block in place from pinned host memory at its master view for each use
    # (bytes = its 8-bit footprint; dataplane/weights/store.py), so its
    # quality is the master's and its cost the expected read stall per
    # token, priced in the sensitivity table's units:
    #
    #   stall_s/step = read_prob * (host_read_latency_s + bytes / host_bw)
    #   read_prob = 1 - (1 - route_prob)^B     (B: host_price_batch)
    #   cost = host_stall_weight * worst_cost * stall_s / reference_step_s
    #
    # with worst_cost = the table's predicted cost of every block at its
    # lowest view. The stated argument: a stall that adds one decode step to
    # every token (latency x2, throughput /2) is as bad as the worst state the
    # ladder can reach without host-only (the whole model at its lowest
    # view); smaller stalls cost proportionally. host_stall_weight scales
    # that exchange rate (1 = the argument as stated). The quality-per-stall-
    # second constant is therefore worst_cost / reference_step_s, in the
    # table's own units (nats of KL per token for a calibrated table; the
    # fallback model's units otherwise). At batch 1 a token waits for the
    # read only if it routes to the expert (route_prob); a batch waits if any
    # of its tokens does (host_price_batch).
    # Rate of a kernel's reads from pinned host memory: 43.7-48.3 GB/s for
    # 8-64 MB reads on the H100 (benchmarks/host_read_probe.py,
    # host_read_probe_h100_s53.json). (Until session 54, when a use fetched
    # the block into arena pages first: 25 GB/s.)
    host_bandwidth_bytes_per_s: float = Field(default=45e9, gt=0.0)
    # Fixed cost of one host read beside bytes / bandwidth: the same probe
    # read one default-model block (114 KB at 8 bits) from the host ~6 us
    # slower than from the arena, 2.5 us of it the bytes; 5 us. (Until session
    # 54 a use fetched the block first: 0.33 ms, measured on the H100.)
    host_read_latency_s: float = Field(default=5e-6, ge=0.0)
    # Decode step the stall is compared with. Measured: the default model
    # decodes 1430-1807 tokens/s at batch 1 on the H100 with CUDA graphs in
    # uniform 3-bit (host_only_cost_*_h100_s53.json, three machines):
    # 0.55-0.70 ms per step; 0.67 ms, the run beside the hull plans' mix.
    # (Until session 53: 18.9 ms, an H200 measurement from before the fused
    # kernels and graphs, which priced stalls ~28x too cheap.)
    reference_step_s: float = Field(default=6.7e-4, gt=0.0)
    # Dimensionless scale of the exchange rate above (0: stalls are free).
    host_stall_weight: float = Field(default=1.0, ge=0.0)
    # The decode batch the stall is priced at. A step of B sequences reads a
    # host-only block once if any of them routes to it, with chance
    # 1 - (1 - route_prob)^B, and the read delays all B: the stall per step
    # is that chance times the read, compared with reference_step_s (a
    # decode step's time grows little with B: 0.37-0.40 ms at B = 1 and
    # 0.57-0.71 ms at B = 16 for the default model at uniform 3 bits on the H100,
    # host_only_cost_*_u3_inplace_h100_s54.json). At B = 1 this is the
    # per-token price above. 0: the running batch of the last report (the
    # running demand's sequences, at least 1); n >= 1: as if n sequences
    # decode together. Not modelled: reads of one step contend (measured
    # 7-10 us a read at B = 1, 15-19 us at B = 4-16), so at batch the price
    # is still about 2x low.
    host_price_batch: int = Field(default=0, ge=0)
    # Extra time of every step while any block is host-only, whatever the
    # reads: priced as a stall every token pays, in the same exchange rate,
    # on a budget state that keeps any block on the host (build_ladder then
    # keeps host-only out of the budget state unless the budget needs it or
    # it is predicted cheaper even so). 0 by default: the kernels read
    # host-only blocks in place, in the same launches and CUDA graphs as
    # resident ones. (In session 53, when a use fetched the block and every
    # step ran eagerly, 5.6-8.8 ms were measured on the H100 and 9 ms priced.)
    host_only_step_overhead_s: float = Field(default=0.0, ge=0.0)

    # With a memory budget, compare the predicted cost of the greedy
    # budget state with the state that puts every movable block at the
    # highest single view that fits (the best static uniform bitwidth), and
    # walk to the cheaper one first. The greedy walk is not optimal when a
    # block's steps are not convex in cost per byte, or when the last rung
    # overshoots the budget; this guard makes the plan never predicted worse
    # than the uniform bitwidth that fits.
    uniform_guard: bool = True
    # How much cheaper (relative) the greedy state must be predicted than the
    # uniform one to be chosen over it, when the uniform fit is a single-view
    # state (a budget at or just above a view's bytes; between views both
    # candidates are mixed and the cheaper wins). Two measured reasons not to
    # trade a uniform state for a predicted gain of a few percent:
    # * the table over-predicted the gain on the default model's validation
    #   split by up to ~3 points on the mix workload (greedy state predicted
    #   8.2 % / 2.4 % cheaper at the uniform-3 / uniform-4 budgets,
    #   allocation_bound_cpu.json; measured 5.3 % / 0.3 %,
    #   importance_exponent_cpu.json; gains above ~14 % were under-predicted);
    # * mixed bitwidths cost the fused MoE kernel 2-7 % of speed against the
    #   uniform view of the same bytes (moe_h200_s4.json, Mixtral B = 1..64).
    uniform_guard_margin: float = Field(default=0.03, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _check(self) -> PlannerConfig:
        if self.low_watermark is not None and self.high_watermark is not None \
                and self.low_watermark > self.high_watermark:
            raise ValueError("low_watermark must not exceed high_watermark")
        if self.weight_share + self.weight_prob + self.weight_demand <= 0.0:
            raise ValueError("importance weights must not all be zero")
        if self.default_floor_bits not in ALLOWED_BITS:
            raise ValueError(f"default_floor_bits must be one of {ALLOWED_BITS}")
        return self


class ControlplaneConfig(BaseSettings):
    """Everything the controlplane process needs to start."""

    model_config = SettingsConfigDict(
        env_prefix="PW_CONTROLPLANE_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    host: str = "127.0.0.1"
    # 0 picks a free port; `python -m controlplane` prints the bound address.
    port: int = Field(default=50052, ge=0, le=65535)
    # SQLite file holding floors, pins, budgets and the plan-id counter.
    db_path: str = "controlplane.sqlite3"
    # Tokens accepted in "authorization: Bearer <token>" on Admin calls. At
    # least one is required: an Admin service without auth is never served.
    admin_tokens: tuple[str, ...] = ()
    # Tokens a dataplane must send the same way on its Telemetry stream
    # (PW_CONTROLPLANE_TELEMETRY_TOKENS='["t"]'). Empty: the stream is open
    # to any dataplane that can reach the port (a warning is logged).
    telemetry_tokens: tuple[str, ...] = ()
    # Prometheus /metrics over HTTP on metrics_host:metrics_port; 0 disables it.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # gRPC worker threads; every connected dataplane holds one for its stream.
    max_workers: int = Field(default=32, ge=4)
    # Largest message sent or received (a plan of a large MoE is megabytes).
    max_message_bytes: int = Field(default=64 << 20, ge=4 << 20)

    # Half-life of the decayed activity table (routing share, prob mass).
    activity_half_life_s: float = Field(default=60.0, gt=0.0)
    # Re-plan when the importance of some layer moved by more than this total
    # variation distance since the last plan.
    activity_shift_threshold: float = Field(default=0.05, gt=0.0, le=1.0)
    # At most one plan per dataplane per this interval (the first plan of a
    # connection is sent at once).
    plan_min_interval_s: float = Field(default=1.0, ge=0.0)

    planner: PlannerConfig = PlannerConfig()

    @model_validator(mode="after")
    def _check(self) -> ControlplaneConfig:
        if not self.admin_tokens or any(not t for t in self.admin_tokens):
            raise ValueError("at least one non-empty admin token is required")
        if any(not t for t in self.telemetry_tokens):
            raise ValueError("telemetry tokens must not be empty")
        return self
