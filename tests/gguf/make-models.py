#!/usr/bin/env python3
"""Writes two tiny decoders with random weights through the GGUF project's own Python package
(pip install gguf), for `backplane run --gguf` to serve in tests/test-run.sh:

  llama-gqa.gguf   architecture "llama": grouped-query attention (4 heads, 2 for keys and
                   values), llama's rope (adjacent pairs), f16 matrices, its own output matrix
  qwen2-tied.gguf  architecture "qwen2": biases on q, k and v, NeoX's rope (pairs i, i + D/2)
                   with linear scaling (factor 2), one key/value head, f32 matrices, the output
                   matrix tied to the token embedding (no output.weight)
  qwen2-yarn.gguf  "qwen2" with YaRN rope scaling (factor 4 over an original context of 8)

and models.txt: for each, the prompt's token ids and the ids a greedy decoder generates from it,
computed here by an independent forward pass in numpy (float64) from the weights as the file
holds them. Seeds are chosen so that every step's best logit leads the second by a clear margin
(a near tie could go either way in single precision with an f16 KV cache).

It also writes bad-*.gguf, each a tiny llama with one thing wrong, and bad-models.txt, what
backplane run's refusal of each must say.

The outputs are committed, so the tests need neither the package nor a network; rerun this to
regenerate them (everything is seeded: the output is the same every time).
"""
import os

import numpy as np
import gguf

here = os.path.dirname(os.path.abspath(__file__))
PROMPT = [1, 5, 9, 20, 33, 47, 60, 2]
N_GEN = 8


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, base, scale, neox, yarn=None):
    """x: [T, heads, D]; theta_i = pos * scale * base^(-2i/D). With yarn (n_ctx_orig, ext,
    attn, beta_fast, beta_slow), YaRN as its paper and llama.cpp define it: pair i's angle moves
    from interpolated (scale) to extrapolated (1) by a ramp over the pairs whose wavelength fits
    the original context between beta_slow and beta_fast times, and the result is scaled by
    attn * (1 + 0.1 ln(1 / scale))."""
    T, _, D = x.shape
    half = D // 2
    i = np.arange(half)
    extrap = pos[:, None] * base ** (-2.0 * i / D)  # [T, half]
    theta, mag = extrap * scale, 1.0
    if yarn is not None:
        n_orig, ext, attn, fast, slow = yarn

        def corr(beta):  # the pair whose wavelength fits n_orig exactly beta times
            return D * np.log(n_orig / (beta * 2 * np.pi)) / (2 * np.log(base))

        lo, hi = max(0.0, np.floor(corr(fast))), min(D - 1.0, np.ceil(corr(slow)))
        mix = (1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)) * ext
        theta = extrap * scale * (1 - mix) + extrap * mix
        mag = attn * (1 + 0.1 * np.log(1 / scale))
    c, s = mag * np.cos(theta)[:, None, :], mag * np.sin(theta)[:, None, :]
    y = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:]
        y[..., :half], y[..., half:] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = a * c - b * s, a * s + b * c
    return y


def forward(m, tokens):
    """Logits of the last token after the whole sequence (no cache: recomputed each step)."""
    c = m["cfg"]
    E, H, HK = c["E"], c["H"], c["HK"]
    D = E // H
    T = len(tokens)
    pos = np.arange(T, dtype=np.float64)
    x = m["token_embd"][tokens]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in m["layers"]:
        h = rms_norm(x, l["attn_norm"], c["eps"])
        q, k, v = h @ l["wq"].T, h @ l["wk"].T, h @ l["wv"].T
        if "bq" in l:
            q, k, v = q + l["bq"], k + l["bk"], v + l["bv"]
        q = rope(q.reshape(T, H, D), pos, c["base"], c["scale"], c["neox"], c.get("yarn"))
        k = rope(k.reshape(T, HK, D), pos, c["base"], c["scale"], c["neox"], c.get("yarn"))
        v = v.reshape(T, HK, D)
        out = np.zeros((T, H, D))
        for hh in range(H):
            kv = hh // (H // HK)
            s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(D) + mask
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p /= p.sum(axis=-1, keepdims=True)
            out[:, hh, :] = p @ v[:, kv, :]
        x = x + out.reshape(T, E) @ l["wo"].T
        h = rms_norm(x, l["ffn_norm"], c["eps"])
        g = h @ l["w_gate"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ l["w_up"].T)) @ l["w_down"].T
    x = rms_norm(x, m["output_norm"], c["eps"])
    return x[-1] @ m["output"].T


