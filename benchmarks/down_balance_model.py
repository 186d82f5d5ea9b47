"""The balanced down launch's shares under a cost table, timed by given
per-view group costs (CPU, instant).

    .venv/bin/python benchmarks/down_balance_model.py --times 2=233,6=383 [--views 2,6] [--programs 8]
    .venv/bin/python benchmarks/down_balance_model.py --from-json benchmarks/results/moe_views_b16_h100_s49.json

The balanced down launch (kernels/moe_down.py, down_program) lays a row
tile's active experts end to end, each group weighted by its view's cost
(MoeTuning.down_group_cost), and gives program p of P the groups whose first
unit falls in [p total / P, (p + 1) total / P). Given each view's true time
per group, a program's predicted time is the sum over its groups and the
launch's the longest program's (fixed costs per program or per expert
range left out). For the mixed state of bench_moe.py (even experts at the
low view, odd at the high one) it prints, per cost table (the shipped one,
the one derived from the times, each with and without the zigzag order),
the longest program over the ideal (total / P) and how many programs start
a second expert's range. Writes nothing.

Which per-group times to give is the open part. The uniform launches' own
times (--from-json) mispredict: on the H100 (session 49) they ran 2 / 4 / 6
bits in 66.6 / 96.9 / 131.7 us, from which the model gives the then shipped
table (8, 10, 11, 13, 15) +7.9 % on the 6-bit programs and the derived (8,
10, 12, 16, ...) +0.7 %, yet mixed 2/6's down launch came within +1.5 % of
its views' mean under the shipped table, and the derived one made the layer
3.1 % slower (moe_views_b16_h100_s49.json, moe_down_cost_h100_s49.json).
Probably (a guess, not profiled) a uniform 6-bit launch is bandwidth-bound
where a mixed one is not, so its time overstates a 6-bit group's cost in a
mixed launch; the SASS instruction counts of the 8-token loops (233 / 383 at
2 / 6 bits, benchmarks/sass_loops.py) keep its ratio. Session 52
went the other way on the H100 and found flatter tables faster
(moe_down_cost_*_h100_s52.json): the shipped table is now (16, 18, 19, 21,
23), whose 6 : 2 ratio of 1.31 is under the uniform down launches' 1.75 at
B=32 (135.8 / 77.7 us, moe_zigzag_b16_h100_s52.json), where this model would
call the 6-bit programs overloaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.moe_tuning import DOWN_GROUP_COST  # noqa: E402
from kernels.weight_layout import VIEW_BITS  # noqa: E402

MIXTRAL_DOWN_GROUPS = 14336 // 128  # groups of 128 along the down blocks' K (ffn)


def plan_order(n: int, zigzag: bool) -> list[int]:
    """The order in which the plan lays out n active slots (numbered
    costliest first, as moe_align numbers them); kernels/moe_down.py
    _plan_order."""
    if not zigzag:
        return list(range(n))
    half = (n + 1) // 2
    pos = [2 * e if e < half else 2 * (n - 1 - e) + 1 for e in range(n)]
    return sorted(range(n), key=lambda e: pos[e])


def program_groups(units: list[int], n_groups: int, programs: int) -> list[list[tuple[int, int]]]:
    """units: the cost of one group of each expert, in plan order. -> per
    program, its (expert position, groups) pairs, by down_program's integer
    share arithmetic."""
    total = sum(units) * n_groups
    shares = []
    for p in range(programs):
        lo, hi = p * total // programs, (p + 1) * total // programs
        begin, taken = 0, []
        for pos, c in enumerate(units):
            finish = begin + c * n_groups
            if c > 0 and finish > lo and begin < hi:
                g0 = max(lo - begin + c - 1, 0) // c
                g1 = min(max(hi - begin + c - 1, 0) // c, n_groups)
                if g0 < g1:
                    taken.append((pos, g1 - g0))
            begin = finish
        shares.append(taken)
    return shares


def imbalance(slot_views: list[int], costs: tuple[int, ...], group_time: dict[int, float], n_groups: int,
              programs: int, zigzag: bool) -> dict:
    """slot_views: the down view (bits) of each active slot. -> the longest
    program's predicted time over the ideal, and the programs that take
    more than one expert's range."""
    unit = {bits: costs[VIEW_BITS.index(bits)] for bits in set(slot_views)}
    # moe_align: costliest first, ties keep the slot order
    slots = sorted(range(len(slot_views)), key=lambda s: -unit[slot_views[s]])
    laid = [slots[i] for i in plan_order(len(slots), zigzag)]
    shares = program_groups([unit[slot_views[s]] for s in laid], n_groups, programs)
    times = [sum(group_time[slot_views[laid[pos]]] * g for pos, g in share) for share in shares]
    ideal = sum(group_time[v] for v in slot_views) * n_groups / programs
    if sum(g for share in shares for _, g in share) != n_groups * len(slot_views):
        raise AssertionError("the shares do not cover every group once")
    return dict(longest_over_ideal=max(times) / ideal, straddling=sum(len(share) > 1 for share in shares))


