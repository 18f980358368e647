#!/usr/bin/env python3
"""The forward pass of train.py's model in pure Python, on weights in its layout.

    python3 reference.py --weights DIR --prompt 128000,9906,1917 --steps 4

prints, as JSON, the greedy continuation of the prompt and the log-probability of
each token chosen. TestTrainedModelMatchesReference (test/runner) compares that with
what llama.cpp computes from the GGUF of the same weights: if train.py's conventions
(rotary pairs, grouped-query heads, norms, tied output) were not llama.cpp's, the
trained model would be noise once converted. Each function below is the line of
train.py of the same name, without PyTorch; slow, for small test models only.
"""

import argparse
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weights import NORM_EPS  # noqa: E402


def load(path):
    """The manifest's tensors as flat lists of floats, by name, with the hyperparameters."""
    with open(os.path.join(path, "manifest.json")) as f:
        m = json.load(f)
    out = {}
    for t in m["tensors"]:
        raw = b""
        for p in t["parts"]:
            with open(os.path.join(path, p["file"]), "rb") as f:
                f.seek(p["offset"])
                raw += f.read(p["bytes"])
        n = len(raw) // 2
        vals = list(struct.unpack("<%de" % n, raw))
        if len(t["shape"]) == 2:
            rows, cols = t["shape"]
            vals = [vals[r * cols:(r + 1) * cols] for r in range(rows)]
        out[t["name"]] = vals
    return m["hyperparameters"], out


def rms_norm(x, w):
    s = 1 / math.sqrt(sum(v * v for v in x) / len(x) + NORM_EPS)
    return [v * s * wi for v, wi in zip(x, w)]


def linear(w, x):
    """w (rows of PyTorch's [out, in]) times x."""
    return [sum(a * b for a, b in zip(row, x)) for row in w]


def rope(v, pos, theta):
    """Adjacent pairs (v[2i], v[2i+1]) turned by pos * theta^(-2i/len(v))."""
    out = list(v)
    hd = len(v)
    for i in range(0, hd, 2):
        ang = pos * theta ** (-i / hd)
        c, s = math.cos(ang), math.sin(ang)
        out[i], out[i + 1] = v[i] * c - v[i + 1] * s, v[i] * s + v[i + 1] * c
    return out


def forward(hp, w, ids):
    """The last position's logits for ids."""
    d, h, kv = hp["embd"], hp["heads"], hp["kvHeads"]
    hd, group = d // h, h // kv
    x = [list(w["token_embd.weight"][i]) for i in ids]
    for li in range(hp["layers"]):
        b = "blk.%d." % li
        qs, ks, vs = [], [], []
        for pos, xt in enumerate(x):
            n = rms_norm(xt, w[b + "attn_norm.weight"])
            q, k, v = linear(w[b + "attn_q.weight"], n), linear(w[b + "attn_k.weight"], n), linear(w[b + "attn_v.weight"], n)
            qs.append([rope(q[j * hd:(j + 1) * hd], pos, hp["ropeTheta"]) for j in range(h)])
            ks.append([rope(k[j * hd:(j + 1) * hd], pos, hp["ropeTheta"]) for j in range(kv)])
            vs.append([v[j * hd:(j + 1) * hd] for j in range(kv)])
        for t in range(len(x)):
            o = []
            for j in range(h):  # query head j reads key/value head j // group
                g = j // group
                sc = [sum(a * c for a, c in zip(qs[t][j], ks[u][g])) / math.sqrt(hd) for u in range(t + 1)]
                mx = max(sc)
                e = [math.exp(s - mx) for s in sc]
                z = sum(e)
                o += [sum(e[u] / z * vs[u][g][i] for u in range(t + 1)) for i in range(hd)]
            x[t] = [a + c for a, c in zip(x[t], linear(w[b + "attn_output.weight"], o))]
        for t in range(len(x)):
            n = rms_norm(x[t], w[b + "ffn_norm.weight"])
            gate, up = linear(w[b + "ffn_gate.weight"], n), linear(w[b + "ffn_up.weight"], n)
            act = [gv / (1 + math.exp(-gv)) * uv for gv, uv in zip(gate, up)]
            x[t] = [a + c for a, c in zip(x[t], linear(w[b + "ffn_down.weight"], act))]
    last = rms_norm(x[-1], w["output_norm.weight"])
    return linear(w["token_embd.weight"], last)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--weights", required=True)
    p.add_argument("--prompt", required=True, help="token ids, comma-separated")
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args(argv)
    hp, w = load(a.weights)
    ids = [int(t) for t in a.prompt.split(",")]
    tokens, logprobs = [], []
    for _ in range(a.steps):
        logits = forward(hp, w, ids)
        best = max(range(len(logits)), key=logits.__getitem__)
        mx = logits[best]
        lse = mx + math.log(sum(math.exp(v - mx) for v in logits))
        tokens.append(best)
        logprobs.append(logits[best] - lse)
        ids.append(best)
    json.dump({"tokens": tokens, "logprobs": logprobs}, sys.stdout)
    print()


if __name__ == "__main__":
    main(sys.argv[1:])
