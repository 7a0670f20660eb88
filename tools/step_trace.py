#!/usr/bin/env python3
"""Timeline of the CUDA decode step from the trace build's records (src/cuda/common.cuh "step trace"); also of the
batched step's (make TRACE=1 BUILD=build-trace build-trace/bench/serve_step, then serve_step --trace-csv PATH).

Usage (GPU machine):
    make TRACE=1 BUILD=build-trace build-trace/qwen35            # here, then carry build-trace
    QWEN35_TRACE_CSV=/tmp/t.csv build-trace/qwen35 bench --dummy qwen3.5-0.8b --backend cuda --ctx-list 128 \
        --prefill-list 1
    python3 tools/step_trace.py /tmp/t.csv [--detail]

Each CSV line is one block of one launch: ctx,replay,id,block,t0,t1,t2 with the global timer (ns) at the
block's entry (t0), after its pdl_wait (t1) and at its end (t2); id = 10 + GEMV out mode (10 store: the
in-projections, 11 SwiGLU: gate_up, 12 split-K: out_proj / o_proj / down, 13 argmax: the LM head), 14 the LM head's int8 screen (greedy; its t1: the block's screen done, not its wait release),
20 DeltaNet step, 30 attention, 35 attention + o_proj (short contexts), 36 qkv + attention + o_proj (attn_qs), 40 fused MLP, 50 the fused DeltaNet mixer (deltanet_layer.cu). Every block of launch N+1 waits for launch N to finish, so
sorted by t2 the records fall into launches in step order (a new launch where the id changes or a block
number repeats: consecutive launches of one kind, e.g. dn_layer with its MLP tail).

Per launch, relative to the end of the previous launch (its last block's t2), in us:
    lead     first block's entry (negative: it was resident before the previous launch ended, PDL)
    release  first block's wait release (the PDL hand-over latency)
    spread   last release - first release
    span     this launch's last block end: its share of the step's critical path
The table gives, per kind, the median over replays of the mean over the step's launches of that kind,
and the sum of spans (= the step, first launch excluded) next to the replay's wall time. Then, for the LM head's
screen (id 14), its blocks from the launch's first entry, median over replays of each block statistic (us):
    done     a block's stream finished (its t1): min / median / max over blocks
    tail     done to the block's end: min / median / max
    end      the last block's end; which block it was, and when that block's stream finished
"""
import argparse
import collections
import statistics
import sys

KIND = {10: "in", 11: "gate_up", 12: "out/down", 13: "lm_head", 14: "lm_screen", 20: "deltanet", 30: "attention", 35: "attn_o", 36: "attn_qs",
        40: "mlp", 50: "dnlayer", 60: "attnlayer",
        # the batched step (bench/serve_step --trace-csv; B in the ctx column): the skinny GEMM by epilogue (70 split
        # partials: out_proj / o_proj / down, named by whether gate_up came before), its reductions, the DeltaNet prep
        # and state pass, paged attention
        70: "sk_out/down", 71: "sk_in/qkv", 72: "sk_f32", 73: "sk_add", 74: "sk_gate_up", 78: "reduce_norm",
        79: "reduce", 86: "lmr_prep", 87: "lmr_screen", 88: "lmr_pick", 90: "dn_prep", 91: "dn_state", 92: "paged_prep", 93: "pa_split", 94: "pa_merge", 95: "gather",
        96: "argmax_part", 97: "argmax_final"}


