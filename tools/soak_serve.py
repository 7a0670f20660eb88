#!/usr/bin/env python3
"""soak_serve.py — the soak test of issue 28 for `qwen35 serve`: --clients concurrent streaming clients for
--duration seconds, random prompt lengths (token ids, --prompt-len 16:4096) and output lengths (--output-len
1:1024), a share of clients (--disconnect 0.05) closing mid-stream, malformed requests interleaved (bad JSON, bad
fields, unknown model, unknown route, wrong method, bad token ids, context too long, oversized bodies), and
/metrics, the server's RSS (--pid) and GPU memory (nvidia-smi, when present) sampled every --sample-s seconds.
Needs python3 with aiohttp; offline.

What each client checks on every stream (a problem is a FAIL):
  - every SSE line is `data: <JSON>` or `data: [DONE]`, and [DONE] ends it;
  - one id across its chunks, unique among all requests; `model` is the served name;
  - exactly one chunk with finish_reason, nothing after it but the usage chunk;
  - usage.prompt_tokens == the prompt it sent (lengths are random in 16..4096, so a stream fed from another
    request shows up), completion_tokens == the tokens it received (one logprobs entry per token with
    --logprobs 0), and with ignore_eos (default) completion_tokens == its max_tokens and finish_reason "length".
  With --replay N (use it with a --deterministic server): N finished requests, sent again one at a time at the
  end, must give the same per-token logprobs and text: with batch-invariant kernels a request's output does not
  depend on what ran next to it, so any difference is output mixed between requests or state leaked between
  sequences.
Clean errors (an OpenAI error object with its status, or an error event then [DONE]) are counted by kind; a
broken stream (no [DONE], bad chunk, reset, timeout) is a FAIL.

At the end: the clients finish what they run (at most --drain-s), then /health must be 200 and /metrics must show
no running or waiting request and an empty KV pool; RSS and GPU memory after warm-up (--warmup-s) vs last must be
flat (--rss-slack-mb, --gpu-slack-mb).
"""
import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve as bs  # noqa: E402
from bench_serve import aiohttp  # noqa: E402

CLEAN = ("http_400", "http_404", "http_413", "http_429", "http_503", "stream_error")


def check_stream(args, r, payload, problems):
    """Appends what is wrong with finished stream r (a Result) to problems."""
    tag = "req prompt=%d max_tokens=%d" % (len(payload["prompt"]), payload["max_tokens"])
    if len(r.ids) != 1:
        problems.append("%s: %d distinct ids %s" % (tag, len(r.ids), sorted(r.ids)[:3]))
    if r.models != {args.model}:
        problems.append("%s: model %s" % (tag, sorted(r.models)))
    if r.finish_reason is None:
        problems.append("%s: no finish_reason" % tag)
    if r.prompt_tokens != len(payload["prompt"]):
        problems.append("%s: usage.prompt_tokens %s" % (tag, r.prompt_tokens))
    seen = r.tokens_seen()
    if args.logprobs is not None and r.completion_tokens != seen:
        problems.append("%s: usage.completion_tokens %s, tokens received %d" % (tag, r.completion_tokens, seen))
    if args.ignore_eos:
        if r.completion_tokens != payload["max_tokens"] or r.finish_reason != "length":
            problems.append("%s: ignore_eos but completion_tokens %s finish %s" % (
                tag, r.completion_tokens, r.finish_reason))
    elif r.completion_tokens is None or r.completion_tokens > payload["max_tokens"] or (
            r.finish_reason == "length" and r.completion_tokens != payload["max_tokens"]):
        problems.append("%s: completion_tokens %s finish %s" % (tag, r.completion_tokens, r.finish_reason))


