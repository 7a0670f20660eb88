#!/usr/bin/env python3
"""bench_prefix.py — issue 29's multi-turn benchmark of a server's prefix cache (`qwen35 serve`, any OpenAI-compatible
server). Needs python3 with aiohttp (nothing else); runs offline; prompts are token ids on /v1/completions, so the
model needs no tokenizer (`--dummy qwen3.5-0.8b`).

Workload: --conversations chats of --turns turns each, --concurrency chats in flight (a chat sends its next turn when
the previous reply has ended). Every chat starts with the same --system-token system prompt; a user turn has
~--user tokens, a reply --reply tokens (max_tokens, ignore_eos). The prompt of turn t is

    system + for each earlier turn (user block + reply + <|im_end|> \\n) + the new user block
    system     = <|im_start|> system \\n  ids  <|im_end|> \\n                       (--system tokens in all)
    user block = <|im_start|> user \\n  ids  <|im_end|> \\n <|im_start|> assistant \\n (--user tokens in all)

with Qwen3's ids for the template tokens (151644, 151645, 198, 8948, 872, 77091) and seeded random ids from --id-range
for the rest. The reply of a turn is the ids the server returned when it returns them (`choices[].token_ids`, vLLM's
`return_token_ids`); qwen35 returns no ids, so the history holds seeded stand-in ids of the returned length (the
Qwen3.5 template re-renders an earlier reply differently anyway: docs/SERVE_ENGINE.md, "Prefix cache").

Every request streams with stream_options.include_usage and logprobs 0 (one SSE event per token even when the model
has no tokenizer and the text is empty); TTFT is the time to the first token event. Numbers:
  cached      sum of usage.prompt_tokens_details.cached_tokens
  repeatable  per request, the longest common prefix with any prompt sent before it (client side): the tokens a
              perfect cache could have served (prompts still being prefilled included).
  hit rate    cached / repeatable (issue 29: >= 90 %), also over turns >= 2 alone (chats that start together
              all miss the system prompt: none of them is cached when they arrive); prefill computed = prompt - cached
  TTFT p50 / p99 per turn (issue 29: the last turn's p50 within 2x turn 2's), output tokens/s, requests/s, wall time,
  and the /metrics counters vllm:prefix_cache_queries / _hits before and after.
The issue's checks are reported, not asserted; the exit status is 1 when a request failed.

  bench_prefix.py --url http://127.0.0.1:8000 --out on.json --label cache-on
  bench_prefix.py --compare on.json off.json          (a side-by-side table of runs)
"""
import argparse
import asyncio
import bisect
import json
import math
import random
import sys
import time
import urllib.error
import urllib.request

from bench_serve import parse_metrics  # the same Prometheus text parser (tools/bench_serve.py)

IM_START, IM_END, NL, SYSTEM, USER, ASSISTANT = 151644, 151645, 198, 8948, 872, 77091

# ---- statistics ----


