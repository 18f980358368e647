#!/usr/bin/env python3
"""Probes used for docs/gpu-runs/perf-notes.txt (stdlib only; runs where the device has no Go).

  perf-probe.py slots URL SLOTS [REPS]
      Against a macfleet-runner started fresh with --parallel SLOTS: pins prompt P_i to
      slot i (admission gives a fresh runner's free slots in id order), then times
      concurrent streams whose prompts are P_i for chosen sets of i, i.e. chosen slot
      ids: contiguous, strided, two blocks. Aggregate tok/s as test/bench/peers counts it
      (tokens over first token of any stream .. last finish).
  perf-probe.py curve URL SLOTS N1,N2,.. T1,T2,.. [TOKENS]
      Pins P_i to slot i, then for each N and temperature T times N concurrent streams
      on slots 0..N-1: aggregate tok/s and ms a step.
  perf-probe.py profile URL SINGLE STREAMS TOKENS
      Greedy: one stream of SINGLE tokens, then STREAMS streams on slots 0..STREAMS-1.
  perf-probe.py ttft URL N [MAXTOK]
      N sequential short streamed chats (each prompt unique), one line each: client-side
      time to the response headers and to the first content chunk, ms.
"""
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse

FILLER = ("the fleet of machines serves models to teams who ask questions about weather trains rivers "
          "cities music numbers gardens history science stories and code every day").split()


def chat(url, prompt, max_tokens, model=None, temperature=0.8):
    """One streamed chat: returns start, headers, first content, end (perf_counter s), tokens."""
    model = model or os.environ.get("PROBE_MODEL", "mid")
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": temperature, "seed": 1, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    th = time.perf_counter()
    if resp.status != 200:
        raise RuntimeError("status %d: %s" % (resp.status, resp.read()[:300]))
    first = None
    tokens = ptoks = 0
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        if ev.get("usage"):
            tokens = ev["usage"].get("completion_tokens", 0)
            ptoks = ev["usage"].get("prompt_tokens", 0)
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content") and first is None:
                first = time.perf_counter()
    end = time.perf_counter()
    conn.close()
    return {"start": t0, "headers": th, "first": first or end, "end": end, "tokens": tokens, "prompt": ptoks}


def post(url, path):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    conn.request("POST", path, "{}", {"Content-Type": "application/json"})
    r = conn.getresponse()
    out = r.read()
    conn.close()
    return r.status, out