async def client_worker(args, n_clients, t_end, t_drain, wid):
    """n_clients clients in one process; returns counters, problems, ids, replay samples."""
    rng = random.Random(args.seed * 1000003 + wid)
    url, hdr = bs.endpoint_url(args), bs.headers(args)
    st = {"requests": 0, "ok": 0, "disconnects": 0, "prompt_tokens": 0, "completion_tokens": 0,
          "cut_at_end": 0, "n_problems": 0, "errors": {}, "problems": [], "ids": [], "samples": []}
    lo_p, hi_p = args.plen
    lo_o, hi_o = args.olen

    async with aiohttp.ClientSession(connector=bs.connector(0)) as session:

        async def client(k):
            while time.monotonic() < t_end:
                pl = rng.randint(lo_p, min(hi_p, args.max_len - 1))
                ol = rng.randint(lo_o, max(lo_o, min(hi_o, args.max_len - pl)))
                seed = rng.randrange(1 << 31)
                p = bs.make_payload(args, rng, pl, ol, seed)
                if args.ignore_eos:
                    p["ignore_eos"] = True
                drop = rng.random() < args.disconnect
                after = rng.randint(1, max(1, ol - 1)) if drop else None
                r = bs.Result(k)
                problems = []
                task = asyncio.ensure_future(bs.stream_request(session, url, p, r, args.request_timeout, hdr,
                                                               disconnect_after=after, strict=problems))
                done, _ = await asyncio.wait([task], timeout=max(0.01, t_drain - time.monotonic()))
                st["requests"] += 1
                if not done:
                    task.cancel()
                    try:
                        await task
                    except BaseException:  # noqa: BLE001
                        pass
                    st["cut_at_end"] += 1
                    return
                if r.error == "client_disconnect":
                    st["disconnects"] += 1
                elif r.error is not None:
                    st["errors"][r.error] = st["errors"].get(r.error, 0) + 1
                    if r.error not in CLEAN:
                        problems.append("broken stream: %s (prompt %d, max_tokens %d)" % (r.error, pl, ol))
                else:
                    st["ok"] += 1
                    st["prompt_tokens"] += r.prompt_tokens or 0
                    st["completion_tokens"] += r.completion_tokens or 0
                    check_stream(args, r, p, problems)
                    if args.replay:  # a uniform sample of this process's finished requests (reservoir)
                        smp = {"payload": p, "text": "".join(r.text), "lps": r.lps}
                        if len(st["samples"]) < args.replay:
                            st["samples"].append(smp)
                        else:
                            j = rng.randrange(st["ok"])
                            if j < args.replay:
                                st["samples"][j] = smp
                st["ids"].extend(sorted(r.ids))
                for x in problems:
                    if len(st["problems"]) < 50:
                        st["problems"].append(x)
                st["n_problems"] += len(problems)

        await asyncio.gather(*[client(k) for k in range(n_clients)], return_exceptions=False)
    return st


# ---- malformed requests ----

def malformed_cases(args):
    """(kind, method, path, body bytes, expected status)."""
    ok_prompt = [1000 + i for i in range(8)]

    def js(o):
        return json.dumps(o).encode()

    big = args.max_body_kb * 1024 + 4096
    return [
        ("bad_json", "POST", "/v1/completions", b'{"model": "x", "prompt": [1, 2', 400),
        ("not_object", "POST", "/v1/completions", b'[1, 2, 3]', 400),
        ("bad_field", "POST", "/v1/completions", js({"model": args.model, "prompt": ok_prompt, "temperature": 5}), 400),
        ("bad_max_tokens", "POST", "/v1/completions", js({"model": args.model, "prompt": ok_prompt, "max_tokens": 0}),
         400),
        ("bad_ids", "POST", "/v1/completions", js({"model": args.model, "prompt": [1, -3, 2]}), 400),
        ("unknown_model", "POST", "/v1/completions", js({"model": "no-such-model", "prompt": ok_prompt}), 404),
        ("context_exceeded", "POST", "/v1/completions",
         js({"model": args.model, "prompt": ok_prompt, "max_tokens": args.max_len + 1}), 400),
        ("chat_bad_messages", "POST", "/v1/chat/completions", js({"model": args.model, "messages": []}), 400),
        ("unknown_route", "POST", "/v1/nothing", js({}), 404),
        ("wrong_method", "GET", "/v1/completions", None, 405),
        ("oversized", "POST", "/v1/completions", b'{"prompt": "' + b"a" * big + b'"}', 413),
    ]