def generate(m):
    """Greedy ids after PROMPT, and the smallest lead of the best logit over the second, as a
    fraction of the logits' spread."""
    tokens = list(PROMPT)
    out, lead = [], np.inf
    for _ in range(N_GEN):
        logits = forward(m, tokens)
        top = np.sort(logits)[-2:]
        lead = min(lead, (top[1] - top[0]) / np.std(logits))
        out.append(int(np.argmax(logits)))
        tokens.append(out[-1])
    return out, lead


def make(cfg, seed):
    rng = np.random.default_rng(seed)
    E, F, V, H, HK = cfg["E"], cfg["F"], cfg["V"], cfg["H"], cfg["HK"]
    EK = E // H * HK
    store = np.float16 if cfg["f16"] else np.float32

    def mat(rows, cols, scale):
        # as stored in the file, then widened: the reference computes with what the file holds
        return (rng.uniform(-scale, scale, (rows, cols))).astype(store).astype(np.float64)

    def vec(n, center, scale):
        return (center + rng.uniform(-scale, scale, n)).astype(np.float32).astype(np.float64)

    se, sf = np.sqrt(3.0 / E), np.sqrt(3.0 / F)
    m = {"cfg": cfg, "token_embd": mat(V, E, 1.0), "output_norm": vec(E, 1.0, 0.1), "layers": []}
    m["output"] = m["token_embd"] if cfg["tied"] else mat(V, E, se)
    for _ in range(cfg["L"]):
        l = {"attn_norm": vec(E, 1.0, 0.1), "wq": mat(E, E, se), "wk": mat(EK, E, se),
             "wv": mat(EK, E, se), "wo": mat(E, E, se), "ffn_norm": vec(E, 1.0, 0.1),
             "w_gate": mat(F, E, se), "w_up": mat(F, E, se), "w_down": mat(E, F, sf)}
        if cfg["bias"]:
            l.update(bq=vec(E, 0.0, 0.5), bk=vec(EK, 0.0, 0.5), bv=vec(EK, 0.0, 0.5))
        m["layers"].append(l)
    return m