def concurrent(url, prompts, max_tokens, temperature=0.8):
    res = [None] * len(prompts)
    errs = []

    def go(i):
        try:
            res[i] = chat(url, prompts[i], max_tokens, temperature=temperature)
        except Exception as e:  # noqa: BLE001
            errs.append(e)

    th = [threading.Thread(target=go, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errs:
        raise errs[0]
    first = min(r["first"] for r in res)
    last = max(r["end"] for r in res)
    tok = sum(r["tokens"] for r in res)
    return tok / (last - first), tok, last - first


def pin_prompt(i):
    # Unique from its first words on, so slot i shares far more with P_i than any other.
    words = " ".join(FILLER[(i * 7 + k) % len(FILLER)] for k in range(12))
    return "Topic %d alpha %d: %s. Tell a long story." % (i, i * 7919 % 1000, words)


def runs(ids):
    ids = sorted(ids)
    n = 1
    for a, b in zip(ids, ids[1:]):
        if b != a + 1:
            n += 1
    return n


def pin(url, nslots):
    """Pins P_i to slot i: staggered arrivals, each generating long enough that no slot
    frees before all are admitted; then aborts them all."""
    threads = []
    for i in range(nslots):
        t = threading.Thread(target=lambda i=i: _quiet(url, pin_prompt(i), 600))
        t.start()
        threads.append(t)
        time.sleep(0.03)
    time.sleep(0.5)
    print("abort:", post(url, "/abort"), flush=True)
    for t in threads:
        t.join()


def curve(url, nslots, counts, temps, tokens):
    """Step time against the number of streams: N streams on slots 0..N-1 (one
    micro-batch), greedy and sampled, so that the difference is the sampling's share."""
    pin(url, nslots)
    print("%4s %6s %9s %9s" % ("N", "temp", "tok/s", "ms/step"), flush=True)
    for n in counts:
        for temp in temps:
            agg, tok, span = concurrent(url, [pin_prompt(i) for i in range(n)], tokens, temperature=temp)
            print("%4d %6.2f %9.1f %9.2f" % (n, temp, agg, 1e3 * n / agg), flush=True)


def profile(url, single, streams, tokens):
    """What runs under the profiler: one stream of `single` tokens, then `streams`
    streams of `tokens` tokens on slots 0..streams-1."""
    r = chat(url, "Profile one stream, tell a story about the sea.", single, temperature=0)
    print("single: %d tokens" % r["tokens"], flush=True)
    agg, tok, span = concurrent(url, [pin_prompt(i) for i in range(streams)], tokens, temperature=0)
    print("streams: %d tokens" % tok, flush=True)


def slots(url, nslots, reps):
    # 1. One stream on the fresh runner (CUDA graphs not yet disturbed).
    r = chat(url, "Warm up, then tell a long story about the sea.", 128)
    d1 = (r["tokens"] - 1) / (r["end"] - r["first"])
    print("decode1 fresh: %.1f tok/s (%d tokens)" % (d1, r["tokens"]), flush=True)
    # 2. Pin P_i to slot i.
    pin(url, nslots)
    n, h = nslots // 4, nslots // 2
    layouts = {
        "contiguous 0..%d" % (n - 1): list(range(n)),
        "two blocks 0..%d,%d..%d" % (n // 2 - 1, h, h + n // 2 - 1): list(range(n // 2)) + list(range(h, h + n // 2)),
        "stride 4 (0,4,..,%d)" % (4 * (n - 1)): list(range(0, 4 * n, 4)),
    }
    results = {k: [] for k in layouts}
    for rep in range(reps):
        for name, ids in layouts.items():
            agg, tok, span = concurrent(url, [pin_prompt(i) for i in ids], 128)
            results[name].append(agg)
            print("rep %d %-24s runs=%2d agg=%7.1f tok/s (%d tokens in %.2f s)" % (rep, name, runs(ids), agg, tok, span),
                  flush=True)
    r = chat(url, pin_prompt(0), 128)
    d1b = (r["tokens"] - 1) / (r["end"] - r["first"])
    print("decode1 after (slot 0): %.1f tok/s (%d tokens)" % (d1b, r["tokens"]), flush=True)
    print("\nsummary (median of %d):" % reps)
    for name, ids in layouts.items():
        v = results[name]
        print("  %-24s runs=%2d median %7.1f  (min %.1f max %.1f)" % (name, runs(ids), statistics.median(v), min(v), max(v)))
    print("  decode1 fresh %.1f, after %.1f" % (d1, d1b), flush=True)


def _quiet(url, prompt, max_tokens):
    try:
        chat(url, prompt, max_tokens)
    except Exception:  # noqa: BLE001
        pass


def ttft(url, n, max_tokens):
    hs, fs = [], []
    for i in range(n):
        r = chat(url, "Request %d-%d. Hello! What can you do?" % (i, int(time.time() * 1000) % 100000), max_tokens)
        h = (r["headers"] - r["start"]) * 1e3
        f = (r["first"] - r["start"]) * 1e3
        hs.append(h)
        fs.append(f)
        print("  req %2d headers %7.1f ms first %7.1f ms total %7.1f ms tokens %d prompt %d" %
              (i, h, f, (r["end"] - r["start"]) * 1e3, r["tokens"], r["prompt"]), flush=True)
        time.sleep(0.2)
    print("  TTFT median %.1f ms (min %.1f max %.1f); headers median %.1f" %
          (statistics.median(fs), min(fs), max(fs), statistics.median(hs)), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "slots":
        slots(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 3)
    elif sys.argv[1] == "curve":
        curve(sys.argv[2], int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")],
              [float(x) for x in sys.argv[5].split(",")], int(sys.argv[6]) if len(sys.argv) > 6 else 64)
    elif sys.argv[1] == "profile":
        profile(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1] == "ttft":
        ttft(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 4)