def quiet_handler(loop, ctx):
    """An oversized body the server refused (413, then close) leaves aiohttp's writer with a broken pipe."""
    if isinstance(ctx.get("exception"), (aiohttp.ClientOSError, ConnectionResetError, BrokenPipeError)):
        return
    loop.default_exception_handler(ctx)


async def malformed_loop(args, t_end, out):
    asyncio.get_running_loop().set_exception_handler(quiet_handler)
    cases = malformed_cases(args)
    url = args.base_url.rstrip("/")
    hdr = {"Content-Type": "application/json"}
    if args.api_key:
        hdr["Authorization"] = "Bearer " + args.api_key
    i = 0
    rng = random.Random(args.seed + 77)
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < t_end:
            kind, method, path, body, want = cases[i % len(cases)]
            i += 1
            try:
                async with session.request(method, url + path, data=body, headers=hdr,
                                           timeout=aiohttp.ClientTimeout(total=30)) as r:
                    text = await r.read()
                    got = r.status
                    shape_ok = True
                    try:
                        e = json.loads(text)["error"]
                        shape_ok = isinstance(e.get("message"), str) and "type" in e
                    except Exception:  # noqa: BLE001
                        shape_ok = False
            except Exception as e:  # noqa: BLE001 — a 413 may come as a reset while we still send the body
                got = type(e).__name__
                shape_ok = kind == "oversized" and isinstance(e, (aiohttp.ClientOSError,
                                                                  aiohttp.ServerDisconnectedError))
            k = out.setdefault(kind, {"sent": 0, "expected": 0, "got": {}})
            k["sent"] += 1
            k["got"][str(got)] = k["got"].get(str(got), 0) + 1
            if (got == want or isinstance(got, str)) and shape_ok:
                k["expected"] += 1
            await asyncio.sleep(rng.expovariate(args.malformed_rate))


# ---- sampling ----