def pct(xs, p):
    """Percentile p (0..100) of xs by linear interpolation (numpy's default); None for no samples."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def lcp(a, b):
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:  # slices compare in C
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixSet:
    """Sequences seen so far, sorted: the longest common prefix of x with any of them is the one with x's
    neighbours in lexicographic order."""

    def __init__(self):
        self.seqs = []

    def longest(self, x):
        i = bisect.bisect_left(self.seqs, x)
        best = 0
        if i > 0:
            best = lcp(x, self.seqs[i - 1])
        if i < len(self.seqs):
            best = max(best, lcp(x, self.seqs[i]))
        return best

    def add(self, x):
        bisect.insort(self.seqs, x)


# ---- HTTP ----


def http_get(url, timeout=10):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception as e:  # noqa: BLE001 — connection refused, timeout
        return 0, "%s: %s" % (type(e).__name__, e)


def scrape(base):
    """/metrics as {sample name with labels: value}; {} when it cannot be read."""
    st, body = http_get(base + "/metrics")
    return parse_metrics(body) if st == 200 else {}


def metric(m, name):
    """Sum of the samples of counter name (with or without _total, any labels); None when absent."""
    vals = [v for k, v in m.items() if k.split("{")[0] in (name, name + "_total")]
    return sum(vals) if vals else None


PREFIX_METRICS = ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                  "vllm:generation_tokens")


# ---- the workload ----


def template_block(rng, kind, total, lo, hi):
    """A system or user block of `total` ids (template ids included, at least one random id)."""
    if kind == "system":
        head, tail = [IM_START, SYSTEM, NL], [IM_END, NL]
    else:
        head, tail = [IM_START, USER, NL], [IM_END, NL, IM_START, ASSISTANT, NL]
    n = max(1, total - len(head) - len(tail))
    return head + [rng.randrange(lo, hi) for _ in range(n)] + tail


def draw_len(rng, mean, ratio):
    return max(1, rng.randint(int(mean * (1 - ratio)), int(mean * (1 + ratio)))) if ratio else mean


class Conv:
    """One chat: its user blocks and reply lengths are drawn up front from its own seed."""

    def __init__(self, args, c, system):
        rng = random.Random(args.seed * 1000003 + c + 1)
        self.index = c
        self.users = [template_block(rng, "user", draw_len(rng, args.user, args.len_ratio), args.id_lo, args.id_hi)
                      for _ in range(args.turns)]
        self.replies = [draw_len(rng, args.reply, args.len_ratio) for _ in range(args.turns)]
        self.stand_in = random.Random(args.seed * 7919 + c + 1)
        self.history = list(system)


async def one_request(session, args, payload, rec):
    """Streams one completion; fills rec (times are time.monotonic() seconds). Returns the reply ids when the server
    sent them, else None."""
    ids = []
    got_ids = False
    rec["t_send"] = time.monotonic()
    try:
        async with session.post(args.url + "/v1/completions", json=payload,
                                timeout=aiohttp.ClientTimeout(total=args.request_timeout)) as r:
            if r.status != 200:
                rec["error"] = "http_%d" % r.status
                rec["detail"] = (await r.text())[:200]
                return None
            done = False
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    rec["error"] = "bad_json_chunk"
                    continue
                if "error" in obj:
                    rec["error"] = "stream_error"
                    rec["detail"] = json.dumps(obj["error"])[:200]
                    continue
                u = obj.get("usage")
                if u:
                    rec["prompt_tokens"] = u.get("prompt_tokens")
                    rec["completion_tokens"] = u.get("completion_tokens")
                    d = u.get("prompt_tokens_details") or {}
                    rec["cached_tokens"] = d.get("cached_tokens")
                chs = obj.get("choices") or []
                if not chs:
                    continue
                c = chs[0]
                n = 0
                lp = c.get("logprobs")
                if isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
                    n = len(lp["tokens"])
                elif c.get("text"):
                    n = 1
                if isinstance(c.get("token_ids"), list):
                    got_ids = True
                    ids.extend(c["token_ids"])
                    n = max(n, len(c["token_ids"]))
                if n and rec["t_first"] is None:
                    rec["t_first"] = time.monotonic()
                if c.get("finish_reason"):
                    rec["finish_reason"] = c["finish_reason"]
            if not done and rec["error"] is None:
                rec["error"] = "no_done"
    except asyncio.TimeoutError:
        rec["error"] = "timeout"
    except aiohttp.ClientError as e:
        rec["error"] = type(e).__name__
    finally:
        rec["t_end"] = time.monotonic()
    if rec["error"] is None and rec["t_first"] is None:
        rec["error"] = "no_token"
    return ids if got_ids else None


async def run_load(args, system):
    convs = [Conv(args, c, system) for c in range(args.conversations)]
    queue = asyncio.Queue()
    for c in convs:
        queue.put_nowait(c)
    sent = PrefixSet()
    recs = []
    deadline = time.monotonic() + args.max_duration if args.max_duration else None
    cut = [0]

    async def chat(session, conv):
        for t in range(args.turns):
            if deadline and time.monotonic() > deadline:
                cut[0] += args.turns - t
                return
            prompt = conv.history + conv.users[t]
            key = tuple(prompt)
            rec = {"conv": conv.index, "turn": t + 1, "prompt_len": len(prompt), "max_tokens": conv.replies[t],
                   "repeatable": sent.longest(key), "t_send": None,
                   "t_first": None, "t_end": None, "prompt_tokens": None, "completion_tokens": None,
                   "cached_tokens": None, "finish_reason": None, "error": None}
            sent.add(key)  # no await between the lookup and this: the order of sending
            payload = {"model": args.model, "prompt": prompt, "max_tokens": conv.replies[t], "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": 0, "logprobs": 0,
                       "ignore_eos": True, "return_token_ids": True}
            recs.append(rec)
            ids = await one_request(session, args, payload, rec)
            if rec["error"] is not None:
                return  # the history of this chat is unknown from here
            if ids is None:
                n = rec["completion_tokens"] if rec["completion_tokens"] is not None else conv.replies[t]
                ids = [conv.stand_in.randrange(args.id_lo, args.id_hi) for _ in range(n)]
            conv.history = prompt + list(ids) + [IM_END, NL]

    async def worker(session):
        while True:
            try:
                conv = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await chat(session, conv)

    conn = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(args.concurrency)))
    return recs, cut[0]


def turn_table(recs, turns):
    rows = []
    for t in range(1, turns + 1):
        ok = [r for r in recs if r["turn"] == t and r["error"] is None]
        ttft = [r["t_first"] - r["t_send"] for r in ok]
        rep = sum(r["repeatable"] for r in ok)
        cached = sum(r["cached_tokens"] or 0 for r in ok)
        rows.append({
            "turn": t,
            "requests": len(ok),
            "prompt_tokens_mean": sum(r["prompt_len"] for r in ok) / len(ok) if ok else None,
            "cached_tokens": cached,
            "repeatable_tokens": rep,
            "hit_rate": cached / rep if rep else None,
            "ttft_p50_ms": 1e3 * pct(ttft, 50) if ttft else None,
            "ttft_p99_ms": 1e3 * pct(ttft, 99) if ttft else None,
            "ttft_mean_ms": 1e3 * sum(ttft) / len(ttft) if ttft else None,
        })
    return rows


def summarize(args, recs, cut, t0, t1, m0, m1):
    ok = [r for r in recs if r["error"] is None]
    errs = {}
    for r in recs:
        if r["error"] is not None:
            errs[r["error"]] = errs.get(r["error"], 0) + 1
    wall = max(1e-9, t1 - t0)
    prompt = sum(r["prompt_len"] for r in ok)
    cached = sum(r["cached_tokens"] or 0 for r in ok)
    rep = sum(r["repeatable"] for r in ok)
    out = sum(r["completion_tokens"] or 0 for r in ok)
    turns = turn_table(recs, args.turns)
    later = [r for r in ok if r["turn"] >= 2]  # without the shared system prompt of chats that start together
    rep_later = sum(r["repeatable"] for r in later)
    total = {
        "requests": len(recs),
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "not_sent_max_duration": cut,
        "errors": errs,
        "no_cached_tokens_field": sum(1 for r in ok if r["cached_tokens"] is None),
        "prompt_tokens": prompt,
        "server_prompt_tokens": sum(r["prompt_tokens"] or 0 for r in ok),
        "cached_tokens": cached,
        "repeatable_tokens": rep,
        "hit_rate": cached / rep if rep else None,
        "hit_rate_turns_2plus": sum(r["cached_tokens"] or 0 for r in later) / rep_later if rep_later else None,
        "prefill_computed_tokens": prompt - cached,
        "output_tokens": out,
        "wall_s": wall,
        "request_throughput": len(ok) / wall,
        "output_throughput": out / wall,
        "prompt_throughput": prompt / wall,
    }
    metrics = {}
    for name in PREFIX_METRICS:
        a, b = metric(m0, name), metric(m1, name)
        metrics[name] = {"before": a, "after": b, "delta": (b - a) if a is not None and b is not None else None}
    second, last = (turns[1]["ttft_p50_ms"] if args.turns >= 2 else None), turns[-1]["ttft_p50_ms"]
    checks = {  # None: no data
        "hit_rate_ge_90": None if total["hit_rate"] is None else total["hit_rate"] >= 0.9,
        "last_turn_ttft_p50_within_2x_turn2": None if second is None or last is None else last <= 2 * second,
    }
    cfg = {k: getattr(args, k) for k in ("url", "model", "conversations", "turns", "system", "user", "reply",
                                         "concurrency", "seed", "len_ratio", "id_range", "max_duration")}
    return {"label": args.label, "config": cfg, "total": total, "turns": turns, "metrics": metrics, "checks": checks,
            "requests": recs}


def f(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def print_run(a):
    t, c = a["total"], a["config"]
    print("==== %s: %d chats x %d turns, system %d, user %d, reply %d, %d in flight ====" % (
        a["label"] or "bench_prefix", c["conversations"], c["turns"], c["system"], c["user"], c["reply"],
        c["concurrency"]))
    print("turn  reqs  prompt  cached  repeatable  hit %   TTFT p50   p99 ms")
    for r in a["turns"]:
        print("%4d  %4d  %6s  %6d  %10d  %5s  %8s  %8s" % (
            r["turn"], r["requests"], f(r["prompt_tokens_mean"], "%.0f"), r["cached_tokens"], r["repeatable_tokens"],
            f(None if r["hit_rate"] is None else 100 * r["hit_rate"]), f(r["ttft_p50_ms"], "%.2f"),
            f(r["ttft_p99_ms"], "%.2f")))
    print("requests %d ok, %d failed%s%s" % (
        t["completed"], t["failed"], " " + json.dumps(t["errors"], sort_keys=True) if t["errors"] else "",
        ", %d turns not sent (--max-duration)" % t["not_sent_max_duration"] if t["not_sent_max_duration"] else ""))
    print("prompt tokens %d, cached %d, repeatable %d: hit rate %s %% (turns >= 2: %s %%)" % (
        t["prompt_tokens"], t["cached_tokens"], t["repeatable_tokens"],
        f(None if t["hit_rate"] is None else 100 * t["hit_rate"]),
        f(None if t["hit_rate_turns_2plus"] is None else 100 * t["hit_rate_turns_2plus"])))
    print("prefill computed %d tokens; output %d tokens; wall %.2f s: %.2f req/s, %.1f output tok/s" % (
        t["prefill_computed_tokens"], t["output_tokens"], t["wall_s"], t["request_throughput"],
        t["output_throughput"]))
    if t["no_cached_tokens_field"]:
        print("WARNING: %d responses without usage.prompt_tokens_details.cached_tokens" % t["no_cached_tokens_field"])
    print("/metrics: " + ", ".join("%s %s" % (k.split(":")[1], f(v["delta"], "%.0f")) for k, v in a["metrics"].items()))
    ch = a["checks"]
    word = {True: "met", False: "NOT met", None: "no data"}
    print("issue 29: hit rate >= 90 %%: %s; turn-%d TTFT p50 <= 2 x turn 2's: %s" % (
        word[ch["hit_rate_ge_90"]], c["turns"], word[ch["last_turn_ttft_p50_within_2x_turn2"]]))
    sys.stdout.flush()


def print_compare(runs):
    """Side by side: one column per run (its label)."""
    def turn(a, t, k):
        rows = [r for r in a["turns"] if r["turn"] == t]
        return rows[0][k] if rows else None

    cols = [a["label"] or "run %d" % i for i, a in enumerate(runs)]
    last = max(a["config"]["turns"] for a in runs)
    lines = [
        ("hit rate (tokens) %", [f(None if a["total"]["hit_rate"] is None else 100 * a["total"]["hit_rate"])
                                 for a in runs]),
        ("hit rate turns >= 2 %", [f(None if a["total"].get("hit_rate_turns_2plus") is None
                                      else 100 * a["total"]["hit_rate_turns_2plus"]) for a in runs]),
        ("cached / prompt tokens", ["%d / %d" % (a["total"]["cached_tokens"], a["total"]["prompt_tokens"])
                                    for a in runs]),
        ("prefill computed", ["%d" % a["total"]["prefill_computed_tokens"] for a in runs]),
        ("TTFT p50 turn 2 / %d ms" % last, ["%s / %s" % (f(turn(a, 2, "ttft_p50_ms"), "%.1f"),
                                                          f(turn(a, last, "ttft_p50_ms"), "%.1f")) for a in runs]),
        ("TTFT p99 turn 2 / %d ms" % last, ["%s / %s" % (f(turn(a, 2, "ttft_p99_ms"), "%.1f"),
                                                          f(turn(a, last, "ttft_p99_ms"), "%.1f")) for a in runs]),
        ("output tok/s", ["%.1f" % a["total"]["output_throughput"] for a in runs]),
        ("requests/s", ["%.2f" % a["total"]["request_throughput"] for a in runs]),
        ("wall s", ["%.1f" % a["total"]["wall_s"] for a in runs]),
        ("failed requests", ["%d" % a["total"]["failed"] for a in runs]),
    ]
    w = max(14, max(len(c) for c in cols) + 2, max(len(v) for _, vs in lines for v in vs) + 2)
    print("%-26s" % "" + "".join("%*s" % (w, c) for c in cols))
    for name, vs in lines:
        print("%-26s" % name + "".join("%*s" % (w, v) for v in vs))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    ap.add_argument("--model", help="the model name to send (default: the first of GET /v1/models)")
    ap.add_argument("--conversations", type=int, default=64)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--system", type=int, default=1500, help="tokens of the shared system prompt")
    ap.add_argument("--user", type=int, default=100, help="tokens of a user turn (template ids included)")
    ap.add_argument("--reply", type=int, default=200, help="max_tokens of a reply (ignore_eos)")
    ap.add_argument("--len-ratio", type=float, default=0.0,
                    help="user / reply lengths uniform in [x (1 - r), x (1 + r)] (0: exact)")
    ap.add_argument("--concurrency", type=int, default=16, help="chats in flight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--id-range", default="1000:100000", help="random ids lo:hi (ordinary tokens of Qwen3 / 3.5)")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    ap.add_argument("--max-duration", type=float, default=0,
                    help="send no new turn after this many seconds (0: no limit); the rest is reported as not sent")
    ap.add_argument("--label", default="")
    ap.add_argument("--out", help="write the numbers (and every request) to this JSON file")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="print the runs' JSON files side by side and exit")
    args = ap.parse_args(argv)
    if args.compare:
        runs = []
        for p in args.compare:
            with open(p) as fh:
                runs.append(json.load(fh))
        print_compare(runs)
        return 0
    global aiohttp
    try:
        import aiohttp
    except ImportError:  # one line, not a traceback
        sys.exit("bench_prefix.py: needs the python3 aiohttp package (apt-get install python3-aiohttp)")
    args.url = args.url.rstrip("/")
    lo, _, hi = args.id_range.partition(":")
    args.id_lo, args.id_hi = int(lo), int(hi)
    if args.conversations < 1 or args.turns < 1 or args.concurrency < 1 or args.system < 6 or args.user < 9:
        sys.exit("bench_prefix.py: --conversations, --turns, --concurrency >= 1, --system >= 6, --user >= 9")
    if not args.model:
        st, body = http_get(args.url + "/v1/models")
        if st != 200:
            sys.exit("bench_prefix.py: GET %s/v1/models: %s %s" % (args.url, st, body[:200]))
        args.model = json.loads(body)["data"][0]["id"]
    system = template_block(random.Random(args.seed), "system", args.system, args.id_lo, args.id_hi)
    m0 = scrape(args.url)
    t0 = time.monotonic()
    recs, cut = asyncio.run(run_load(args, system))
    t1 = time.monotonic()
    m1 = scrape(args.url)
    a = summarize(args, recs, cut, t0, t1, m0, m1)
    print_run(a)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(a, fh, indent=1, sort_keys=True)
    return 1 if a["total"]["failed"] or not a["total"]["completed"] else 0


if __name__ == "__main__":
    sys.exit(main())
