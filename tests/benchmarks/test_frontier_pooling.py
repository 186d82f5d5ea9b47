"""benchmarks/frontier.py: pooling the single-domain workloads into 'each domain under its own plan'."""

from benchmarks.frontier import METHODS, per_domain_plans

U3 = 4096


def _workload(domain: str, kl: dict[str, float]) -> dict:
    methods = {m: {"per_domain": {domain: {"kl": kl[m]}}} for m in METHODS}
    other = {m: {"per_domain": {domain: {"kl": 99.0}}} for m in METHODS}
    return {"eval_domains": [domain], "points": [{"bytes": U3 // 2, "methods": other},
                                                 {"bytes": U3, "methods": methods}]}


def test_pools_kl_sums_at_the_uniform3_budget_only():
    workloads = {
        "a": _workload("a", {"static": 0.2, "planner": 0.1, "planner_no_sensitivity": 0.2, "planner_no_routing": 0.3}),
        "b": _workload("b", {"static": 0.2, "planner": 0.2, "planner_no_sensitivity": 0.1, "planner_no_routing": 0.1}),
    }
    pooled = per_domain_plans(workloads, ["a", "b"], U3)
    assert pooled["domains"] == ["a", "b"]
    assert pooled["planner"]["kl_reduction_vs_uniform3"] == 0.25  # 1 - 0.3 / 0.4
    assert pooled["planner_no_sensitivity"]["kl_reduction_vs_uniform3"] == 0.25
    assert pooled["planner_no_routing"]["kl_reduction_vs_uniform3"] == 0.0
    assert pooled["planner"]["per_domain_kl"] == {"a": 0.1, "b": 0.2}


def test_needs_every_domain_of_the_corpus():
    mix = {"eval_domains": ["a", "b"], "points": []}
    only_a = {"mix": mix, "a": _workload("a", dict.fromkeys(METHODS, 0.1))}
    assert per_domain_plans(only_a, ["a", "b"], U3) is None
    assert per_domain_plans({"mix": mix}, ["a", "b"], U3) is None
    assert per_domain_plans({}, ["a", "b"], U3) is None


def test_expected_fetch_counts_host_only_blocks_by_route_probability():
    import numpy as np

    from benchmarks.frontier import expected_fetch_s_per_token
    from controlplane.config import PlannerConfig
    from controlplane.rungs import ModelShape

    fp = {0: 0, 2: 250, 8: 1000}
    shape = ModelShape(num_layers=2, num_experts=4, top_k=2, view_bits=(2, 8), footprint_bytes=(fp, fp, fp))
    cfg = PlannerConfig(host_read_latency_s=1e-3, host_bandwidth_bytes_per_s=1e6)  # 1 ms + 1 ms a block
    routed = np.array([[10, 6, 4, 0], [5, 5, 5, 5]], dtype=float)  # 10 tokens a layer, top-2
    bits = np.full((2, 4, 3), 8)
    assert expected_fetch_s_per_token(shape, bits, routed, cfg) == 0.0
    bits[0, 1, :2] = 0  # two blocks of an expert 6 of 10 tokens reach: 2 x 0.6 x 2 ms
    bits[0, 3, :] = 0  # never routed: free
    bits[1, 0, 2] = 0  # half the tokens: 0.5 x 2 ms
    assert abs(expected_fetch_s_per_token(shape, bits, routed, cfg) - (2.4e-3 + 1e-3)) < 1e-12
