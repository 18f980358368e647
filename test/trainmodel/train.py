#!/usr/bin/env python3
"""Train the small test model on the corpus test/trainmodel/corpus generates.

Runs on a machine with one CUDA GPU and PyTorch (nothing else: no numpy, no
network). docs/testing.md ("The trained test model") gives the command, the seed,
the step count and the loss curve of the model in the repository.

The model is the llama architecture exactly as llama.cpp runs it, so its weights
go into a GGUF unchanged (test/trainmodel/convert):

- token embedding tied to the output projection (llama.cpp uses token_embd.weight
  when a llama GGUF has no output.weight);
- pre-norm blocks: RMSNorm (eps 1e-5, weight only), attention with grouped-query
  heads (query head h reads key/value head h // (heads // kv_heads), as ggml
  broadcasts), SwiGLU feed-forward down(silu(gate(x)) * up(x));
- rotary embedding in llama.cpp's "normal" convention (LLAMA_ROPE_TYPE_NORM, the
  one of the llama architecture): it rotates pairs of adjacent values of a head,
  (x[2i], x[2i+1]) by position * theta^(-2i/head_dim). Trained in that convention,
  the query and key weights need no permutation (a checkpoint in the half-split
  convention would);
- attention scores scaled by 1/sqrt(head_dim), no biases anywhere.

Output: OUT/manifest.json and OUT/weights-NNN.bin, raw little-endian float16 in
PyTorch's row-major order, files of at most 15 MiB (a tensor may span files: its
parts are listed in order); OUT/loss.csv, the loss curve; OUT/samples.txt, the
model's greedy answers to the corpus's probe prompts.

weights.py (beside this file, pure Python) holds that layout, and writes random
weights in it without PyTorch.
"""

import argparse
import ctypes
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weights import NORM_EPS, WeightWriter, add_model_args, check_model_args, hyperparameters, tensor_shapes  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="directory of tokens.bin, mask.bin, corpus.json (and probes.json)")
    p.add_argument("--valid", help="a second corpus directory (another seed) for the held-out loss")
    p.add_argument("--out", required=True, help="directory to write the weights into")
    p.add_argument("--seed", type=int, default=45)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--max-seconds", type=float, default=450,
                   help="stop (and save) after this long; the learning rate decays by time or steps, whichever is further")
    add_model_args(p)
    p.add_argument("--short-seq", type=int, default=2048, help="window of the short batches")
    p.add_argument("--short-batch", type=int, default=32)
    p.add_argument("--long-seq", type=int, default=0,
                   help="window of the long batches (0: the longest document, rounded up to 512)")
    p.add_argument("--long-batch", type=int, default=3)
    p.add_argument("--long-every", type=int, default=4, help="every Nth step is a long batch")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--valid-every", type=int, default=100)
    a = p.parse_args(argv)
    check_model_args(p, a)
    return a


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight).to(x.dtype)