def derived_costs(group_time: dict[int, float], shipped: tuple[int, ...]) -> tuple[int, ...]:
    """The table whose ratios are the measured times', scaled so that the
    cheapest measured view keeps its shipped cost; unmeasured views keep
    theirs."""
    base = min(group_time, key=group_time.get)
    scale = shipped[VIEW_BITS.index(base)] / group_time[base]
    return tuple(round(group_time[b] * scale) if b in group_time else c for b, c in zip(VIEW_BITS, shipped))


def times_from_bench(path: Path, batch: int) -> dict[int, float]:
    """The uniform views' down-launch us at `batch` from a bench_moe.py JSON."""
    rows = json.loads(path.read_text())["moe"]
    return {int(r["bits"]): r["stage_us"]["down"] for r in rows
            if r.get("batch") == batch and "stage_us" in r and r["bits"].isdigit()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-json", type=Path, help="bench_moe.py output with per-launch rows")
    src.add_argument("--times", help="uniform down-launch us per view, e.g. 2=68.3,4=100.1,6=135.8")
    ap.add_argument("--batch", type=int, default=16, help="the rows of --from-json to read")
    ap.add_argument("--views", default="2,6", help="the mixed state's low and high down views")
    ap.add_argument("--experts", type=int, default=8, help="active experts (half at each view)")
    ap.add_argument("--programs", type=int, default=8, help="programs per row tile")
    ap.add_argument("--groups", type=int, default=MIXTRAL_DOWN_GROUPS, help="groups along K per expert")
    args = ap.parse_args(argv)
    if args.from_json:
        group_time = times_from_bench(args.from_json, args.batch)
    else:
        try:
            group_time = {int(k): float(v) for k, v in (kv.split("=") for kv in args.times.split(","))}
        except ValueError:
            ap.error(f"--times must be a comma list of bits=time, got {args.times!r}")
    low, high = (int(v) for v in args.views.split(","))
    missing = {low, high} - set(group_time)
    if missing:
        ap.error(f"no uniform down time for views {sorted(missing)} (have {sorted(group_time)})")
    slot_views = [low if e % 2 == 0 else high for e in range(args.experts)]
    tables = {"shipped": DOWN_GROUP_COST, "derived": derived_costs(group_time, DOWN_GROUP_COST)}
    print(f"time per group by view: {group_time}")
    print("table    costs (2/3/4/6/8 bits)   zigzag  longest/ideal  straddling")
    for name, costs in tables.items():
        for zigzag in (False, True):
            r = imbalance(slot_views, costs, group_time, args.groups, args.programs, zigzag)
            print(f"{name:8s} {str(costs):24s} {str(zigzag):7s} {r['longest_over_ideal']:13.3f} "
                  f"{r['straddling']:5d} of {args.programs}")


if __name__ == "__main__":
    main()
