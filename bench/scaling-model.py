#!/usr/bin/env python3
"""Tokens/s and memory per rank of tensor parallelism over N nodes, from a cost model.

Generation of one token reads every weight once, and the Megatron split (docs/meta.md) adds two
all-reduces of n_embd values per layer and one gather of the logits. Per token, on R ranks:

  t(R) = W / (R * B * e)                          compute: the rank's share of the weights
       + L * 2 * allreduce(n_embd * 4 bytes, R)   the layers' all-reduces
       + allreduce(vocab * 4 bytes, R)            the logits, gathered as a sum
  allreduce(S, R) = ceil(log2 R) * a + 2 (R - 1) / R * S / b     (R > 1; 0 for R = 1)

W: weight bytes; B: a node's memory read bandwidth; e: the fraction of it generation reaches;
a, b: the network's all-reduce step latency and bandwidth. Memory per rank: W / R plus the KV
cache over R (heads are split) plus the embedding table, which every rank holds whole.

The defaults for a, b on one machine are the ones bench/bench-mpi measured here (shared memory);
the network figures are assumptions to replace with bench-mpi's on the cluster:
  python3 bench/scaling-model.py --net ib     (or roce, tcp, shm; or --latency-us/--gbps)
"""

import argparse
import math

MODELS = {
    # name: layers, n_embd, n_ff, heads, kv heads, vocab
    "7B": (32, 4096, 11008, 32, 32, 32000),
    "70B": (80, 8192, 28672, 64, 8, 32000),
}
NETS = {  # all-reduce step latency (us), bandwidth (GB/s)
    "shm": (5.3, 5.0),     # bench-mpi, 2 ranks on the 2-core VM: 4096 values in 5.3 us, 5-7 GB/s
    "ib": (3.0, 20.0),     # InfiniBand HDR 200 Gb/s: assumed
    "roce": (8.0, 10.0),   # RoCE 100 Gb/s: assumed
    "tcp": (40.0, 1.0),    # 10 GbE through TCP: assumed
}
BYTES_PER_PARAM = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}


def params(layers, embd, ff, heads, kv, vocab):
    d = embd // heads
    attn = embd * embd * 2 + embd * kv * d * 2
    mlp = 3 * embd * ff
    return layers * (attn + mlp), 2 * vocab * embd  # layers, embeddings + output


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--net", default="ib", choices=sorted(NETS))
    ap.add_argument("--latency-us", type=float)
    ap.add_argument("--gbps", type=float, help="all-reduce bandwidth, GB/s")
    ap.add_argument("--mem-bw", type=float, default=200.0, help="a node's read bandwidth, GB/s")
    ap.add_argument("--efficiency", type=float, default=0.8,
                    help="fraction of it generation reaches (0.76-0.92 measured here)")
    ap.add_argument("--wtype", default="q8_0", choices=sorted(BYTES_PER_PARAM))
    ap.add_argument("--ctx", type=int, default=4096, help="KV cache positions (f16)")
    a = ap.parse_args()
    lat, bw = NETS[a.net]
    lat = (a.latency_us if a.latency_us is not None else lat) * 1e-6
    bw = (a.gbps if a.gbps is not None else bw) * 1e9
    bpp = BYTES_PER_PARAM[a.wtype]
    print("# %s weights, node read bandwidth %.0f GB/s at %.2f, network %s: step %.1f us, "
          "%.1f GB/s, KV cache %d positions f16" %
          (a.wtype, a.mem_bw, a.efficiency, a.net, lat * 1e6, bw / 1e9, a.ctx))
    print("| model | nodes | weights per rank | KV per rank | all-reduce per token | "
          "tokens/s | of which waiting on the network |")
    print("|---|---|---|---|---|---|---|")
    for name, (L, E, F, H, KV, V) in MODELS.items():
        layer_p, emb_p = params(L, E, F, H, KV, V)
        for R in (1, 2, 4, 8):
            W = (layer_p + emb_p / 2) * bpp  # the output matrix is split, the table is not
            per_rank = layer_p * bpp / R + emb_p / 2 * bpp * (1 + 1 / R)
            kv = 2 * L * a.ctx * KV * (E // H) * 2 / min(R, KV)
            compute = W / (R * a.mem_bw * 1e9 * a.efficiency)

            def ar(S):
                return 0.0 if R == 1 else math.ceil(math.log2(R)) * lat + 2 * (R - 1) / R * S / bw

            net = L * 2 * ar(E * 4) + ar(V * 4)
            t = compute + net
            print("| %s | %d | %.1f GiB | %.2f GiB | %.0f KiB | %.1f | %.0f%% |" %
                  (name, R, per_rank / 2**30, kv / 2**30,
                   0 if R == 1 else (L * 2 * E * 4 + V * 4) / 1024, 1 / t, 100 * net / t))


if __name__ == "__main__":
    main()
