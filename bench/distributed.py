#!/usr/bin/env python3
"""Tensor parallelism across processes against one process, in the same run.

Interleaved pairs of
  (a) mpirun -np R backplane run -t T1 -d "Meta(CPU0@0,...,CPU0@R-1)"   R ranks x T1 threads
  (b) backplane run -t R*T1 -d CPU                                       one process
on the same model, prompt and generation; prints prompt and generation tokens/s of each, the
bytes all-reduced per generated token, and (a)/(b) as the median of the per-pair ratios.

Run from the build directory with BP_PLUGIN_PATH naming the CPU, meta and mpi plugins, e.g.
  python3 ../bench/distributed.py --model small --pairs 5
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout[-2000:], out.stderr[-2000:]))
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="./tools/backplane")
    ap.add_argument("--model", default="small")
    ap.add_argument("--wtype", default="f32")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("-p", "--prompt", type=int, default=64)
    ap.add_argument("-n", "--gen", type=int, default=32)
    ap.add_argument("--pairs", type=int, default=5)
    a = ap.parse_args()

    mpirun = shutil.which("mpirun") or sys.exit("no mpirun (install openmpi-bin)")
    opts = ["--oversubscribe"]
    if os.geteuid() == 0:
        opts.append("--allow-run-as-root")
    for var in ("BP_PLUGIN_PATH", "BP_PLUGIN_SYSTEM_PATH", "BP_LOG_LEVEL"):
        if var in os.environ:
            opts += ["-x", var]
    parts = ",".join("CPU0@%d" % r for r in range(a.ranks))
    common = ["run", "--model", a.model, "--wtype", a.wtype, "-p", str(a.prompt),
              "-n", str(a.gen), "--json"]
    ranked = [mpirun, "-np", str(a.ranks)] + opts + [a.tool] + common + [
        "-t", str(a.threads), "-d", "Meta(%s)" % parts]
    single = [a.tool] + common + ["-t", str(a.ranks * a.threads), "-d", "CPU"]
    res = {"ranked": [], "single": []}
    for i in range(a.pairs):
        res["ranked"].append(run(ranked))
        res["single"].append(run(single))
        print("pair %d of %d done" % (i + 1, a.pairs), file=sys.stderr)

    def med(key, f):
        return statistics.median(f(j) for j in res[key])

    def ratio(f):
        return statistics.median(f(x) / f(y) for x, y in zip(res["ranked"], res["single"]))

    gen = lambda j: j["generation_tokens_per_s"]
    prompt = lambda j: j["prompt_tokens_per_s"]
    print("# %s %s, -p %d -n %d, medians of %d interleaved pairs" %
          (a.model, a.wtype, a.prompt, a.gen, a.pairs))
    print("| run | prompt tokens/s | generation tokens/s | all-reduced per generated token |")
    print("|---|---|---|---|")
    print("| %d ranks x %d thread%s, Meta(%s) | %.1f | %.1f | %.1f KiB |" %
          (a.ranks, a.threads, "" if a.threads == 1 else "s", parts, med("ranked", prompt),
           med("ranked", gen), med("ranked", lambda j: j["bytes_allreduced_per_token"]) / 1024))
    print("| 1 process x %d threads, CPU | %.1f | %.1f | - |" %
          (a.ranks * a.threads, med("single", prompt), med("single", gen)))
    print("| ratio (ranks / one process) | %.2f | %.2f | |" % (ratio(prompt), ratio(gen)))


if __name__ == "__main__":
    main()