def rss_mb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def gpu_mb(pid):
    """The server's GPU memory (MiB) from nvidia-smi, None without nvidia-smi or a line for pid."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except Exception:  # noqa: BLE001
        return None
    total = None
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and (pid is None or int(parts[0]) == pid):
            try:
                total = (total or 0) + float(parts[1])
            except ValueError:
                pass
    return total


def sample(args, t0):
    m = bs.scrape(args.base_url)
    return {
        "t": time.monotonic() - t0,
        "running": bs.metric(m, "vllm:num_requests_running") if m else None,
        "waiting": bs.metric(m, "vllm:num_requests_waiting") if m else None,
        "kv": bs.metric(m, "vllm:kv_cache_usage_perc") if m else None,
        "gen_tokens": bs.metric(m, "vllm:generation_tokens_total") if m else None,
        "rss_mb": rss_mb(args.pid) if args.pid else None,
        "gpu_mb": gpu_mb(args.pid),
    }


def sampler(args, t0, stop, samples):
    while not stop.wait(0 if not samples else args.sample_s):
        s = sample(args, t0)
        samples.append(s)
        if args.verbose:
            print("  t=%4.0fs running %s waiting %s kv %.3f rss %s gpu %s" % (
                s["t"], fmt_n(s["running"]), fmt_n(s["waiting"]), s["kv"] or 0, fmt_mb(s["rss_mb"]), fmt_mb(s["gpu_mb"])),
                flush=True)


def fmt_n(x):
    return "-" if x is None else "%d" % x


def fmt_mb(x):
    return "-" if x is None else "%.0f MiB" % x


# ---- replay ----

async def replay(args, samples):
    """Sends each sample again, alone; returns (compared, mismatches)."""
    url, hdr = bs.endpoint_url(args), bs.headers(args)
    bad = []
    async with aiohttp.ClientSession() as session:
        for s in samples:
            r = bs.Result()
            await bs.stream_request(session, url, s["payload"], r, args.request_timeout, hdr, strict=[])
            if r.error or "".join(r.text) != s["text"] or r.lps != s["lps"]:
                bad.append("prompt %d max_tokens %d: replay %s" % (
                    len(s["payload"]["prompt"]), s["payload"]["max_tokens"], r.error or "differs"))
    return len(samples), bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model")
    ap.add_argument("--api-key")
    ap.add_argument("--pid", type=int, help="the server's pid: RSS and GPU memory samples")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=480.0, help="seconds of load")
    ap.add_argument("--warmup-s", type=float, default=60.0, help="memory after this is the baseline")
    ap.add_argument("--drain-s", type=float, default=120.0, help="after --duration, wait this long for streams")
    ap.add_argument("--prompt-len", default="16:4096")
    ap.add_argument("--output-len", default="1:1024")
    ap.add_argument("--disconnect", type=float, default=0.05, help="share of requests the client drops mid-stream")
    ap.add_argument("--malformed-rate", type=float, default=2.0, help="malformed requests per s")
    ap.add_argument("--max-body-kb", type=int, default=4096, help="the server's --max-body-kb (oversized case)")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false")
    ap.add_argument("--logprobs", type=int, default=0,
                    help="completions logprobs (default 0: one event per token; -1: none)")
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int, help="sent as top_k")
    ap.add_argument("--top-p", type=float, help="sent as top_p")
    ap.add_argument("--id-range", default="1000:100000")
    ap.add_argument("--replay", type=int, default=0, help="replay this many requests at the end (--deterministic)")
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--rss-slack-mb", type=float, default=64.0)
    ap.add_argument("--gpu-slack-mb", type=float, default=16.0)
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--request-timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--verbose", action="store_true", help="print every sample")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.endpoint = "completions"
    if args.logprobs < 0:
        args.logprobs = None
    lo, _, hi = args.id_range.partition(":")
    args.id_lo, args.id_hi = int(lo), int(hi)
    args.plen = tuple(int(x) for x in args.prompt_len.split(":"))
    args.olen = tuple(int(x) for x in args.output_len.split(":"))
    st, body = bs.http_get(args.base_url, "/v1/models", args.api_key)
    if st != 200:
        print("FAIL: GET /v1/models: %s %s" % (st, body[:200]))
        return 1
    mdl = json.loads(body)["data"][0]
    args.model = args.model or mdl["id"]
    args.max_len = int(mdl.get("max_model_len") or 4096)

    t0 = time.monotonic()
    t_end = t0 + args.duration
    t_drain = t_end + args.drain_s
    samples, stop = [], threading.Event()
    th = threading.Thread(target=sampler, args=(args, t0, stop, samples), daemon=True)
    nw = max(1, min(args.workers, args.clients))
    per = [len(c) for c in bs.split(list(range(args.clients)), nw)]
    malformed = {}
    ctx = mp.get_context("fork")
    with ctx.Pool(nw) as pool:  # forked before the sampler thread starts
        th.start()
        job = pool.starmap_async(bs.run_worker, [(client_worker, args, n, t_end, t_drain, w) for w, n in enumerate(per)])
        asyncio.run(malformed_loop(args, t_end, malformed))
        try:
            parts = job.get(timeout=max(1.0, t_drain - time.monotonic()) + 60)
        except mp.TimeoutError:
            stop.set()
            print("FAIL: the clients did not finish within --drain-s + 60 s\nSOAK FAIL")
            return 1
    t_load = time.monotonic() - t0
    # the server must be idle now: every sequence (disconnected ones too) closed, every KV block back
    idle = None
    for _ in range(50):
        idle = sample(args, t0)
        if idle["running"] == 0 and idle["waiting"] == 0 and idle["kv"] == 0:
            break
        time.sleep(0.2)
    stop.set()
    th.join(timeout=30)
    samples.append(idle)
    hst, hbody = bs.http_get(args.base_url, "/health", timeout=10)

    tot = {"requests": 0, "ok": 0, "disconnects": 0, "prompt_tokens": 0, "completion_tokens": 0, "cut_at_end": 0,
           "n_problems": 0}
    errors, problems, ids, reps = {}, [], [], []
    for p in parts:
        for k in tot:
            tot[k] += p.get(k, 0)
        for k, v in p["errors"].items():
            errors[k] = errors.get(k, 0) + v
        problems += p["problems"]
        ids += p["ids"]
        reps += p["samples"]
    dup = len(ids) - len(set(ids))
    rep_n, rep_bad = (0, [])
    if args.replay and reps:
        rep_n, rep_bad = asyncio.run(replay(args, reps[:args.replay]))

    def pick(key):
        xs = [(s["t"], s[key]) for s in samples if s and s.get(key) is not None]
        if not xs:
            return None, None, None
        warm = [v for t, v in xs if t >= args.warmup_s]
        return xs[0][1], (warm[0] if warm else None), xs[-1][1]

    rss, gpu = pick("rss_mb"), pick("gpu_mb")
    mal_sent = sum(v["sent"] for v in malformed.values())
    mal_bad = {k: v["got"] for k, v in malformed.items() if v["expected"] != v["sent"]}
    print("==== soak: %d clients, %.0f s of load (%.0f s with drain) ====" % (args.clients, args.duration, t_load))
    print("requests %d: ok %d, client disconnects %d, clean errors %s, cut at the end %d" % (
        tot["requests"], tot["ok"], tot["disconnects"], json.dumps(errors, sort_keys=True) if errors else "{}",
        tot["cut_at_end"]))
    print("tokens: prompt %d, completion %d (%.0f tok/s)" % (
        tot["prompt_tokens"], tot["completion_tokens"], tot["completion_tokens"] / max(1e-9, args.duration)))
    print("malformed requests %d: %s" % (mal_sent, " ".join(
        "%s=%d/%d" % (k, v["expected"], v["sent"]) for k, v in sorted(malformed.items()))))
    print("RSS  first %s, after warm-up %s, last %s" % tuple(fmt_mb(x) for x in rss))
    print("GPU  first %s, after warm-up %s, last %s" % tuple(fmt_mb(x) for x in gpu))
    print("after the load: running %s waiting %s kv %s; /health %s" % (
        fmt_n(idle["running"]), fmt_n(idle["waiting"]), idle["kv"], hst))
    for x in problems[:10]:
        print("  problem: %s" % x)
    checks = []

    def check(ok, what):
        checks.append((ok, what))
        print("%s: %s" % ("PASS" if ok else "FAIL", what))

    check(tot["ok"] > 0, "requests served (%d)" % tot["ok"])
    check(tot["n_problems"] == 0, "every stream well-formed and consistent with its request (%d problems)" %
          tot["n_problems"])
    check(dup == 0, "request ids unique (%d duplicates among %d)" % (dup, len(ids)))
    check(not mal_bad, "malformed requests answered with the expected status and an error object%s" % (
        "" if not mal_bad else " (" + json.dumps(mal_bad, sort_keys=True) + ")"))
    check(idle["running"] == 0 and idle["waiting"] == 0 and idle["kv"] == 0,
          "no request running or waiting and KV pool empty after the load")
    check(hst == 200, "/health answers 200 at the end")
    if rss[1] is not None and rss[2] is not None:
        check(rss[2] - rss[1] <= args.rss_slack_mb, "RSS flat after warm-up (%+.0f MiB, slack %.0f)" % (
            rss[2] - rss[1], args.rss_slack_mb))
    else:
        print("SKIP: RSS (no --pid or no sample after --warmup-s)")
    if gpu[1] is not None and gpu[2] is not None:
        check(gpu[2] - gpu[1] <= args.gpu_slack_mb, "GPU memory flat after warm-up (%+.0f MiB, slack %.0f)" % (
            gpu[2] - gpu[1], args.gpu_slack_mb))
    else:
        print("SKIP: GPU memory (no nvidia-smi line for the pid)")
    if args.replay:
        check(rep_n > 0 and not rep_bad, "replayed alone, %d requests give the same output (%d differ%s)" % (
            rep_n, len(rep_bad), (": " + rep_bad[0]) if rep_bad else ""))
    ok = all(c for c, _ in checks)
    print("SOAK %s" % ("PASS" if ok else "FAIL"))
    sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"totals": tot, "errors": errors, "problems": problems, "malformed": malformed,
                       "samples": samples, "rss_mb": rss, "gpu_mb": gpu, "health": hst, "replay": [rep_n, rep_bad],
                       "checks": checks, "pass": ok}, f, indent=1, sort_keys=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