def write(path, arch, m):
    c = m["cfg"]
    store = np.float16 if c["f16"] else np.float32
    w = gguf.GGUFWriter(path, arch)
    w.add_name("backplane test " + arch)
    w.add_context_length(c["ctx"])
    w.add_embedding_length(c["E"])
    w.add_block_count(c["L"])
    w.add_feed_forward_length(c["F"])
    w.add_head_count(c["H"])
    w.add_head_count_kv(c["HK"])
    w.add_rope_freq_base(c["base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_rope_dimension_count(c["E"] // c["H"])
    if c.get("yarn"):
        n_orig, ext, attn, fast, slow = c["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(1.0 / c["scale"])
        w.add_rope_scaling_orig_ctx_len(n_orig)
        w.add_rope_scaling_yarn_attn_factor(attn)
        w.add_rope_scaling_yarn_ext_factor(ext)
        w.add_rope_scaling_yarn_beta_fast(fast)
        w.add_rope_scaling_yarn_beta_slow(slow)
    elif c["scale"] != 1.0:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(1.0 / c["scale"])
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + ["<t%d>" % i for i in range(3, c["V"])])

    def t(name, a, f32=False):
        w.add_tensor(name, a.astype(np.float32 if f32 else store))

    t("token_embd.weight", m["token_embd"])
    t("output_norm.weight", m["output_norm"], True)
    if not c["tied"]:
        t("output.weight", m["output"])
    for i, l in enumerate(m["layers"]):
        t("blk.%d.attn_norm.weight" % i, l["attn_norm"], True)
        t("blk.%d.attn_q.weight" % i, l["wq"])
        t("blk.%d.attn_k.weight" % i, l["wk"])
        t("blk.%d.attn_v.weight" % i, l["wv"])
        if "bq" in l:
            t("blk.%d.attn_q.bias" % i, l["bq"], True)
            t("blk.%d.attn_k.bias" % i, l["bk"], True)
            t("blk.%d.attn_v.bias" % i, l["bv"], True)
        t("blk.%d.attn_output.weight" % i, l["wo"])
        t("blk.%d.ffn_norm.weight" % i, l["ffn_norm"], True)
        t("blk.%d.ffn_gate.weight" % i, l["w_gate"])
        t("blk.%d.ffn_up.weight" % i, l["w_up"])
        t("blk.%d.ffn_down.weight" % i, l["w_down"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


models = [
    ("llama-gqa.gguf", "llama",
     dict(E=32, F=64, V=96, H=4, HK=2, L=2, ctx=64, base=10000.0, scale=1.0, eps=1e-5,
          neox=False, bias=False, tied=False, f16=True)),
    ("qwen2-tied.gguf", "qwen2",
     dict(E=32, F=64, V=96, H=4, HK=1, L=2, ctx=64, base=1000000.0, scale=0.5, eps=1e-6,
          neox=True, bias=True, tied=True, f16=False)),
    # YaRN over an original context of 8 positions, the prompt and generation running past it
    ("qwen2-yarn.gguf", "qwen2",
     dict(E=32, F=64, V=96, H=4, HK=2, L=2, ctx=64, base=10000.0, scale=0.25, eps=1e-6,
          neox=True, bias=True, tied=False, f16=True, yarn=(8, 1.0, 1.0, 32.0, 1.0))),
]

# Files `backplane run --gguf` must refuse, each with what its refusal must say: one thing wrong
# with an otherwise good tiny llama (1 layer, n_embd 8).
small = dict(E=8, F=16, V=16, H=2, HK=2, L=1, ctx=16, base=10000.0, scale=1.0, eps=1e-5,
             neox=False, bias=False, tied=False, f16=False)
bad = [
    ("bad-arch.gguf", "gpt2", {}, None, "architecture is 'gpt2'"),
    ("bad-kv-heads.gguf", "llama", {"H": 4, "HK": 3}, None, "3 key/value heads do not divide its 4 heads"),
    ("bad-longrope.gguf", "llama", {}, "longrope", "rope scaling is 'longrope'"),
    ("bad-extra-tensor.gguf", "llama", {}, "extra", "holds tensor rope_freqs.weight"),
    ("bad-shape.gguf", "llama", {}, "shape", "tensor blk.0.attn_k.weight is [8, 4, 1]"),
    ("bad-missing.gguf", "llama", {}, "missing", "no tensor blk.0.ffn_up.weight"),
]


def write_bad(name, arch, change, what):
    cfg = dict(small, **change)
    m = make(dict(cfg, HK=2), 7)
    path = os.path.join(here, name)
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(cfg["ctx"])
    w.add_embedding_length(cfg["E"])
    w.add_block_count(cfg["L"])
    w.add_feed_forward_length(cfg["F"])
    w.add_head_count(cfg["H"])
    w.add_head_count_kv(cfg["HK"])
    if what == "longrope":
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
        w.add_rope_scaling_factor(4.0)
    f = lambda a: a.astype(np.float32)
    w.add_tensor("token_embd.weight", f(m["token_embd"]))
    w.add_tensor("output_norm.weight", f(m["output_norm"]))
    w.add_tensor("output.weight", f(m["output"]))
    if what == "extra":
        w.add_tensor("rope_freqs.weight", np.ones(cfg["E"] // cfg["H"] // 2, np.float32))
    l = m["layers"][0]
    for key, name_ in [("attn_norm", "attn_norm"), ("wq", "attn_q"), ("wk", "attn_k"),
                       ("wv", "attn_v"), ("wo", "attn_output"), ("ffn_norm", "ffn_norm"),
                       ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down")]:
        a = l[key]
        if what == "shape" and key == "wk":
            a = a[:4]
        if what == "missing" and key == "w_up":
            continue
        w.add_tensor("blk.0.%s.weight" % name_, f(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


with open(os.path.join(here, "bad-models.txt"), "w") as out:
    out.write("# written by make-models.py: file, then what backplane run's refusal says\n")
    for name, arch, change, what, says in bad:
        write_bad(name, arch, change, what)
        out.write("%s %s\n" % (name, says))

lines = ["# written by make-models.py: file, prompt ids, greedy ids of the numpy reference"]
for name, arch, cfg in models:
    seed = 20261202
    while True:
        m = make(cfg, seed)
        ids, lead = generate(m)
        if lead > 0.05:
            break
        seed += 1
    write(os.path.join(here, name), arch, m)
    lines.append("%s %s %s" % (name, ",".join(map(str, PROMPT)), " ".join(map(str, ids))))
    print("%s: seed %d, generated %s, smallest lead %.3f" % (name, seed, ids, lead))
with open(os.path.join(here, "models.txt"), "w") as f:
    f.write("\n".join(lines) + "\n")
