#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (tern serve, llama-server).

N concurrent streams, all started at once: each a streamed greedy
`/v1/completions` request with a prompt of P token ids and G generated
tokens (`ignore_eos`, so every stream generates all G; `cache_prompt`
off, so no round reuses an earlier one's prompt). Prompt ids are taken from
the server's own `/tokenize` of a text, a different window per stream, so
no two streams share a prefix. Reports, over the rounds:

- aggregate generation rate: the streams' generated tokens (the usage's
  `completion_tokens` when the server sends it, else the text chunks) over
  the wall time from the first request to the last stream's end;
- time to first token (from sending the request to the first text chunk),
  p50 and p99 over all streams of all rounds;
- inter-token latency: the gaps between consecutive text chunks of a
  stream (a chunk is a token on tern and llama-server, except where the
  text of a token is an incomplete UTF-8 sequence), p50 and p99.

A script, not a `tern` subcommand: it measures any server the same way,
peers included, with nothing but Python's standard library, and keeps an
HTTP client out of the `tern` binary.

usage: serve_bench.py --url http://127.0.0.1:8080 [--streams 16] [--prompt 128]
                      [--gen 128] [--rounds 3] [--warmup 1] [--json]
Needs a slot context of at least prompt + gen tokens (-c / -np on tern).
"""
import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

TEXT = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God "
    "divided the light from the darkness. And God called the light Day, and the darkness he called Night. "
    "And the evening and the morning were the first day. "
)


def post(url, path, body, timeout=600):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    return c, c.getresponse()


def prompts(url, n, length):
    """n windows of `length` ids from the server's tokenization of TEXT repeated."""
    c, r = post(url, "/tokenize", {"content": TEXT * (1 + n * length // 40), "add_special": False})
    ids = json.loads(r.read())["tokens"]
    c.close()
    ids = [t if isinstance(t, int) else t["id"] for t in ids]
    if len(ids) < n * 7 + length:
        sys.exit(f"the text tokenized to {len(ids)} ids, too few for {n} windows of {length}")
    return [ids[i * 7 : i * 7 + length] for i in range(n)]


def stream(url, prompt, gen, out):
    """One streamed request; appends (ttft, [gaps], tokens, error) to out."""
    body = {
        "prompt": prompt,
        "max_tokens": gen,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    try:
        c, r = post(url, "/v1/completions", body)
        if r.status != 200:
            out.append((None, [], 0, f"HTTP {r.status}: {r.read()[:200]!r}"))
            return
        first, last, gaps, chunks, usage = None, None, [], 0, None
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"].get("completion_tokens")
            choices = ev.get("choices") or []
            if choices and choices[0].get("text"):
                now = time.perf_counter()
                if first is None:
                    first = now - t0
                else:
                    gaps.append(now - last)
                last = now
                chunks += 1
        c.close()
        out.append((first, gaps, usage if usage is not None else chunks, None))
    except Exception as e:  # a failed stream is reported, not fatal to the round
        out.append((None, [], 0, repr(e)))


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def round_(url, ps, gen):
    out = []
    threads = [threading.Thread(target=stream, args=(url, p, gen, out)) for p in ps]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="short requests (8 tokens) run first, not counted")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    ps = prompts(a.url, a.streams, a.prompt)
    for _ in range(a.warmup):
        round_(a.url, ps[:1], min(a.gen, 8))
    rates, ttft, itl, errors = [], [], [], []
    for i in range(a.rounds):
        wall, out = round_(a.url, ps, a.gen)
        tokens = sum(o[2] for o in out)
        errors += [o[3] for o in out if o[3]]
        ttft += [o[0] for o in out if o[0] is not None]
        itl += [g for o in out for g in o[1]]
        rates.append(tokens / wall)
        print(f"round {i + 1}: {tokens} tokens in {wall:.2f} s = {tokens / wall:.2f} t/s", file=sys.stderr)
    res = {
        "streams": a.streams,
        "prompt": a.prompt,
        "gen": a.gen,
        "rounds": a.rounds,
        "gen_tps_median": statistics.median(rates),
        "gen_tps": rates,
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "itl_p50_s": pct(itl, 50),
        "itl_p99_s": pct(itl, 99),
        "failed": len(errors),
    }
    if a.json:
        print(json.dumps(res))
    else:
        print(
            f"{a.streams} streams x ({a.prompt} prompt + {a.gen} generated), {a.rounds} rounds: "
            f"{res['gen_tps_median']:.2f} t/s generated (median; rounds {', '.join(f'{r:.2f}' for r in rates)}); "
            f"TTFT p50 {res['ttft_p50_s'] * 1e3:.0f} ms, p99 {res['ttft_p99_s'] * 1e3:.0f} ms; "
            f"ITL p50 {res['itl_p50_s'] * 1e3:.1f} ms, p99 {res['itl_p99_s'] * 1e3:.1f} ms; {len(errors)} failed"
        )
    for e in errors[:5]:
        print("error:", e, file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