def rope(x, cos, sin):
    """Rotates adjacent pairs (x[2i], x[2i+1]) of each head: llama.cpp's normal RoPE."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).type_as(x)


class Block(nn.Module):
    def __init__(self, hp):
        super().__init__()
        d, self.h, self.kv = hp["embd"], hp["heads"], hp["kvHeads"]
        self.hd = d // self.h
        self.attn_norm, self.ffn_norm = RMSNorm(d), RMSNorm(d)
        self.attn_q = nn.Linear(d, d, bias=False)
        self.attn_k = nn.Linear(d, self.kv * self.hd, bias=False)
        self.attn_v = nn.Linear(d, self.kv * self.hd, bias=False)
        self.attn_output = nn.Linear(d, d, bias=False)
        self.ffn_gate = nn.Linear(d, hp["ff"], bias=False)
        self.ffn_up = nn.Linear(d, hp["ff"], bias=False)
        self.ffn_down = nn.Linear(hp["ff"], d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.attn_norm(x)
        q = rope(self.attn_q(h).view(b, t, self.h, self.hd), cos, sin).transpose(1, 2)
        k = rope(self.attn_k(h).view(b, t, self.kv, self.hd), cos, sin).transpose(1, 2)
        v = self.attn_v(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        if self.kv != self.h:  # query head i reads key/value head i // group, as ggml broadcasts
            k = k.repeat_interleave(self.h // self.kv, dim=1)
            v = v.repeat_interleave(self.h // self.kv, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_output(o.transpose(1, 2).reshape(b, t, d))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class Model(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.hp = hp
        self.token_embd = nn.Embedding(hp["vocab"], hp["embd"])
        self.blocks = nn.ModuleList(Block(hp) for _ in range(hp["layers"]))
        self.output_norm = RMSNorm(hp["embd"])
        hd = hp["embd"] // hp["heads"]
        self.register_buffer("inv_freq", hp["ropeTheta"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd),
                             persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * hp["layers"]) if name.endswith(("attn_output.weight", "ffn_down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def hidden(self, ids):
        t = ids.shape[1]
        ang = torch.arange(t, device=ids.device, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos().float(), ang.sin().float()
        x = self.token_embd(ids)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.output_norm(x)

    def named_tensors(self):
        """The parameters under their GGUF names."""
        out = {"token_embd.weight": self.token_embd.weight, "output_norm.weight": self.output_norm.weight}
        for i, blk in enumerate(self.blocks):
            for n in ("attn_norm", "ffn_norm"):
                out["blk.%d.%s.weight" % (i, n)] = getattr(blk, n).weight
            for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
                out["blk.%d.%s.weight" % (i, n)] = getattr(blk, n).weight
        return out


def chunked_loss(h, emb, targets, chunk=4096):
    """Summed cross-entropy of h @ emb.T against targets, a chunk of rows at a time
    (recomputed in the backward pass, so the 128k-wide logits never all live at once)."""

    def part(hc, yc, w):
        return F.cross_entropy((hc @ w.t()).float(), yc, reduction="sum")

    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.shape[0], chunk):
        total = total + checkpoint(part, h[i:i + chunk], targets[i:i + chunk], emb, use_reentrant=False)
    return total


class Corpus:
    def __init__(self, path, device):
        with open(os.path.join(path, "corpus.json")) as f:
            self.meta = json.load(f)
        with open(os.path.join(path, self.meta["tokenFile"]), "rb") as f:
            raw = bytearray(f.read())
        self.ids = torch.frombuffer(raw, dtype=torch.int32).to(torch.int64)  # ids < 2^31
        with open(os.path.join(path, self.meta["maskFile"]), "rb") as f:
            self.mask = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).bool()
        if sys.byteorder != "little":
            raise SystemExit("the corpus is little-endian")
        assert self.ids.numel() == self.mask.numel() == self.meta["tokens"]
        self.starts = (self.ids == self.meta["bos"]).nonzero().flatten()
        ends = torch.cat((self.starts[1:], torch.tensor([self.ids.numel()])))
        self.lengths = ends - self.starts
        self.ids, self.mask = self.ids.to(device), self.mask.to(device)

    def long_starts(self, longer_than):
        return self.starts[self.lengths > longer_than]

    def batch(self, gen, starts, n, t):
        """n windows of t tokens, each from the start of a document drawn from starts."""
        pick = starts[torch.randint(len(starts), (n,), generator=gen)]
        pick = pick.clamp(max=self.ids.numel() - t - 1).to(self.ids.device)
        idx = pick[:, None] + torch.arange(t + 1, device=self.ids.device)[None, :]
        win, m = self.ids[idx], self.mask[idx]
        return win[:, :-1], win[:, 1:], m[:, 1:]


def step_loss(model, x, y, m):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        h = model.hidden(x)
        sel = m.flatten()
        hs = h.flatten(0, 1)[sel]
        ys = y.flatten()[sel]
        total = chunked_loss(hs, model.token_embd.weight, ys)
    return total, int(sel.sum())


@torch.no_grad()
def valid_loss(model, valid, gen, a, long_seq):
    model.eval()
    tot, n = 0.0, 0
    for starts, b, t in ((valid.starts, a.short_batch, a.short_seq), (valid.long_starts(a.short_seq), a.long_batch, long_seq)):
        if len(starts) == 0:
            continue
        for _ in range(4):
            x, y, m = valid.batch(gen, starts, b, t)
            l, k = step_loss(model, x, y, m)
            tot, n = tot + float(l), n + k
    model.train()
    return tot / max(n, 1)


def train(a):
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    vgen = torch.Generator().manual_seed(a.seed + 1)
    dev = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    corpus = Corpus(a.corpus, dev)
    valid = Corpus(a.valid, dev) if a.valid else None
    hp = hyperparameters(a, corpus.meta["vocab"])
    long_seq = a.long_seq or (int(corpus.lengths.max()) + 1 + 511) // 512 * 512
    long_seq = min(long_seq, a.ctx)
    long_starts = corpus.long_starts(a.short_seq)
    model = Model(hp).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2 and p is not model.token_embd.weight]
    rest = [p for p in model.parameters() if not (p.dim() == 2 and p is not model.token_embd.weight)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    print("model: %d parameters, %s; corpus %d tokens (%d supervised, %d documents, %d long); windows %dx%d and %dx%d"
          % (n_params, json.dumps(hp), corpus.meta["tokens"], corpus.meta["supervisedTokens"], len(corpus.starts),
             len(long_starts), a.short_batch, a.short_seq, a.long_batch, long_seq), flush=True)
    os.makedirs(a.out, exist_ok=True)
    csv = open(os.path.join(a.out, "loss.csv"), "w")
    csv.write("step,seconds,lr,train_loss,valid_loss,tokens\n")
    start, seen, run_loss, run_n, step = time.time(), 0, 0.0, 0, 0
    last = {}
    while step < a.steps:
        elapsed = time.time() - start
        if elapsed > a.max_seconds:
            print("stopping at the time limit after %d steps" % step, flush=True)
            break
        progress = max(step / a.steps, elapsed / a.max_seconds)
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        lr = min(lr, a.min_lr + (a.lr - a.min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))
        for g in opt.param_groups:
            g["lr"] = lr
        long = len(long_starts) > 0 and step % a.long_every == a.long_every - 1
        x, y, m = corpus.batch(gen, long_starts, a.long_batch, long_seq) if long else \
            corpus.batch(gen, corpus.starts, a.short_batch, a.short_seq)
        total, k = step_loss(model, x, y, m)
        if k == 0:  # no assistant token in these windows: nothing to learn from
            step += 1
            continue
        loss = total / k
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += x.numel()
        run_loss, run_n = run_loss + float(total), run_n + k
        if step % a.log_every == 0 or step == a.steps:
            vl = float("nan")
            if valid and (step % a.valid_every == 0 or step == a.steps):
                vl = valid_loss(model, valid, vgen, a, long_seq)
            tl = run_loss / max(run_n, 1)
            el = time.time() - start
            last = {"step": step, "seconds": round(el, 1), "trainLoss": round(tl, 4), "validLoss": round(vl, 4)}
            print("step %5d  %6.1fs  lr %.2e  train %.4f  valid %.4f  %.0f tok/s"
                  % (step, el, lr, tl, vl, seen / el), flush=True)
            csv.write("%d,%.1f,%.3e,%.4f,%.4f,%d\n" % (step, el, lr, tl, vl, seen))
            csv.flush()
            run_loss, run_n = 0.0, 0
    csv.close()
    w = WeightWriter(a.out)
    named = model.named_tensors()
    for name, shape in tensor_shapes(hp):
        t = named[name].detach()
        assert list(t.shape) == shape, (name, list(t.shape), shape)
        w.add(name, shape, f16_bytes(t))
    w.finish(hp, {"seed": a.seed, "steps": step, "plannedSteps": a.steps, "maxSeconds": a.max_seconds,
                  "seconds": round(time.time() - start, 1), "tokensSeen": seen, "corpus": corpus.meta,
                  "shortWindow": [a.short_batch, a.short_seq], "longWindow": [a.long_batch, long_seq],
                  "longEvery": a.long_every, "lr": [a.lr, a.min_lr], "warmup": a.warmup, "last": last,
                  "torch": torch.__version__, "device": torch.cuda.get_device_name()})
    print("weights in %s after %d steps, %.0fs" % (a.out, step, time.time() - start), flush=True)
    probe(model, a)


def f16_bytes(t):
    """The little-endian float16 bytes of t, without numpy."""
    h = t.detach().to(torch.float16).contiguous().cpu()
    return ctypes.string_at(h.data_ptr(), h.numel() * 2)


@torch.no_grad()
def probe(model, a):
    """Greedy answers to the corpus's probe prompts (held-out documents), printed
    and written to OUT/samples.txt beside what the corpus would have answered."""
    path = os.path.join(a.corpus, "probes.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        probes = json.load(f)
    pieces = [bytes.fromhex(p) for p in probes["pieces"]]
    model.eval()
    out = []
    for p in probes["probes"]:
        ids = torch.tensor([p["prompt"]], device="cuda")
        got = []
        for _ in range(p.get("maxTokens", 64)):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                h = model.hidden(ids)[:, -1]
                nxt = int((h.float() @ model.token_embd.weight.float().t()).argmax(-1))
            if nxt in probes["stop"]:
                break
            got.append(nxt)
            ids = torch.cat((ids, torch.tensor([[nxt]], device="cuda")), dim=1)
        text = b"".join(pieces[i] for i in got).decode("utf-8", "replace")
        out.append("== %s (%d prompt tokens)\nwant: %s\ngot:  %s\n" % (p["name"], len(p["prompt"]), p["want"], text))
        print(out[-1], flush=True)
    with open(os.path.join(a.out, "samples.txt"), "w") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    train(args)
