#!/usr/bin/env python3
"""bench_serve.py — a serving load generator for `qwen35 serve` (any OpenAI-compatible server), in the style of
`vllm bench serve`. Needs python3 with aiohttp (nothing else); runs offline.

Three modes:
  serve         (default) N requests, Poisson arrivals at --request-rate (inf: all at once) and/or at most
                --max-concurrency in flight; random token-id prompts of exact length (completions endpoint);
                reports request throughput, output / total tokens/s, TTFT / TPOT / ITL mean, p50, p90, p99,
                errors by kind.
  ttft          TTFT of a --input-len-token prompt on an idle server: sequential requests (max_tokens 1),
                p50 / p90 / p99 over --num-prompts (issue 28: 128-token prompt <= 1.5 ms). A model without a
                tokenizer (--dummy) needs no --logprobs here: a request whose one token came with no text
                event is timed by its finish chunk, which leaves in the step that made the token.
  interference  --streams long-running streams; their inter-token latency in a steady window, then while
                requests with --inject-input-len-token prompts arrive at --inject-rate; p50 / p99 of both
                windows and the ratio (issue 28: p99 during injection <= 3 x steady p99).

Every request streams (SSE) with stream_options.include_usage, so completion_tokens is the server's count. A
token is an SSE event with text, or with logprobs entries (one per token: --logprobs 0 on the completions
endpoint gives one event per token even when the model has no tokenizer and the text is empty). ITL is the gap
between token events of one request; an event carrying k > 1 tokens (the client fell behind) counts as k gaps of
1/k of it, and the number of such events is reported. Timestamps are time.monotonic() (CLOCK_MONOTONIC on
Linux: comparable across the --workers processes that share the load, so the client's own parsing is not the
bottleneck at tens of thousands of tokens/s).

Examples:
  bench_serve.py --base-url http://127.0.0.1:8000 --num-prompts 256 --random-input-len 1024 \
      --random-output-len 256 --random-range-ratio 0.5 --request-rate inf --max-concurrency 64 --ignore-eos
  bench_serve.py --mode ttft --input-len 128 --num-prompts 100
  bench_serve.py --mode interference --streams 64 --steady-s 10 --inject-s 10 --inject-rate 4
"""
import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
import urllib.error
import urllib.request

try:
    import aiohttp
except ImportError:  # one line, not a traceback: the GPU machine has it, a dev box may not
    sys.exit("bench_serve.py: needs the python3 aiohttp package (apt-get install python3-aiohttp)")

# ---- statistics ----


