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
