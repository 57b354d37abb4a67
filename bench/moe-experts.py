#!/usr/bin/env python3
"""Expert copies, caches and prefetch of `backplane run --model moe`, measured in one run.

The stacked experts live on one device (--experts-on, default CPU) and MUL_MAT_ID runs on
another (-d, default ACCEL0,CPU: the test accelerator, whose memory the host does not address
as such). Every configuration runs once per round, the rounds interleaved, and the table gives
medians over the rounds:

  (a) whole stacked tensors copied each step       --no-expert-stream
  (b) only the used experts copied                 --expert-copies used
  (c) an expert cache of N slots per tensor,       --expert-cache N --expert-prefetch off|on
      prefetch off and on

Per generated token: the experts' bytes brought from their device by the computing thread and
by the copy thread, the cache's hit rate, the computing thread's expert time (copying plus
waiting for the copy thread), the copy thread's time, and tokens/s. "hidden" is the share of
the prefetch-off expert time that prefetch takes off the computing thread at the same N.

Run from the build directory, with BP_PLUGIN_PATH naming the CPU plugin and the test
accelerator (tests/accel/.libs), e.g.

  python3 ../bench/moe-experts.py --rounds 3
  python3 ../bench/moe-experts.py --gguf moe-q8.gguf --experts-on file -d CPU
"""

import argparse
import json
import statistics
import subprocess
import sys


def run_once(tool, common, extra):
    cmd = [tool, "run"] + common + extra + ["--json"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), out.stderr))
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", default="./tools/backplane")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", "--prompt", type=int, default=32)
    ap.add_argument("-n", "--gen", type=int, default=32)
    ap.add_argument("--wtype", default="f32")
    ap.add_argument("--gguf", help="a Mixtral-style GGUF instead of the seeded model")
    ap.add_argument("-d", "--devices", default="ACCEL0,CPU")
    ap.add_argument("--experts-on", default="CPU")
    ap.add_argument("--slots", default="2,4,8")
    a = ap.parse_args()

    common = ["-n", str(a.gen), "-d", a.devices, "--experts-on", a.experts_on]
    if a.gguf:  # no tokenizer: the prompt as ids
        common += ["--gguf", a.gguf, "--tokens", ",".join(str(1 + 7 * i) for i in range(a.prompt))]
    else:
        common += ["--model", "moe", "--wtype", a.wtype, "-p", str(a.prompt)]
    configs = [("(a) whole tensors", ["--no-expert-stream"]),
               ("(b) used experts", ["--expert-copies", "used"])]
    for n in a.slots.split(","):
        for pf in ("off", "on"):
            configs.append(("(c) cache %s, prefetch %s" % (n, pf),
                            ["--expert-cache", n, "--expert-prefetch", pf]))
    results = {name: [] for name, _ in configs}
    for r in range(a.rounds):
        for name, extra in configs:
            results[name].append(run_once(a.tool, common, extra))
        print("round %d of %d done" % (r + 1, a.rounds), file=sys.stderr)

    def med(name, f):
        return statistics.median(f(j) for j in results[name])

    mib = 1048576.0
    print("| configuration | MiB per token from %s: computing thread + copy thread | "
          "hit rate | expert ms per token on the computing thread | copy thread ms | "
          "hidden | tokens/s |" % a.experts_on)
    print("|---|---|---|---|---|---|---|")
    off_time = {}
    for name, extra in configs:
        # (expert_bytes_copied_per_token counts both threads' copies)
        copied = med(name, lambda j: j["expert_bytes_copied_per_token"] -
                     j.get("expert_bytes_prefetched_per_token", 0)) / mib
        ahead = med(name, lambda j: j.get("expert_bytes_prefetched_per_token", 0)) / mib
        hits = sum(j["expert_cache_hits"] for j in results[name])
        misses = sum(j["expert_cache_misses"] for j in results[name])
        rate = "%.1f%%" % (100.0 * hits / (hits + misses)) if "--expert-cache" in extra else "-"
        crit = med(name, lambda j: j.get("expert_copy_seconds_per_token", 0) +
                   j.get("expert_wait_seconds_per_token", 0)) * 1e3
        side = med(name, lambda j: j.get("expert_prefetch_seconds_per_token", 0)) * 1e3
        tps = med(name, lambda j: j["generation_tokens_per_s"])
        hidden = "-"
        if "--expert-cache" in extra:
            n = extra[1]
            if extra[-1] == "off":
                off_time[n] = crit
            elif off_time.get(n):
                hidden = "%.0f%%" % (100.0 * (1.0 - crit / off_time[n]))
        crit_s = "-" if "--no-expert-stream" in extra else "%.3f" % crit  # copied as any input
        print("| %s | %.3f + %.3f | %s | %s | %.3f | %s | %.1f |" %
              (name, copied, ahead, rate, crit_s, side, hidden, tps))


if __name__ == "__main__":
    main()
