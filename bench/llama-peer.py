#!/usr/bin/env python3
"""bench/llama-peer.py - backplane run --gguf against llama.cpp (through llama-cpp-python) on the
same GGUF file and token ids, in one run. Benchmark and check runs only: it needs
`pip install llama-cpp-python` (which builds llama.cpp), never CI.

  llama-peer.py check FILE [--tokens 1,5,9] [-n 8] [--tie 0.6] [-v]
      greedy generation in both; the tokens, and the largest NMSE of the steps' logits
      (backplane's against llama.cpp's; -v: each step's) up to the first step whose tokens
      differ. A first difference passes as a near-tie when llama.cpp's top-2 logit gap there
      is below --tie and our token's logit is within --tie of its top one (exit 0), else exit 1

  llama-peer.py bench [--model small] [--types f16,q8_0,q4_0] [-p 128] [-n 64] [-t 2]
                      [--pairs 5] [--busy]
      writes the seeded model as GGUF (backplane run --save-gguf) for each weight type, then
      times prompt and generation tokens/s of both, flash attention on in both, in interleaved
      pairs; prints the medians and the median of the per-pair ratios (backplane / llama.cpp).
      --busy runs one busy process beside both for the whole run (`while :; do :; done`, killed
      at the end), as on a shared machine, and also times backplane with one thread

The backplane tool is BACKPLANE (default: ./tools/backplane, run from the build directory, with
BP_PLUGIN_PATH set to the build tree's plugins when unset).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

try:
    import llama_cpp
except ImportError:
    sys.exit("llama-peer.py: llama_cpp is not installed (pip install llama-cpp-python)")

TOOL = os.environ.get("BACKPLANE", "./tools/backplane")
if "BP_PLUGIN_PATH" not in os.environ and os.path.isdir("plugins/cpu/.libs"):
    os.environ["BP_PLUGIN_PATH"] = ":".join(os.path.abspath(d) for d in
                                            ("plugins/cpu/.libs", "plugins/meta/.libs"))
    os.environ["BP_PLUGIN_SYSTEM_PATH"] = ""


def ours(path, tokens, n_gen, threads, logits=None):
    cmd = [TOOL, "run", "--gguf", path, "--tokens", ",".join(map(str, tokens)), "-n", str(n_gen),
           "-t", str(threads), "--flash-attn", "on", "--json"]
    if logits:
        cmd += ["--logits", logits]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def load(path, n_ctx, threads, logits_all):
    return llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads,
                           n_threads_batch=threads, n_batch=512, logits_all=logits_all,
                           flash_attn=True, verbose=False)


def theirs(llm, tokens, n_gen):
    """Greedy generation; the logits that chose each token, and the prompt and median
    generation-step times."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prompt_s = time.perf_counter() - t0
    logits, ids, steps = [], [], []
    for i in range(n_gen):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        logits.append(row)
        ids.append(int(np.argmax(row)))
        if i + 1 < n_gen:
            t0 = time.perf_counter()
            llm.eval([ids[-1]])
            steps.append(time.perf_counter() - t0)
    return ids, logits, prompt_s, statistics.median(steps) if steps else 0.0


def near_tie(ref, ours_id, theirs_id, tol):
    """Whether llama.cpp's logits ref make ours_id a near-tie with its own pick theirs_id: its
    top-2 gap below tol and ours_id's logit within tol of the top one."""
    top2 = np.sort(ref)[-2:]
    gap, behind = float(top2[1] - top2[0]), float(ref[theirs_id] - ref[ours_id])
    print("  llama.cpp's top-2 gap %.3f; our token %d is %.3f below its top logit (tolerance %.2f)"
          % (gap, ours_id, behind, tol))
    return gap < tol and behind < tol


