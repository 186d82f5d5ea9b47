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

        importance = E * (w_share * share + w_prob * prob + w_demand * demand)
                         / (w_share + w_prob + w_demand)
                     + importance_floor

    where share, prob and demand are per-layer distributions over the E
    experts (decayed routed-token share, decayed router probability mass,
    running demand; uniform when nothing is known). A uniformly routed expert
    has importance 1 + importance_floor.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Watermarks copied into every plan: demote when free pages fall below
    # low_watermark of the pool, promote only while they stay above
    # high_watermark. The band between them is the hysteresis.
    low_watermark: float = Field(default=0.05, ge=0.0, le=1.0)
    high_watermark: float = Field(default=0.15, ge=0.0, le=1.0)
    # A block keeps its bitwidth at least this long after a change.
    min_residence_ms: int = Field(default=2000, ge=0)
    # Host-to-device bytes per second the dataplane may spend on promotions.
    promotion_bytes_per_s: int = Field(default=2 * GIB, ge=0)

    # Importance weights (formula above).
    weight_share: float = Field(default=0.5, ge=0.0)
    weight_prob: float = Field(default=0.3, ge=0.0)
    weight_demand: float = Field(default=0.2, ge=0.0)
    # Added to every importance so that never-routed experts are still
    # ordered by their sensitivity instead of all costing zero.
    importance_floor: float = Field(default=0.01, ge=0.0)

    # Minimum bits of a block when no floor applies to it. 2 keeps host-only
    # (0) off unless an operator sets a floor of 0.
    default_floor_bits: int = 2
    # Host-to-device bandwidth of an on-demand fetch of a host-only block.
    host_bandwidth_bytes_per_s: float = Field(default=25e9, gt=0.0)
    # Quality units charged per second of expected fetch stall per token:
    # converts the host-only rung's stall into the sensitivity table's units
    # (tune it to the table). The default suits the fallback error model: a
    # uniformly routed Mixtral-8x7B block then costs ~3x more per byte to
    # send to the host than its 3->2 demotion, while an expert routed ~10x
    # less than average goes to the host before losing its third bit.
    host_stall_cost_per_s: float = Field(default=1e10, ge=0.0)

    @model_validator(mode="after")
    def _check(self) -> PlannerConfig:
        if self.low_watermark > self.high_watermark:
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
        return self
