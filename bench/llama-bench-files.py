#!/usr/bin/env python3
"""bench/llama-bench-files.py - backplane run --gguf against llama.cpp's llama-bench on the same
GGUF files, threads, prompt and generation lengths, in interleaved pairs. Benchmark runs only
(llama-bench is built outside our tree: ../shared/models/build-llama.sh), never CI.

  llama-bench-files.py [--llama-bench PATH] [-p 64] [-n 32] [-t 2] [--pairs 5] [--repeat 3]
                       FILE...

Per pair, each side runs once in an order that alternates between pairs: backplane run
--repeat R (one warm-up pass, R timed ones, medians) and llama-bench -r R (its own warm-up, the
mean of R). Flash attention is on in both. Prints per file the medians of both sides' prompt
(pp) and generation (tg) tokens/s, the median of the per-pair ratios (backplane / llama.cpp),
and both sides' peak resident size (backplane's own report; llama-bench's from wait4). The tool
is BACKPLANE (default ./tools/backplane, run from the build directory, with BP_PLUGIN_PATH set to
the build tree's CPU plugin when unset).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

TOOL = os.environ.get("BACKPLANE", "./tools/backplane")
if "BP_PLUGIN_PATH" not in os.environ and os.path.isdir("plugins/cpu/.libs"):
    os.environ["BP_PLUGIN_PATH"] = os.path.abspath("plugins/cpu/.libs")
    os.environ["BP_PLUGIN_SYSTEM_PATH"] = ""


def ours(path, a):
    cmd = [TOOL, "run", "--gguf", path, "-p", str(a.p), "-n", str(a.n + 1), "-t", str(a.t),
           "--ctx", str(a.p + a.n + 8), "--flash-attn", "on", "--repeat", str(a.repeat),
           "--json"]
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return r["prompt_tokens_per_s"], r["generation_tokens_per_s"], r["peak_rss_bytes"]


def theirs(path, a):
    cmd = [a.llama_bench, "-m", path, "-p", str(a.p), "-n", str(a.n), "-t", str(a.t), "-r",
           str(a.repeat), "-fa", "1", "-o", "json"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status != 0:
        sys.exit("llama-bench failed on %s" % path)
    pp = tg = 0.0
    for row in json.loads(out):
        if row["n_prompt"] > 0 and row["n_gen"] == 0:
            pp = row["avg_ts"]
        elif row["n_gen"] > 0 and row["n_prompt"] == 0:
            tg = row["avg_ts"]
    return pp, tg, ru.ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--llama-bench", default=os.environ.get("LLAMA_BENCH", "llama-bench"))
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("# pp%d and tg%d, -t %d, flash attention on in both, %d interleaved pairs; ratio = "
          "backplane / llama.cpp, median of the pairs" % (a.p, a.n, a.t, a.pairs))
    ratios = []
    for path in a.files:
        ours(path, a)  # page cache and first touch before the first pair
        res = {0: [], 1: []}
        for k in range(a.pairs):
            for side in ([0, 1] if k % 2 == 0 else [1, 0]):
                res[side].append(ours(path, a) if side == 0 else theirs(path, a))
        rp = statistics.median(o[0] / t[0] for o, t in zip(res[0], res[1]))
        rt = statistics.median(o[1] / t[1] for o, t in zip(res[0], res[1]))
        ratios += [rp, rt]
        med = lambda side, i: statistics.median(x[i] for x in res[side])
        print("%s: pp %.1f vs %.1f tok/s (ratio %.2f), tg %.1f vs %.1f tok/s (ratio %.2f); "
              "peak RSS %.0f vs %.0f MiB" %
              (os.path.basename(path), med(0, 0), med(1, 0), rp, med(0, 1), med(1, 1), rt,
               med(0, 2) / 2**20, med(1, 2) / 2**20))
        sys.stdout.flush()
    print("# smallest ratio %.2f, median ratio %.2f" % (min(ratios), statistics.median(ratios)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
