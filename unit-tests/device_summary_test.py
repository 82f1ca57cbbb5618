#!/usr/bin/env python3
"""tools/device-summary.py on fabricated results of a GPU check: the slowest
kernel is the one with the largest total time (summed over launches, units
honoured); each bench row's FLOP rate becomes a fraction of the same run's
cuBLAS peak of its precision; one failing or timed-out step makes the overall
verdict fail; refusals and skips never make it pass."""
import json
import os
import subprocess
import sys
import tempfile

tool = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "device-summary.py")
d = tempfile.mkdtemp()
header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"\n')
row = '"{i}","1","ced","h","{k}","1","7","(1, 1, 1)","(1, 1, 1)","0","9.0","m","gpu__time_duration.sum","{u}","{v}"\n'
with open(os.path.join(d, "k.csv"), "w") as f:
    f.write("==PROF== Connected\n" + header)
    # one long launch of `attention` (2 ms) loses to many launches of topk (3 x 1 ms)
    f.write(row.format(i=0, k="void ced::cuda::attention<4>(float const*, int)", u="msecond", v="2"))
    for i in range(3):
        f.write(row.format(i=i + 1, k="void ced::cuda::topk_kernel(float const*)", u="usecond", v="1,000"))
    f.write(row.format(i=9, k="sm90_xmma_gemm_f32f32", u="nsecond", v="500000"))
got = subprocess.run([sys.executable, tool, "--slowest", os.path.join(d, "k.csv")], capture_output=True, text=True)
assert got.returncode == 0 and got.stdout.strip() == "topk_kernel", (got.stdout, got.stderr)

json.dump({"device": "X", "results": [{"dtype": "f32", "shape": "peak", "tflops": 50.0},
                                      {"dtype": "bf16", "shape": "peak", "tflops": 500.0}]},
          open(os.path.join(d, "gemm-peak.json"), "w"))
json.dump({"rows": [{"backend": "cuda", "phase": "prefill-full", "gflops": 25000.0},
                    {"backend": "cuda-bf16", "phase": "prefill-full", "gflops": 25000.0}]},
          open(os.path.join(d, "bench-1024.json"), "w"))


def summary(lines):
    with open(os.path.join(d, "steps.tsv"), "w") as f:
        f.write("".join(l + "\n" for l in lines))
    out = subprocess.run([sys.executable, tool, os.path.join(d, "steps.tsv"), d], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


s = summary(["gate-cuda\tpass\t0\t12\t", "sanitizer-racecheck\trefused\t-\t0\tnot found"])
assert s["overall"] == "pass", s["overall"]
rows = {r["backend"]: r for r in s["bench"]["1024"]["rows"]}
assert rows["cuda"]["fraction_of_cublas_peak"] == 0.5, rows
assert rows["cuda-bf16"]["fraction_of_cublas_peak"] == 0.05, rows
assert summary(["gate-cuda\tpass\t0\t12\t", "bench-8192\ttimeout\t124\t120\t"])["overall"] == "fail"
assert summary(["gate-cuda\tfail\t1\t12\t", "gate-bf16\tpass\t0\t1\t"])["overall"] == "fail"
assert summary(["gate-cuda\tskipped\t77\t0\t", "sanitizer-memcheck\trefused\t-\t0\t"])["overall"] == "skipped"
# The profile's key figures: the first value of a key is kept (ncu repeats a section per launch), a line of
# another metric is not a key figure, and lines of any other shape are passed over.
with open(os.path.join(d, "ncu-profile.txt"), "w") as f:
    f.write("  void ced::cuda::topk_kernel(float const*) (4, 1, 1)x(128, 1, 1), Context 1, Stream 7\n"
            "    Section: Occupancy\n"
            "    Achieved Occupancy          %        61.5\n"
            "    Unlisted Metric             %        12.0\n"
            "    Achieved Occupancy          %        99.9\n"
            "    ----------------------- ----------- ------------\n"
            "    WRN   Uncoalesced global accesses\n")
p = summary(["gate-cuda\tpass\t0\t12\t"])["profile"]
assert p["kernel"] == "void ced::cuda::topk_kernel(float const*)", p
assert p["figures"] == {"Achieved Occupancy": "61.5 %"}, p["figures"]
assert p["advice"] == ["WRN   Uncoalesced global accesses"], p["advice"]

# A steps line with fewer than five fields (a step killed while writing it) is passed over, not a crash.
s = summary(["gate-cuda\tpass\t0\t12\t", "bench-1024\tpass", "gate-bf16\tfail\t1\t3\tbound"])
assert [x["step"] for x in s["steps"]] == ["gate-cuda", "gate-bf16"], s["steps"]
assert s["overall"] == "fail", s["overall"]

# Called with the wrong number of arguments it prints its usage, not a traceback.
for args in ([], [os.path.join(d, "steps.tsv")], ["a", "b", "c"]):
    got = subprocess.run([sys.executable, tool] + args, capture_output=True, text=True)
    assert got.returncode == 1 and "device-summary.py STEPS_TSV OUT_DIR" in got.stderr, (args, got.stderr)
    assert "Traceback" not in got.stderr, (args, got.stderr)
print("device-summary: every claim holds")