def pct(xs, p):
    """Percentile p (0..100) of xs by linear interpolation (numpy's default); NaN for no samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(math.floor(k))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(xs, scale=1e3):
    """mean / p50 / p90 / p99 / max of xs (seconds) in ms."""
    if not xs:
        return {"n": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    return {
        "n": len(xs),
        "mean": scale * sum(xs) / len(xs),
        "p50": scale * pct(xs, 50),
        "p90": scale * pct(xs, 90),
        "p99": scale * pct(xs, 99),
        "max": scale * max(xs),
    }


def fmt_ms(s):
    if s["n"] == 0:
        return "n=0"
    return "mean %.3f p50 %.3f p90 %.3f p99 %.3f max %.3f ms (n=%d)" % (
        s["mean"], s["p50"], s["p90"], s["p99"], s["max"], s["n"])


# ---- HTTP helpers ----


def http_get(base, path, api_key=None, timeout=10):
    """(status, body text) of GET base+path; status 0 and the error text when it cannot connect."""
    req = urllib.request.Request(base.rstrip("/") + path)
    if api_key:
        req.add_header("Authorization", "Bearer " + api_key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except Exception as e:  # noqa: BLE001 — connection refused, timeout, reset
        return 0, "%s: %s" % (type(e).__name__, e)


def served_model(base, api_key=None):
    st, body = http_get(base, "/v1/models", api_key)
    if st != 200:
        raise SystemExit("bench_serve.py: GET %s/v1/models: %s %s" % (base, st, body[:200]))
    return json.loads(body)["data"][0]["id"]


def parse_metrics(text):
    """Prometheus text -> {name{labels}: value} (samples only)."""
    out = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        k, _, v = line.rpartition(" ")
        try:
            out[k] = float(v)
        except ValueError:
            pass
    return out


def metric(m, name):
    """Sum of every sample of metric name (any labels)."""
    return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))


def scrape(base):
    st, body = http_get(base, "/metrics")
    return parse_metrics(body) if st == 200 else {}


# ---- one streamed request ----


class Result:
    """What one request saw. t_* are time.monotonic() seconds; tok_t holds one entry per token event
    (time, tokens in it)."""

    __slots__ = ("tag", "t_send", "t_first", "t_end", "t_finish", "events", "prompt_tokens", "completion_tokens",
                 "finish_reason", "error", "ids", "models", "text", "lps", "got_done", "multi", "status")

    def __init__(self, tag=None):
        self.tag = tag
        self.t_send = self.t_first = self.t_end = self.t_finish = None  # t_finish: the finish_reason chunk
        self.events = []  # (t, n_tokens)
        self.prompt_tokens = self.completion_tokens = None
        self.finish_reason = None
        self.error = None  # a short kind: http_400, stream_error, timeout, ...
        self.ids = set()
        self.models = set()
        self.text = []  # with strict: the text of every chunk
        self.lps = []  # with strict: every token's logprob
        self.got_done = False
        self.multi = 0
        self.status = None

    def tokens_seen(self):
        return sum(n for _, n in self.events)

    def itls(self):
        """(arrival time, gap) per token after the first; a k-token event gives k gaps of gap/k."""
        out = []
        for (t0, _), (t1, n) in zip(self.events, self.events[1:]):
            g = (t1 - t0) / n
            out.extend((t1, g) for _ in range(n))
        return out

    def as_dict(self):
        return {k: (sorted(getattr(self, k)) if isinstance(getattr(self, k), set) else getattr(self, k))
                for k in self.__slots__ if k not in ("text", "lps")}


def event_tokens(obj):
    """Tokens carried by one chunk: logprobs entries when present, else 1 if it has text (0: role / usage /
    finish-only chunk)."""
    chs = obj.get("choices") or []
    if not chs:
        return 0
    c = chs[0]
    lp = c.get("logprobs")
    if isinstance(lp, dict):
        if isinstance(lp.get("tokens"), list):  # completions (legacy form)
            return len(lp["tokens"])
        if isinstance(lp.get("content"), list):  # chat
            return len(lp["content"])
    if "text" in c:
        return 1 if c["text"] else 0
    d = c.get("delta") or {}
    return 1 if (d.get("content") or d.get("reasoning_content")) else 0


def event_logprobs(obj):
    """The logprob of every token in one chunk (completions or chat form)."""
    chs = obj.get("choices") or []
    lp = chs[0].get("logprobs") if chs else None
    if not isinstance(lp, dict):
        return []
    if isinstance(lp.get("token_logprobs"), list):
        return lp["token_logprobs"]
    return [x.get("logprob") for x in lp.get("content") or []]


def event_text(obj):
    chs = obj.get("choices") or []
    if not chs:
        return ""
    c = chs[0]
    if "text" in c:
        return c["text"] or ""
    d = c.get("delta") or {}
    return (d.get("reasoning_content") or "") + (d.get("content") or "")


async def stream_request(session, url, payload, res, timeout=None, headers=None, disconnect_after=None,
                         strict=None):
    """POSTs payload (stream: true) and fills res. disconnect_after: close the connection after that many
    token events (a client that goes away). strict: a list the well-formedness problems are appended to."""
    res.t_send = time.monotonic()
    try:
        async with session.post(url, json=payload, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            res.status = r.status
            if r.status != 200:
                body = await r.read()
                res.error = "http_%d" % r.status
                if strict is not None:
                    try:
                        e = json.loads(body)["error"]
                        if not isinstance(e.get("message"), str) or "type" not in e:
                            strict.append("error object without message/type: %r" % body[:200])
                    except Exception:  # noqa: BLE001
                        strict.append("error body is not an OpenAI error object: %r" % body[:200])
                res.t_end = time.monotonic()
                return res
            ended_finish = False
            async for raw in r.content:
                line = raw.strip()
                if not line:
                    continue
                t = time.monotonic()
                if not line.startswith(b"data:"):
                    if strict is not None:
                        strict.append("non-data SSE line %r" % line[:80])
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    res.got_done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    res.error = "bad_json_chunk"
                    if strict is not None:
                        strict.append("chunk is not JSON: %r" % data[:120])
                    continue
                if "error" in obj:
                    res.error = "stream_error"
                    continue
                if "id" in obj:
                    res.ids.add(obj["id"])
                if "model" in obj:
                    res.models.add(obj["model"])
                if obj.get("usage"):
                    u = obj["usage"]
                    res.prompt_tokens = u.get("prompt_tokens")
                    res.completion_tokens = u.get("completion_tokens")
                chs = obj.get("choices") or []
                if chs and chs[0].get("finish_reason"):
                    if ended_finish and strict is not None:
                        strict.append("two chunks with finish_reason")
                    res.finish_reason = chs[0]["finish_reason"]
                    res.t_finish = t
                    ended_finish = True
                elif chs and ended_finish and strict is not None:
                    strict.append("choice chunk after finish_reason")
                n = event_tokens(obj)
                if strict is not None:
                    res.text.append(event_text(obj))
                    res.lps.extend(event_logprobs(obj))
                if n:
                    if res.t_first is None:
                        res.t_first = t
                    if n > 1:
                        res.multi += 1
                    res.events.append((t, n))
                    if disconnect_after is not None and len(res.events) >= disconnect_after:
                        res.error = "client_disconnect"
                        break
            if not res.got_done and res.error is None:
                res.error = "no_done"
    except asyncio.TimeoutError:
        res.error = "timeout"
    except aiohttp.ClientError as e:
        res.error = type(e).__name__
    except Exception as e:  # noqa: BLE001 — a load generator reports, it does not die
        res.error = "client_" + type(e).__name__
    res.t_end = time.monotonic()
    return res


# ---- request payloads ----

WORDS = ("the of and to in is was for on that with as by at from his her an be this which or are it had not but "
         "have one were all they their time first new after two can more other only when into so people year "
         "would some these over also than then its most well could made like between such through").split()


def make_payload(args, rng, in_len, out_len, seed=None):
    """A streaming request of exactly in_len random token ids (completions) or ~in_len words (chat)."""
    p = {"model": args.model, "max_tokens": out_len, "stream": True, "stream_options": {"include_usage": True}}
    if args.endpoint == "chat":
        p["messages"] = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(in_len))}]
    else:
        p["prompt"] = [rng.randrange(args.id_lo, args.id_hi) for _ in range(in_len)]
    if args.ignore_eos:
        p["ignore_eos"] = True
    if args.temperature is not None:
        p["temperature"] = args.temperature
    if args.top_k is not None:
        p["top_k"] = args.top_k
    if args.top_p is not None:
        p["top_p"] = args.top_p
    if args.logprobs is not None:
        if args.endpoint == "chat":
            p["logprobs"] = True
            p["top_logprobs"] = args.logprobs
        else:
            p["logprobs"] = args.logprobs
    p["seed"] = seed if seed is not None else rng.randrange(1 << 31)
    return p


def endpoint_url(args):
    return args.base_url.rstrip("/") + ("/v1/chat/completions" if args.endpoint == "chat" else "/v1/completions")


def headers(args):
    return {"Authorization": "Bearer " + args.api_key} if args.api_key else None


def lengths(rng, n, mean, ratio, lo=1):
    """n lengths uniform in [mean (1 - ratio), mean (1 + ratio)] (vLLM's --random-range-ratio), at least lo."""
    a, b = max(lo, int(mean * (1 - ratio))), max(lo, int(mean * (1 + ratio)))
    return [rng.randint(a, b) for _ in range(n)]


def connector(limit):
    return aiohttp.TCPConnector(limit=limit, force_close=False, enable_cleanup_closed=True)


# ---- mode serve ----


async def serve_worker(args, reqs, rate, conc, t0):
    """Sends reqs [(index, payload)] with Poisson arrivals at rate (inf: at once), at most conc in flight."""
    rng = random.Random(args.seed * 7919 + os.getpid())
    sem = asyncio.Semaphore(conc) if conc else None
    url, hdr = endpoint_url(args), headers(args)
    deadline = t0 + args.max_duration if args.max_duration else None
    async with aiohttp.ClientSession(connector=connector(conc or 0)) as session:

        async def one(i, payload):
            if sem:
                async with sem:
                    return i, await stream_request(session, url, payload, Result(i), args.request_timeout, hdr)
            return i, await stream_request(session, url, payload, Result(i), args.request_timeout, hdr)

        tasks = []
        for i, payload in reqs:
            if deadline and time.monotonic() > deadline:
                break
            tasks.append(asyncio.create_task(one(i, payload)))
            if rate != float("inf"):
                await asyncio.sleep(rng.expovariate(rate))
        if deadline:
            done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
            for t in pending:
                t.cancel()
            out = [t.result() for t in done if not t.cancelled() and t.exception() is None]
            cut = [Result(None) for _ in pending]
            for r in cut:
                r.error = "cut_by_max_duration"
            return [r.as_dict() for _, r in out] + [r.as_dict() for r in cut]
        return [r.as_dict() for _, r in await asyncio.gather(*tasks)]


def run_worker(fn, *a):
    return asyncio.run(fn(*a))


def split(xs, k):
    return [xs[i::k] for i in range(k)]


def in_workers(nw, fn, per_worker_args):
    """Runs fn(*args) in nw processes (fork) and returns their results; in-process when nw == 1."""
    if nw == 1:
        return [run_worker(fn, *per_worker_args[0])]
    ctx = mp.get_context("fork")
    with ctx.Pool(nw) as pool:
        return pool.starmap(run_worker, [(fn,) + tuple(a) for a in per_worker_args])


def aggregate(results, t_start, t_stop):
    """vLLM-style numbers over results (dicts of Result)."""
    ok = [r for r in results if r["error"] is None]
    errs = {}
    for r in results:
        if r["error"] is not None:
            errs[r["error"]] = errs.get(r["error"], 0) + 1
    dur = max(1e-9, t_stop - t_start)
    out_tok = sum(r["completion_tokens"] or 0 for r in ok)
    in_tok = sum(r["prompt_tokens"] or 0 for r in ok)
    ttft = [r["t_first"] - r["t_send"] for r in ok if r["t_first"] is not None]
    tpot = []
    itl = []
    for r in ok:
        n = r["completion_tokens"] or 0
        if r["t_first"] is not None and n > 1:
            tpot.append((r["t_end"] - r["t_first"]) / (n - 1))
        ev = r["events"]
        for (ta, _), (tb, k) in zip(ev, ev[1:]):
            itl.extend([(tb - ta) / k] * k)
    e2e = [r["t_end"] - r["t_send"] for r in ok]
    seen = sum(sum(n for _, n in r["events"]) for r in ok)
    return {
        "duration_s": dur,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": errs,
        "input_tokens": in_tok,
        "output_tokens": out_tok,
        "output_tokens_seen": seen,
        "multi_token_events": sum(r["multi"] for r in ok),
        "request_throughput": len(ok) / dur,
        "output_throughput": out_tok / dur,
        "total_token_throughput": (in_tok + out_tok) / dur,
        "ttft_ms": summary(ttft),
        "tpot_ms": summary(tpot),
        "itl_ms": summary(itl),
        "e2e_ms": summary(e2e),
    }


def print_serve(name, a):
    print("==== %s ====" % name)
    print("completed %d  failed %d  errors %s  duration %.2f s" % (
        a["completed"], a["failed"], json.dumps(a["errors"], sort_keys=True) if a["errors"] else "{}",
        a["duration_s"]))
    print("tokens: input %d output %d (events counted %d, multi-token events %d)" % (
        a["input_tokens"], a["output_tokens"], a["output_tokens_seen"], a["multi_token_events"]))
    if a["output_tokens"] and not a["output_tokens_seen"]:
        print("WARNING: no token events (empty text: a model without tokenizer.json?): use --logprobs 0")
    print("request throughput %.2f req/s  output %.1f tok/s  total %.1f tok/s" % (
        a["request_throughput"], a["output_throughput"], a["total_token_throughput"]))
    for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        print("%-5s %s" % (k[:-3].upper(), fmt_ms(a[k])))
    sys.stdout.flush()


def mode_serve(args):
    rng = random.Random(args.seed)
    n = args.num_prompts
    if args.input_len is not None:
        ins = [args.input_len] * n
    else:
        ins = lengths(rng, n, args.random_input_len, args.random_range_ratio)
    outs = [args.output_len] * n if args.output_len is not None else lengths(
        rng, n, args.random_output_len, args.random_range_ratio)
    reqs = [(i, make_payload(args, rng, ins[i], outs[i])) for i in range(n)]
    if args.warmup:
        warm = [(i, make_payload(args, rng, ins[i % n], min(outs[i % n], 16))) for i in range(args.warmup)]
        run_worker(serve_worker, args, warm, float("inf"), min(args.warmup, 8), time.monotonic())
    nw = max(1, min(args.workers, n))
    rate = args.request_rate / nw
    conc = [len(c) for c in split(list(range(args.max_concurrency)), nw)] if args.max_concurrency else [0] * nw
    if args.max_concurrency and args.max_concurrency < nw:
        nw = args.max_concurrency
        conc = [1] * nw
        rate = args.request_rate / nw
    m0 = scrape(args.base_url)
    t0 = time.monotonic()
    parts = in_workers(nw, serve_worker, [(args, p, rate, c, t0) for p, c in zip(split(reqs, nw), conc)])
    t1 = time.monotonic()
    m1 = scrape(args.base_url)
    results = [r for p in parts for r in p]
    a = aggregate(results, t0, t1)
    a["config"] = {k: (str(getattr(args, k)) if getattr(args, k) == float("inf") else getattr(args, k)) for k in ("endpoint", "num_prompts", "request_rate", "max_concurrency",
                                                    "random_input_len", "random_output_len", "random_range_ratio",
                                                    "input_len", "output_len", "ignore_eos", "logprobs", "workers")}
    a["server"] = server_delta(m0, m1, t1 - t0)
    print_serve(args.label or "serve", a)
    if a["server"]:
        print("server: %s" % json.dumps(a["server"], sort_keys=True))
    return a


def server_delta(m0, m1, dur):
    """Counters from /metrics over the run (the server's own view)."""
    if not m0 or not m1:
        return {}
    d = {}
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        d[name.split(":")[1]] = metric(m1, name) - metric(m0, name)
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_to_first_token_seconds"):
        c = metric(m1, name + "_count") - metric(m0, name + "_count")
        s = metric(m1, name + "_sum") - metric(m0, name + "_sum")
        d[name.split(":")[1].replace("_seconds", "_mean_ms")] = 1e3 * s / c if c else None
    d["generation_tokens_per_s"] = d["generation_tokens_total"] / dur if dur > 0 else None  # at request ends
    itl_n = metric(m1, "vllm:inter_token_latency_seconds_count") - metric(m0, "vllm:inter_token_latency_seconds_count")
    d["tokens_per_s_by_itl"] = itl_n / dur if dur > 0 else None  # as generated (first tokens not counted)
    return d


# ---- mode ttft ----


async def ttft_run(args, snaps):
    rng = random.Random(args.seed)
    url, hdr = endpoint_url(args), headers(args)
    ttft, e2e, errs = [], [], {}
    deadline = time.monotonic() + args.max_duration if args.max_duration else None
    async with aiohttp.ClientSession(connector=connector(1)) as session:
        for i in range(args.warmup + args.num_prompts):
            if deadline and time.monotonic() > deadline:
                errs["cut_by_max_duration"] = args.warmup + args.num_prompts - i
                break
            if i == args.warmup:
                snaps.append((time.monotonic(), scrape(args.base_url)))
            p = make_payload(args, rng, args.input_len or 128, 1)
            r = await stream_request(session, url, p, Result(i), args.request_timeout, hdr)
            if i < args.warmup:
                continue
            if r.t_first is None and r.completion_tokens == 1 and r.t_finish is not None:
                r.t_first = r.t_finish  # a token without text (no tokenizer, no logprobs): with max_tokens 1 its
                # finish chunk leaves in the step that made it
            if r.error or r.t_first is None:
                k = r.error or "no_token"
                errs[k] = errs.get(k, 0) + 1
                continue
            ttft.append(r.t_first - r.t_send)
            e2e.append(r.t_end - r.t_send)
            if args.ttft_gap_ms:
                await asyncio.sleep(args.ttft_gap_ms / 1e3)
    return ttft, e2e, errs


def mode_ttft(args):
    snaps = []
    ttft, e2e, errs = asyncio.run(ttft_run(args, snaps))
    m1 = scrape(args.base_url)
    t0, m0 = snaps[0] if snaps else (time.monotonic(), {})
    a = {"input_len": args.input_len or 128, "ttft_ms": summary(ttft), "e2e_ms": summary(e2e), "errors": errs,
         "server": server_delta(m0, m1, time.monotonic() - t0)}
    print("==== %s ====" % (args.label or "ttft (idle server, sequential, max_tokens 1)"))
    print("prompt %d tokens, %d requests, errors %s" % (a["input_len"], len(ttft), json.dumps(errs) if errs else "{}"))
    print("TTFT  %s" % fmt_ms(a["ttft_ms"]))
    print("E2E   %s" % fmt_ms(a["e2e_ms"]))
    if a["server"].get("time_to_first_token_mean_ms") is not None:
        print("server-side TTFT mean %.3f ms" % a["server"]["time_to_first_token_mean_ms"])
    if args.ttft_target_ms and ttft:
        ok = a["ttft_ms"]["p50"] <= args.ttft_target_ms
        print("%s: TTFT p50 %.3f ms <= %.3f ms (client side, HTTP included)" % (
            "PASS" if ok else "FAIL", a["ttft_ms"]["p50"], args.ttft_target_ms))
        a["pass"] = ok
    sys.stdout.flush()
    return a


# ---- mode interference ----


async def interference_worker(args, n_streams, inject_times, t_zero, t_end, wid):
    """n_streams long streams restarted as they end until t_end, plus injected requests sent at the absolute
    monotonic times inject_times. Returns the streams' token events and the injected requests' results."""
    rng = random.Random(args.seed * 104729 + wid)
    url, hdr = endpoint_url(args), headers(args)
    stream_events = []  # per stream request: [(t, n)]
    injected = []
    errs = {}
    async with aiohttp.ClientSession(connector=connector(0)) as session:

        async def stream_loop(k):
            while time.monotonic() < t_end:
                out = rng.randint(args.stream_output_len // 2, args.stream_output_len)
                p = make_payload(args, rng, args.stream_input_len, out)
                p["ignore_eos"] = True
                left = t_end - time.monotonic()
                r = Result(k)
                task = asyncio.ensure_future(stream_request(session, url, p, r, args.request_timeout, hdr))
                done, _ = await asyncio.wait([task], timeout=max(0.01, left))
                if not done:  # the window is over: drop the connection (the server cancels it)
                    task.cancel()
                    try:
                        await task
                    except BaseException:  # noqa: BLE001
                        pass
                if r.error and r.error not in ("client_CancelledError",):
                    errs["stream_" + r.error] = errs.get("stream_" + r.error, 0) + 1
                stream_events.append(list(r.events))
                if r.error and r.error.startswith("http_"):
                    await asyncio.sleep(0.05)

        async def inject(t_at, i):
            await asyncio.sleep(max(0.0, t_at - time.monotonic()))
            p = make_payload(args, rng, args.inject_input_len, args.inject_output_len)
            r = await stream_request(session, url, p, Result(i), args.request_timeout, hdr)
            if r.error:
                errs["inject_" + r.error] = errs.get("inject_" + r.error, 0) + 1
            injected.append(r.as_dict())

        await asyncio.sleep(max(0.0, t_zero - time.monotonic()))
        tasks = [asyncio.create_task(stream_loop(k)) for k in range(n_streams)]
        tasks += [asyncio.create_task(inject(t, i)) for i, t in enumerate(inject_times)]
        await asyncio.gather(*tasks, return_exceptions=True)
    return stream_events, injected, errs


def window_itl(stream_events, a, b):
    """ITL samples of stream tokens that arrived in [a, b)."""
    out = []
    for ev in stream_events:
        for (t0, _), (t1, n) in zip(ev, ev[1:]):
            if a <= t1 < b:
                out.extend([(t1 - t0) / n] * n)
    return out


def window_tokens(stream_events, a, b):
    return sum(n for ev in stream_events for t, n in ev if a <= t < b)


def mode_interference(args):
    nw = max(1, min(args.workers, args.streams))
    rng = random.Random(args.seed + 1)
    t_zero = time.monotonic() + 1.0  # the workers start together
    t_steady = t_zero + args.settle_s
    t_inject = t_steady + args.steady_s
    t_end = t_inject + args.inject_s
    inj = []
    t = t_inject
    while args.inject_rate > 0:
        t += rng.expovariate(args.inject_rate)
        if t >= t_end:
            break
        inj.append(t)
    streams = [len(c) for c in split(list(range(args.streams)), nw)]
    snaps = {}

    def snap_at(name, when):
        time.sleep(max(0.0, when - time.monotonic()))
        snaps[name] = scrape(args.base_url)

    ctx = mp.get_context("fork")
    with ctx.Pool(nw) as pool:
        job = pool.starmap_async(run_worker, [(interference_worker, args, s, ij, t_zero, t_end, w) for w, (s, ij) in
                                              enumerate(zip(streams, split(inj, nw)))])
        snap_at("steady", t_steady)
        snap_at("inject", t_inject)
        snap_at("end", t_end)
        parts = job.get(timeout=args.settle_s + args.steady_s + args.inject_s + args.request_timeout + 60)
    events = [ev for p in parts for ev in p[0]]
    injected = [r for p in parts for r in p[1]]
    errs = {}
    for p in parts:
        for k, v in p[2].items():
            errs[k] = errs.get(k, 0) + v
    st = window_itl(events, t_steady, t_inject)
    ij = window_itl(events, t_inject, t_end)
    a = {
        "streams": args.streams,
        "inject_rate": args.inject_rate,
        "inject_input_len": args.inject_input_len,
        "inject_output_len": args.inject_output_len,
        "injected_sent": len(inj),
        "injected_ok": sum(1 for r in injected if r["error"] is None),
        "steady_itl_ms": summary(st),
        "inject_itl_ms": summary(ij),
        "steady_stream_tok_s": window_tokens(events, t_steady, t_inject) / args.steady_s,
        "inject_stream_tok_s": window_tokens(events, t_inject, t_end) / args.inject_s,
        "inject_ttft_ms": summary([r["t_first"] - r["t_send"] for r in injected if r["t_first"] is not None]),
        "errors": errs,
        "server_steady": server_delta(snaps.get("steady"), snaps.get("inject"), args.steady_s),
        "server_inject": server_delta(snaps.get("inject"), snaps.get("end"), args.inject_s),
    }
    s99, i99 = a["steady_itl_ms"]["p99"], a["inject_itl_ms"]["p99"]
    a["p99_ratio"] = i99 / s99 if s99 and i99 else None
    a["p50_ratio"] = (a["inject_itl_ms"]["p50"] / a["steady_itl_ms"]["p50"]) if st and ij else None
    print("==== %s ====" % (args.label or "interference"))
    print("%d streams (prompt %d, ignore_eos), then %d-token prompts (max_tokens %d) at %.2f/s: %d sent, %d ok" % (
        args.streams, args.stream_input_len, args.inject_input_len, args.inject_output_len, args.inject_rate,
        len(inj), a["injected_ok"]))
    print("streams' ITL steady  %s, %.0f tok/s" % (fmt_ms(a["steady_itl_ms"]), a["steady_stream_tok_s"]))
    print("streams' ITL inject  %s, %.0f tok/s" % (fmt_ms(a["inject_itl_ms"]), a["inject_stream_tok_s"]))
    print("injected TTFT        %s" % fmt_ms(a["inject_ttft_ms"]))
    for k in ("server_steady", "server_inject"):
        if a[k].get("inter_token_latency_mean_ms") is not None:
            print("%s: server-side ITL mean %.3f ms, %.0f tok/s" % (
                k, a[k]["inter_token_latency_mean_ms"], a[k]["tokens_per_s_by_itl"]))
    print("errors %s" % (json.dumps(errs, sort_keys=True) if errs else "{}"))
    if a["p99_ratio"] is not None:
        ok = a["p99_ratio"] <= args.ratio_target
        a["pass"] = ok
        print("%s: streams' p99 ITL during injection / steady = %.3f / %.3f ms = %.2f (<= %.1f)" % (
            "PASS" if ok else "FAIL", i99, s99, a["p99_ratio"], args.ratio_target))
    else:
        print("FAIL: no ITL samples in a window (steady %d, inject %d)" % (len(st), len(ij)))
        a["pass"] = False
    sys.stdout.flush()
    return a


# ---- main ----


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--mode", choices=("serve", "ttft", "interference"), default="serve")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="the model name to send (default: the first of GET /v1/models)")
    ap.add_argument("--api-key")
    ap.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                    help="completions: token-id prompts of exact length; chat: ~N random words (needs a tokenizer)")
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--request-rate", type=float, default=float("inf"), help="Poisson arrivals per s (inf: all at once)")
    ap.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0: no limit)")
    ap.add_argument("--random-input-len", type=int, default=1024)
    ap.add_argument("--random-output-len", type=int, default=128)
    ap.add_argument("--random-range-ratio", type=float, default=0.0)
    ap.add_argument("--input-len", type=int, help="fixed prompt length (overrides --random-input-len)")
    ap.add_argument("--output-len", type=int, help="fixed max_tokens (overrides --random-output-len)")
    ap.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (exact output lengths)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int, help="sent as top_k (vllm bench serve's --top-k)")
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--logprobs", type=int,
                    help="ask for logprobs (completions: the number of alternatives): one SSE event per token even "
                         "when the model has no tokenizer")
    ap.add_argument("--id-range", default="1000:100000", help="random prompt ids lo:hi (ordinary tokens of Qwen3/3.5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=4, help="requests before measuring")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                    help="client processes sharing the load")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--max-duration", type=float, default=0, help="serve, ttft: stop sending (and cut what runs) after this many s")
    ap.add_argument("--ttft-target-ms", type=float, default=0, help="ttft: PASS/FAIL line against p50")
    ap.add_argument("--ttft-gap-ms", type=float, default=5.0, help="ttft: idle time between requests")
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--stream-input-len", type=int, default=32)
    ap.add_argument("--stream-output-len", type=int, default=2048,
                    help="interference: max_tokens of a stream (drawn in [x/2, x]; restarted when it ends)")
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--steady-s", type=float, default=10.0)
    ap.add_argument("--inject-s", type=float, default=10.0)
    ap.add_argument("--inject-rate", type=float, default=4.0, help="injected requests per s (Poisson)")
    ap.add_argument("--inject-input-len", type=int, default=1024)
    ap.add_argument("--inject-output-len", type=int, default=16)
    ap.add_argument("--ratio-target", type=float, default=3.0)
    ap.add_argument("--label", help="title of the printed block")
    ap.add_argument("--json", help="write the numbers to this file")
    args = ap.parse_args(argv)
    lo, _, hi = args.id_range.partition(":")
    args.id_lo, args.id_hi = int(lo), int(hi)
    if not args.model:
        args.model = served_model(args.base_url, args.api_key)
    if args.mode == "ttft":
        a = mode_ttft(args)
    elif args.mode == "interference":
        a = mode_interference(args)
    else:
        a = mode_serve(args)
    a["mode"] = args.mode
    if args.json:
        with open(args.json, "w") as f:
            json.dump(a, f, indent=1, sort_keys=True)
    return 1 if a.get("pass") is False else 0


if __name__ == "__main__":
    sys.exit(main())
