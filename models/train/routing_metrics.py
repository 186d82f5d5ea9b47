"""Expert-usage statistics: how differently domains use the experts.

Inputs are routing counts [layers, experts] per domain (how many (token, slot)
routings each expert received). All divergences are in bits (log base 2), so
the Jensen-Shannon divergence lies in [0, 1]: 0 for identical usage, 1 for
disjoint expert sets.
"""

from __future__ import annotations

import itertools

import torch

COLD_SHARE = 0.05  # an expert below this share of a domain's routings is "cold" for it
HOT_COVERAGE = 0.9  # "hot set": the fewest experts that take this share of a domain's routings


def usage_fractions(counts: torch.Tensor) -> torch.Tensor:
    """[layers, E] counts -> [layers, E] fractions (rows sum to 1)."""
    counts = counts.double()
    return counts / counts.sum(dim=-1, keepdim=True).clamp_min(1)


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in bits between distributions along the last dim."""
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        terms = torch.where(a > 0, a * torch.log2(a / b.clamp_min(1e-300)), torch.zeros_like(a))
        return terms.sum(dim=-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def experts_to_cover(fractions: torch.Tensor, share: float = HOT_COVERAGE) -> list[int]:
    """[layers, E] fractions -> per layer, the fewest experts whose shares sum to >= ``share``."""
    ordered = fractions.double().sort(dim=-1, descending=True).values.cumsum(dim=-1)  # [layers, E]
    return [int((row < share - 1e-6).sum()) + 1 for row in ordered]  # 1e-6: float32 inputs


def usage_report(counts: dict[str, torch.Tensor]) -> dict:
    """Per-domain usage, cold experts and pairwise JS divergence, per layer."""
    domains = list(counts)
    fractions = {d: usage_fractions(c) for d, c in counts.items()}
    layers = next(iter(fractions.values())).shape[0]
    per_domain = {}
    for d, frac in fractions.items():
        cold = (frac < COLD_SHARE).sum(dim=-1)  # [layers]
        # share of the domain's routings that its 2 busiest experts take, per layer
        top2 = frac.sort(dim=-1, descending=True).values[:, :2].sum(dim=-1)
        per_domain[d] = {
            "fractions": [[round(float(x), 5) for x in row] for row in frac],
            "cold_experts": [int(x) for x in cold],
            "top2_share": [round(float(x), 4) for x in top2],
            "experts_for_90pct": experts_to_cover(frac),
        }
    pairs = {}
    for a, b in itertools.combinations(domains, 2):
        js = js_divergence(fractions[a], fractions[b])  # [layers]
        pairs[f"{a}|{b}"] = [round(float(x), 5) for x in js]
    mean_js = [round(sum(v[layer] for v in pairs.values()) / max(1, len(pairs)), 5) for layer in range(layers)]
    return {"cold_share_threshold": COLD_SHARE, "per_domain": per_domain, "js_divergence_bits": pairs,
            "mean_js_divergence_bits": mean_js}