def launches(recs):
    """recs: [(id, block, t0, t1, t2)] of one replay -> list of launches (id, [recs])."""
    out, seen = [], set()
    for r in sorted(recs, key=lambda r: r[4]):
        if not out or out[-1][0] != r[0] or r[1] in seen:  # a block seen again: the next launch of that kind
            out.append((r[0], []))
            seen = set()
        out[-1][1].append(r)
        seen.add(r[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--detail", action="store_true", help="one line per launch of the first replay")
    a = ap.parse_args()
    runs = collections.defaultdict(list)
    with open(a.csv) as f:
        for line in f:
            p = line.strip().split(",")
            if len(p) != 7:
                continue
            ctx, rep, kid, blk = (int(x) for x in p[:4])
            runs[(ctx, rep)].append((kid, blk, int(p[4]), int(p[5]), int(p[6])))
    if not runs:
        sys.exit("step_trace: no records in " + a.csv)
    for ctx in sorted({k[0] for k in runs}):
        per_kind = collections.defaultdict(lambda: collections.defaultdict(list))  # kind -> metric -> [per replay]
        totals, walls, counts = [], [], None
        for (c, rep), recs in sorted(runs.items()):
            if c != ctx:
                continue
            ls = launches(recs)
            acc = collections.defaultdict(lambda: collections.defaultdict(list))
            total = 0.0
            prev_end = None
            seen_gu = False
            detail = []
            for i, (kid, rs) in enumerate(ls):
                t0 = min(r[2] for r in rs)
                t1a, t1b = min(r[3] for r in rs), max(r[3] for r in rs)
                t2 = max(r[4] for r in rs)
                kind = KIND.get(kid, str(kid))
                if kid in (11, 74):
                    seen_gu = True
                if kid in (12, 70):
                    kind = ("down" if seen_gu else "out") + ("_sk" if kid == 70 else "")
                    seen_gu = False
                if prev_end is not None:
                    m = {"lead": (t0 - prev_end) / 1e3, "release": (t1a - prev_end) / 1e3,
                         "spread": (t1b - t1a) / 1e3, "span": (t2 - prev_end) / 1e3, "blocks": len(rs)}
                    for k, v in m.items():
                        acc[kind][k].append(v)
                    total += m["span"]
                    detail.append((i, kind, m))
                prev_end = t2
            walls.append((max(r[4] for r in recs) - min(r[2] for r in recs)) / 1e3)
            totals.append(total)
            counts = {k: len(v["span"]) for k, v in acc.items()}
            for kind, ms in acc.items():
                for k, v in ms.items():
                    per_kind[kind][k].append(statistics.mean(v))
            if a.detail and rep == min(r for (cc, r) in runs if cc == ctx):
                print(f"ctx {ctx}, replay {rep}: launch kind blocks lead release spread span (us)")
                for i, kind, m in detail:
                    print(f"  {i:3d} {kind:9s} {m['blocks']:4d} {m['lead']:8.2f} {m['release']:7.2f} "
                          f"{m['spread']:6.2f} {m['span']:7.2f}")
        print(f"\nctx {ctx}: {len(totals)} replays; sum of spans {statistics.median(totals):.1f} us "
              f"(first launch excluded), replay wall {statistics.median(walls):.1f} us")
        print("| kind | launches | blocks | lead us | release us | spread us | span us | span x launches |")
        print("|---|---|---|---|---|---|---|---|")
        for kind in sorted(per_kind, key=lambda k: -statistics.median(per_kind[k]["span"]) * counts.get(k, 1)):
            med = {k: statistics.median(v) for k, v in per_kind[kind].items()}
            n = counts.get(kind, 0)
            print(f"| {kind} | {n} | {med['blocks']:.0f} | {med['lead']:.2f} | {med['release']:.2f} | "
                  f"{med['spread']:.2f} | {med['span']:.2f} | {med['span'] * n:.1f} |")
        screen_blocks(runs, ctx)


def screen_blocks(runs, ctx):
    """The screen launch's per-block stream end (t1) and tail (t1 -> t2), from its first block's entry."""
    stats = collections.defaultdict(list)
    for (c, rep), recs in sorted(runs.items()):
        rs = [r for r in recs if r[0] == 14] if c == ctx else []
        if not rs:
            continue
        t0 = min(r[2] for r in rs)
        done = sorted((r[3] - t0) / 1e3 for r in rs)
        tail = sorted((r[4] - r[3]) / 1e3 for r in rs)
        last = max(rs, key=lambda r: r[4])
        for k, v in (("done min", done[0]), ("done median", statistics.median(done)), ("done max", done[-1]),
                     ("tail min", tail[0]), ("tail median", statistics.median(tail)), ("tail max", tail[-1]),
                     ("end", (last[4] - t0) / 1e3), ("last block's done", (last[3] - t0) / 1e3)):
            stats[k].append(v)
    if stats:
        print(f"\nLM head screen, ctx {ctx}: its blocks from the launch's first entry, median over {len(stats['end'])} "
              "replays (us)")
        print("| " + " | ".join(stats) + " |")
        print("|" + "---|" * len(stats))
        print("| " + " | ".join(f"{statistics.median(v):.1f}" for v in stats.values()) + " |")


if __name__ == "__main__":
    main()