def check(args):
    tokens = [int(x) for x in args.tokens.split(",")]
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        r = ours(args.file, tokens, args.n, 1, f.name)
        mine = np.fromfile(f.name, dtype=np.float32).astype(np.float64).reshape(args.n, -1)
    llm = load(args.file, len(tokens) + args.n + 8, 1, True)
    ids, logits, _, _ = theirs(llm, tokens, args.n)
    print("backplane: %s" % " ".join(map(str, r["tokens"])))
    print("llama.cpp: %s" % " ".join(map(str, ids)))
    worst, verdict = 0.0, "agree"
    for i in range(args.n):
        ref = logits[i]
        nmse = float(np.sum((mine[i] - ref) ** 2) / np.sum(ref ** 2))
        worst = max(worst, nmse)
        if args.verbose:
            print("step %d: NMSE %.3g" % (i, nmse))
        if r["tokens"][i] != ids[i]:
            print("tokens first differ at step %d" % i)
            tie = near_tie(ref, r["tokens"][i], ids[i], args.tie)
            verdict = "differ first at a near-tie (step %d)" % i if tie else "DIFFER"
            break
    print("largest NMSE %.3g up to there; tokens %s" % (worst, verdict))
    return 0 if verdict != "DIFFER" else 1


def bench(args):
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"]) if args.busy else None
    try:
        return bench_run(args)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def bench_run(args):
    rng = np.random.default_rng(1)
    out = tempfile.mkdtemp(prefix="llama-peer.")
    print("# %s, -p %d -n %d -t %d, flash attention on in both; ratio = backplane / llama.cpp, "
          "median of %d interleaved pairs%s" % (args.model, args.p, args.n, args.t, args.pairs,
                                               "; one busy process beside them" if args.busy
                                               else ""))
    for wtype in args.types.split(","):
        path = os.path.join(out, "%s-%s.gguf" % (args.model, wtype))
        subprocess.run([TOOL, "run", "--model", args.model, "--wtype", wtype, "--save-gguf", path],
                       check=True, capture_output=True)
        first = ours(path, [1], 1, args.t)
        vocab = 8192 if args.model == "small" else 32000 if args.model == "base" else 1024
        tokens = [int(x) for x in rng.integers(3, vocab, args.p)]
        llm = load(path, args.p + args.n + 8, args.t, False)
        theirs(llm, tokens[:8], 2)  # warm-up
        ours(path, tokens[:8], 2, args.t)
        pp, tg, rp, rt, one = [], [], [], [], []
        for k in range(args.pairs):
            order = [0, 1] if k % 2 == 0 else [1, 0]
            res = {}
            for side in order:
                if side == 0:
                    r = ours(path, tokens, args.n, args.t)
                    res[0] = (r["prompt_tokens_per_s"], r["generation_tokens_per_s"])
                else:
                    _, _, ps, gs = theirs(llm, tokens, args.n)
                    res[1] = (args.p / ps, 1.0 / gs)
            pp.append(res[0][0])
            tg.append(res[0][1])
            if args.busy:
                one.append(ours(path, tokens, args.n, 1)["generation_tokens_per_s"])
            rp.append(res[0][0] / res[1][0])
            rt.append(res[0][1] / res[1][1])
            theirs_pp = res[1][0]
        print("%s %s: prompt %.1f tok/s (ratio %.2f), generation %.1f tok/s (ratio %.2f); "
              "llama.cpp last pair: prompt %.1f tok/s; weights %s" %
              (args.model, wtype, statistics.median(pp), statistics.median(rp),
               statistics.median(tg), statistics.median(rt), theirs_pp,
               first.get("weight_buffer_type")))
        if one:
            print("  backplane -t 1 beside the same busy process: generation %.1f tok/s; -t %d is "
                  "%.2fx that" % (statistics.median(one), args.t,
                                  statistics.median(tg) / statistics.median(one)))
        sys.stdout.flush()
    return 0


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("file")
    c.add_argument("--tokens", default="1,5,9,20,33,47,60,2")
    c.add_argument("-n", type=int, default=8)
    c.add_argument("--tie", type=float, default=0.6,
                   help="near-tie tolerance in logits (0.05 for F16/BF16/F32 weights)")
    c.add_argument("-v", "--verbose", action="store_true", help="each step's NMSE")
    b = sub.add_parser("bench")
    b.add_argument("--model", default="small")
    b.add_argument("--types", default="f16,q8_0,q4_0")
    b.add_argument("-p", type=int, default=128)
    b.add_argument("-n", type=int, default=64)
    b.add_argument("-t", type=int, default=2)
    b.add_argument("--pairs", type=int, default=5)
    b.add_argument("--busy", action="store_true")
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else bench(args)


if __name__ == "__main__":
    sys.exit(main())
