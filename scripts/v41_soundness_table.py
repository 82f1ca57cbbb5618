#!/usr/bin/env python3
"""The table of a soundness sweep (scripts/v41-soundness-sweep.sh): one line per case, the kinds judged by
derived bounds (their rows, how many failed, the largest fraction of an interval used) beside the kinds
still judged by measured budgets (how many rows failed, the first), as markdown on stdout.

    scripts/v41_soundness_table.py TABLE.tsv > docs/results/v41-soundness-sweep.md
Exit 0 when no bounded row failed, 1 when one did, 2 on bad input."""
import csv
import re
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.splitlines()[3].strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[1], newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except OSError as e:
        print(f"v41_soundness_table: {e}", file=sys.stderr)
        return 2
    if not rows or "judged_by" not in rows[0]:
        print(f"v41_soundness_table: {argv[1]}: not a sweep table", file=sys.stderr)
        return 2
    cases: dict[tuple, dict] = {}
    for r in rows:
        key = (r["config"], r["mode"], int(r["N"]), r["weight_seed"], r["input_seed"])
        c = cases.setdefault(key, {"bounded": 0, "bounded_fail": 0, "use": 0.0, "budget": 0, "budget_fail": 0,
                                   "first": ""})
        if r["judged_by"] == "bounds":
            c["bounded"] += 1
            c["bounded_fail"] += r["verdict"] == "FAIL"
            m = re.match(r"([0-9.e+-]+) of an interval used", r["detail"])
            if m and r["kind"].startswith(("logits (forced", "decode logits (forced")):  # the fp32 head's
                c["use"] = max(c["use"], float(m.group(1)))
        elif r["judged_by"] == "budget":
            c["budget"] += 1
            if r["verdict"] == "FAIL":
                c["budget_fail"] += 1
                if not c["first"]:
                    c["first"] = f"layer {r['layer']} {r['kind']}"
    bad = sum(c["bounded_fail"] for c in cases.values())
    print("| config | regime | N | weight / input seed | bounded rows | outside | logits' largest use of its interval "
          "| budget rows | failing | first failing budget row |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (config, mode, n, ws, iseed), c in sorted(cases.items()):
        print(f"| {config} | {mode} | {n} | {ws} / {iseed} | {c['bounded']} | {c['bounded_fail']} | {c['use']:.2%} "
              f"| {c['budget']} | {c['budget_fail']} | {c['first'] or '-'} |")
    failing_budget = sum(1 for c in cases.values() if c["budget_fail"])
    print(f"\n{len(cases)} cases: {bad} bounded rows outside their intervals; the measured budgets fail "
          f"{failing_budget} of {len(cases)} cases.")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
