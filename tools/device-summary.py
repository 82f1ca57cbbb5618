#!/usr/bin/env python3
"""Summary of a GPU check (tools/device-check.sh), stdlib only.

  device-summary.py STEPS_TSV OUT_DIR      -> summary.json on stdout
  device-summary.py --slowest KERNELS_CSV  -> the base name of the kernel with
                                              the largest total time

STEPS_TSV has one line per step: name, verdict, exit code, seconds, note.
The summary collects every verdict, the cuBLAS GEMM rate of the same run, the
bench figures with each backend's FLOP rate as a fraction of that rate (cuda
against f32, cuda-bf16 against bf16), and the profile's key figures.
"""
import csv
import json
import os
import re
import sys
from collections import defaultdict


def kernel_base(name):
    """'void ced::cuda::topk_kernel<4>(float const*, ...)' -> 'topk_kernel'."""
    name = re.sub(r"^\s*void\s+", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # drop the parameter list (outside template brackets)
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut]
    while "<" in name:  # drop template arguments, innermost first
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split("::")[-1].strip()


def slowest_kernel(path):
    totals = defaultdict(float)
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints ==PROF== lines besides the CSV
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}.get(row.get("Metric Unit", ""), 1e-9)
        totals[kernel_base(row["Kernel Name"])] += value * scale
    if not totals:
        return None, {}
    return max(totals, key=totals.get), totals


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def profile_figures(path):
    """Key lines of an `ncu --section ...` text report."""
    keys = ("Achieved Occupancy", "Theoretical Occupancy", "DRAM Throughput", "Memory Throughput",
            "Compute (SM) Throughput", "Duration", "Registers Per Thread", "Block Size", "Grid Size")
    figures, advice = {}, []
    try:
        text = open(path).read()
    except OSError:
        return None
    for line in text.splitlines():
        m = re.match(r"\s*(.+?)\s{2,}(\S+)\s+(\S+)\s*$", line)
        if m and m.group(1) in keys and m.group(1) not in figures:
            figures[m.group(1)] = f"{m.group(3)} {m.group(2)}"  # value, unit
        if re.search(r"\b(OPT|WRN)\b", line):
            advice.append(line.strip()[:240])
    m = re.search(r"^\s*(\S.*?)\s+\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\)", text, re.M)
    return {"kernel": m.group(1) if m else None, "figures": figures, "advice": advice[:6]}


def summary(steps_path, out):
    steps = []
    with open(steps_path) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 5:
                continue
            name, verdict, rc, secs, note = parts[:5]
            steps.append({"step": name, "verdict": verdict, "exit": rc, "seconds": int(secs) if secs.isdigit() else secs,
                          "note": note})
    peak = read_json(os.path.join(out, "gemm-peak.json"))
    peak_tflops = {}
    if peak:
        for r in peak.get("results", []):
            if r.get("shape") == "peak":
                peak_tflops[r["dtype"]] = r["tflops"]
    bench = {}
    for n in (1024, 8192):
        b = read_json(os.path.join(out, f"bench-{n}.json"))
        if not b:
            continue
        for row in b.get("rows", []):
            dtype = "bf16" if row["backend"].endswith("bf16") else "f32"
            if dtype in peak_tflops and peak_tflops[dtype] > 0:
                row["fraction_of_cublas_peak"] = round(row["gflops"] / (1e3 * peak_tflops[dtype]), 4)
        bench[str(n)] = b
    profile = profile_figures(os.path.join(out, "ncu-profile.txt"))
    verdicts = [s["verdict"] for s in steps]
    overall = ("fail" if any(v in ("fail", "timeout") for v in verdicts)
               else "skipped" if verdicts and all(v in ("skipped", "refused", "not-run") for v in verdicts)
               else "pass")
    return {"overall": overall, "steps": steps, "gemm_peak": peak, "bench": bench, "profile": profile}


def main(argv):
    if len(argv) == 3 and argv[1] == "--slowest":
        name, totals = slowest_kernel(argv[2])
        if name is None:
            sys.exit("device-summary: no kernel timings in " + argv[2])
        for k, t in sorted(totals.items(), key=lambda kv: -kv[1])[:10]:
            print(f"{t * 1e3:10.3f} ms  {k}", file=sys.stderr)
        print(name)
        return
    if len(argv) != 3:
        sys.exit(__doc__)
    json.dump(summary(argv[1], argv[2]), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv)
