"""Expert activity table of one dataplane, fed by its TelemetryReports.

Per (layer, expert) it keeps exponentially decayed sums of routed tokens and
router probability mass: on a report covering window_ms,

    acc <- acc * 0.5 ** (window_ms / half_life_ms) + window_value

so a window contributes half as much one half-life later. Shares are the sums
normalized per layer (every token passes every layer, so per-layer
distributions are comparable across layers). Running demand is not decayed:
it is the latest report's snapshot of the requests running now.

Before any routed token is seen the shares are uniform (nothing is known, so
no expert is favoured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MS_PER_S = 1000.0


def normalize_rows(values: np.ndarray) -> np.ndarray:
    """Each row divided by its sum; rows summing to 0 become uniform.

    values: [layers, experts] non-negative -> [layers, experts], rows sum to 1.
    """
    sums = values.sum(axis=1, keepdims=True)  # [layers, 1]
    uniform = np.full_like(values, 1.0 / values.shape[1], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.where(sums > 0.0, values / np.where(sums > 0.0, sums, 1.0), uniform)
    return shares.astype(np.float64)


@dataclass(frozen=True)
class ActivitySnapshot:
    """Immutable per-layer distributions over experts, each [layers, experts]
    with rows summing to 1 (uniform where nothing was observed)."""

    routed_share: np.ndarray  # [layers, experts] decayed routed-token share
    prob_share: np.ndarray  # [layers, experts] decayed router prob mass share
    demand_share: np.ndarray  # [layers, experts] latest running demand share
    has_demand: bool  # False when no request was running at the last report
    # Sequences running at the last report: each adds one routing
    # distribution (rows summing to 1) to the running demand.
    running_seqs: float = 0.0


class ActivityTable:
    """Decayed routing statistics of one dataplane. Not thread-safe: the
    owner (the dataplane registry) serializes access."""

    def __init__(self, num_layers: int, num_experts: int, half_life_s: float) -> None:
        if num_layers <= 0 or num_experts <= 0:
            raise ValueError("num_layers and num_experts must be positive")
        if half_life_s <= 0.0:
            raise ValueError("half_life_s must be positive")
        self.num_layers = num_layers
        self.num_experts = num_experts
        self._half_life_ms = half_life_s * MS_PER_S
        shape = (num_layers, num_experts)
        self._routed = np.zeros(shape, dtype=np.float64)  # [layers, experts]
        self._prob = np.zeros(shape, dtype=np.float64)  # [layers, experts]
        self._demand = np.zeros(shape, dtype=np.float64)  # [layers, experts]
        self.reports = 0

    def decay_factor(self, window_ms: float) -> float:
        """Weight left to the past after a window of window_ms."""
        return float(0.5 ** (max(window_ms, 0.0) / self._half_life_ms))

    def update(
        self,
        window_ms: float,
        routed_tokens: np.ndarray | None,
        router_prob_mass: np.ndarray | None,
        running_demand: np.ndarray | None,
    ) -> None:
        """Folds one report in. Each array is [layers * experts] row-major or
        None (the report carried nothing: a zero window for the sums, no
        running requests for the demand). Raises ValueError on a bad shape or
        negative/non-finite values; the table is unchanged then."""
        routed = self._checked(routed_tokens, "routed_tokens")
        prob = self._checked(router_prob_mass, "router_prob_mass")
        demand = self._checked(running_demand, "running_demand")
        decay = self.decay_factor(window_ms)
        self._routed = self._routed * decay + routed
        self._prob = self._prob * decay + prob
        self._demand = demand
        self.reports += 1

    def _checked(self, values: np.ndarray | None, name: str) -> np.ndarray:
        shape = (self.num_layers, self.num_experts)
        if values is None or len(values) == 0:
            return np.zeros(shape, dtype=np.float64)
        arr = np.asarray(values, dtype=np.float64)
        if arr.size != self.num_layers * self.num_experts:
            raise ValueError(
                f"{name} has {arr.size} entries, expected num_layers*num_experts = "
                f"{self.num_layers * self.num_experts}"
            )
        if not np.all(np.isfinite(arr)) or np.any(arr < 0.0):
            raise ValueError(f"{name} must be finite and non-negative")
        return arr.reshape(shape)

    def snapshot(self) -> ActivitySnapshot:
        """The current distributions (copies)."""
        return ActivitySnapshot(
            routed_share=normalize_rows(self._routed),
            prob_share=normalize_rows(self._prob),
            demand_share=normalize_rows(self._demand),
            has_demand=bool(self._demand.sum() > 0.0),
            running_seqs=float(self._demand.sum(axis=1).mean()),
        )
