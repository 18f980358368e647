"""The layout of the trained test model's weights, shared by train.py and the
converter's checks; pure Python (no PyTorch).

OUT/manifest.json lists every tensor under its GGUF name with its shape in
PyTorch's row-major order (rows first; GGUF lists dimensions the other way round)
and the parts of the OUT/weights-NNN.bin files that hold its little-endian float16
values, in order: files are at most 15 MiB, so a large tensor spans several.

    python3 weights.py --out DIR [--embd 192 ...]

writes random weights of the default shapes without PyTorch: what
`make trained-model` converts to check the layout end to end before any training.
"""

import argparse
import json
import math
import os
import random
import struct
import sys

FORMAT = "macfleet-trained-weights/1"
NORM_EPS = 1e-5
FILE_LIMIT = 15 << 20
VOCAB = 128256

# The model's default dimensions: a q8_0 GGUF of about 32 MB (the embedding is most of it).
DEFAULTS = {"embd": 160, "layers": 8, "heads": 5, "kv_heads": 1, "ff": 512, "ctx": 32768, "rope_theta": 500000.0}


def add_model_args(p):
    p.add_argument("--embd", type=int, default=DEFAULTS["embd"])
    p.add_argument("--layers", type=int, default=DEFAULTS["layers"])
    p.add_argument("--heads", type=int, default=DEFAULTS["heads"])
    p.add_argument("--kv-heads", type=int, default=DEFAULTS["kv_heads"])
    p.add_argument("--ff", type=int, default=DEFAULTS["ff"])
    p.add_argument("--ctx", type=int, default=DEFAULTS["ctx"], help="context length written into the GGUF")
    p.add_argument("--rope-theta", type=float, default=DEFAULTS["rope_theta"], help="the Llama 3 rotary base")


def check_model_args(p, a):
    if a.embd % a.heads or a.heads % a.kv_heads or (a.embd // a.heads) % 2:
        p.error("embd must divide into heads of even size, heads into kv-heads")
    if a.embd % 32 or a.ff % 32:
        p.error("embd and ff must be multiples of 32 (q8_0 blocks)")


def hyperparameters(a, vocab):
    return {"vocab": vocab, "embd": a.embd, "layers": a.layers, "heads": a.heads, "kvHeads": a.kv_heads,
            "ff": a.ff, "ctx": a.ctx, "ropeTheta": a.rope_theta, "normEps": NORM_EPS}


def tensor_shapes(hp):
    """The GGUF names and PyTorch shapes (rows first) of the model's tensors; no
    output.weight: the output projection is the token embedding (tied)."""
    d, ff = hp["embd"], hp["ff"]
    kv = d // hp["heads"] * hp["kvHeads"]
    shapes = [("token_embd.weight", [hp["vocab"], d]), ("output_norm.weight", [d])]
    for i in range(hp["layers"]):
        b = "blk.%d." % i
        shapes += [(b + "attn_norm.weight", [d]), (b + "attn_q.weight", [d, d]), (b + "attn_k.weight", [kv, d]),
                   (b + "attn_v.weight", [kv, d]), (b + "attn_output.weight", [d, d]), (b + "ffn_norm.weight", [d]),
                   (b + "ffn_gate.weight", [ff, d]), (b + "ffn_up.weight", [ff, d]), (b + "ffn_down.weight", [d, ff])]
    return shapes


class WeightWriter:
    """Writes tensors' float16 bytes into files of at most FILE_LIMIT bytes."""

    def __init__(self, out):
        self.out, self.files, self.tensors, self.f, self.used = out, [], [], None, FILE_LIMIT
        os.makedirs(out, exist_ok=True)

    def add(self, name, shape, data):
        if len(data) != 2 * math.prod(shape):
            raise ValueError("%s: %d bytes for shape %s" % (name, len(data), shape))
        parts, off = [], 0
        while off < len(data):
            if self.used == FILE_LIMIT:
                if self.f:
                    self.f.close()
                self.files.append("weights-%03d.bin" % len(self.files))
                self.f, self.used = open(os.path.join(self.out, self.files[-1]), "wb"), 0
            n = min(len(data) - off, FILE_LIMIT - self.used)
            self.f.write(data[off:off + n])
            parts.append({"file": self.files[-1], "offset": self.used, "bytes": n})
            self.used, off = self.used + n, off + n
        self.tensors.append({"name": name, "shape": shape, "dtype": "f16", "bytes": len(data), "parts": parts})

    def finish(self, hp, training):
        if self.f:
            self.f.close()
        manifest = {"format": FORMAT, "hyperparameters": hp, "training": finite(training), "tensors": self.tensors}
        with open(os.path.join(self.out, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
            f.write("\n")


def finite(v):
    """v with NaN and infinities as None: JSON has no NaN (a loss not measured, or
    one that diverged, must not make the manifest unreadable)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


def fake_weights(a):
    """Random weights of the model's shapes (norms all ones), written without PyTorch."""
    hp = hyperparameters(a, VOCAB)
    rng = random.Random(a.seed)
    w = WeightWriter(a.out)
    for name, shape in tensor_shapes(hp):
        n = math.prod(shape)
        if len(shape) == 1:
            data = struct.pack("<e", 1.0) * n
        else:  # a stretch of random values, repeated: the layout is what is checked
            scale = 1 / math.sqrt(shape[1])
            stretch = struct.pack("<4093e", *(rng.uniform(-scale, scale) for _ in range(4093)))
            data = (stretch * (n // 4093 + 1))[:2 * n]
        w.add(name, shape, data)
    w.finish(hp, {"fake": True, "seed": a.seed})


def main(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory to write the weights into")
    p.add_argument("--seed", type=int, default=1)
    add_model_args(p)
    a = p.parse_args(argv)
    check_model_args(p, a)
    fake_weights(a)
    print("random weights in", a.out)


if __name__ == "__main__":
    main(sys.argv[1:])
