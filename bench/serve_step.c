/* serve_step.c — in-process batched decode throughput through the public serve API (q35_serve_open / q35_step), the
 * issue 28 benchmark: for each batch size B, B sequences are prefilled to ctx tokens (pseudo-random ids, chunks under
 * a 2048-token step budget), then `steps` greedy decode steps of all B run and are timed one by one (wall clock
 * around q35_step, which includes the host sampling and the logits readback). Prints per B the median step time,
 * tokens/s and the state + KV bytes a step must move (weights come on top: ~1.5 GB for qwen3.5-0.8b).
 * Usage: serve_step [--dummy qwen3.5-0.8b] [--backend cuda] [--ctx 1024] [--steps 20] [--deterministic]
 * [--weights auto|fp8] [--prompt N] [--kv-memory GB] [--kv-block N] [--temperature T] [--top-p P] [--top-k K]
 * [--presence-penalty X] [--logprobs K] [--state-dtype float32|bfloat16] [--kv-cache-dtype bfloat16|fp8]
 * [--ablate sv.KIND,...] [--engines N] [B ...]
 * (--deterministic: the engine's deterministic mode, for what batch invariance costs; --temperature, --top-p,
 * --top-k, --presence-penalty, --logprobs K: every sequence samples / asks for logprobs; a penalty or top logprobs
 * send the rows to the host sampler, as in the server)
 * (default B: 1 8 32 64 128 256). --prompt N instead times a lone N-token prompt on the idle engine: open a
 * sequence, one q35_step of the N ids with a greedy pick (the server's first step of a request, no HTTP), close;
 * `steps` rounds after 3 warm-up ones, the median. --kv-memory GB sizes the KV blocks and slots (default: 0.9 of the
 * free device memory; a profiler that saves and restores device memory between replays wants it small); --kv-block N
 * the tokens per KV block (the server's --kv-block, default 16), for what the paged layout costs attention;
 * --state-dtype the served DeltaNet states' type, --kv-cache-dtype the KV cache's (the server's flags).
 * --ablate leaves those launch kinds out of the batched pass (Q35ServeOptions.ablate: sv.in_proj sv.qkv sv.paged_prep
 * sv.attn sv.dn_prep sv.dn_state sv.out_proj sv.o_proj sv.gate_up sv.down): the step's time with and without a kind
 * is what it costs the chain; the outputs are garbage then. B = 1 takes the single-sequence step, which it leaves be.
 * --engines N (measurement): N engines in one process, each with its own weights, B / N of the sequences and a host
 * thread of its own, stepping side by side on the one GPU (what two batches overlapping each other would give);
 * prints engine 0's median step and the tokens/s of all of them over the timed steps' wall time.
 * --trace-csv PATH (the trace build only: make TRACE=1 BUILD=build-trace build-trace/bench/serve_step): after each
 * B's timed steps, 10 more whose kernels' block records (src/cuda/common.cuh "step trace": the skinny GEMMs and their
 * reductions, the DeltaNet prep and state pass, paged prep and attention, the LM head rows' gather and greedy picks;
 * the other kernels (embedding, norms, sampling) are not traced) are appended to
 * PATH as B,step,id,block,t0,t1,t2; tools/step_trace.py reads them (B in its ctx column). B = 1 is not traced.
 * A benchmark, not a test: nothing is asserted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pthread.h>

#include "qwen35.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static size_t g_kv_bytes; /* --kv-memory GB (0: the engine's default share of free memory) */
static int g_kv_block;    /* --kv-block N (0: the engine's default) */
static int g_state_bf16;  /* --state-dtype bfloat16 (the server's flag) */
static int g_kv_fp8;      /* --kv-cache-dtype fp8 (the server's flag) */
static const char *g_ablate; /* --ablate KINDS (measurement: Q35ServeOptions.ablate) */
static const char *g_trace_csv; /* --trace-csv PATH (the trace build) */
#define TRACE_STEPS 10

/* A lone prompt of n ids: the median wall time of open + one step (prefill and pick) + close over `steps` rounds. */
static int run_prompt(Q35Engine *e, int n, int steps) {
    Q35Err err = {0};
    Q35ServeOptions so;
    memset(&so, 0, sizeof so);
    so.max_seqs = 64;
    so.no_prefix_cache = 1;
    so.kv_bytes = g_kv_bytes;
    so.kv_block = g_kv_block;
    so.state_bf16 = g_state_bf16;
    so.kv_fp8 = g_kv_fp8;
    so.ablate = g_ablate;
    int rc = q35_serve_open(e, &so, &err);
    if (rc) {
        fprintf(stderr, "prompt %d: serve open: %s\n", n, err.msg);
        return rc;
    }
    const int V = q35_vocab_size(e), nv = V < 50000 ? V : 50000, rounds = steps > 0 ? steps : 1;
    int *ids = malloc(sizeof(int) * (size_t)n);
    double *t = malloc(sizeof(double) * (size_t)rounds), *ts = malloc(sizeof(double) * (size_t)rounds);
    Q35SeqParams sp;
    memset(&sp, 0, sizeof sp);
    sp.sampling.top_p = 1.0f;
    sp.sampling.repetition_penalty = 1.0f;
    sp.sampling.seed = 1;
    sp.top_logprobs = -1;
    for (int r = -3; r < rounds && !rc; r++) {
        for (int i = 0; i < n; i++) ids[i] = (int)((1103515245u * (unsigned)(i + 7 * (r + 3)) + 12345u) % (unsigned)nv);
        int seq = -1;
        Q35StepOut out;
        const double t0 = now_s();
        rc = q35_seq_open(e, &sp, &seq, &err);
        Q35StepItem it = {.seq = seq, .ids = ids, .n = n, .sample = 1};
        const double ta = now_s();
        if (!rc) rc = q35_step(e, &it, 1, &out, &err);
        const double t1 = now_s();
        if (seq >= 0) q35_seq_close(e, seq);
        if (r >= 0) t[r] = t1 - t0, ts[r] = t1 - ta;
    }
    if (rc) {
        fprintf(stderr, "prompt %d: %s\n", n, err.msg);
    } else {
        qsort(t, (size_t)rounds, sizeof t[0], cmp_double);
        qsort(ts, (size_t)rounds, sizeof ts[0], cmp_double);
        printf("prompt %5d  open + step %8.3f ms (min %.3f, max %.3f)  step %.3f ms\n", n, 1e3 * t[rounds / 2],
               1e3 * t[0], 1e3 * t[rounds - 1], 1e3 * ts[rounds / 2]);
    }
    q35_serve_close(e);
    free(ids), free(t), free(ts);
    return rc;
}

/* One batch size: returns 0 or an error code (message printed). */
/* What every sequence asks for: greedy by default; --temperature / --top-p / --logprobs for the host paths. */
static float g_temp = 0.0f, g_top_p = 1.0f, g_presence = 0.0f;
static int g_top_k;
static int g_logprobs = -1;

/* One engine's B sequences, prefilled to ctx tokens and ready for decode steps. */
typedef struct Run {
    Q35Engine *e;
    int B, ctx, steps, rc;
    int from, to; /* run_steps' steps: from .. to - 1 (< 0: warm-up, untimed) */
    int *seq, *ids, *next;
    Q35StepItem *it;
    Q35StepOut *out;
    double *t; /* [steps] step wall times */
    Q35ServeInfo info;
} Run;

/* Opens the serve state of r->e for r->B sequences and prefills them; returns 0 or an error code (message printed). */
static int run_open(Run *r) {
    Q35Engine *e = r->e;
    const int B = r->B, ctx = r->ctx, steps = r->steps;
    Q35Err err = {0};
    Q35ServeOptions so;
    memset(&so, 0, sizeof so);
    so.max_seqs = B;
    so.no_prefix_cache = 1;
    so.kv_bytes = g_kv_bytes;
    so.kv_block = g_kv_block;
    so.state_bf16 = g_state_bf16;
    so.kv_fp8 = g_kv_fp8;
    so.ablate = g_ablate;
    int rc = q35_serve_open(e, &so, &err);
    if (rc) {
        fprintf(stderr, "B %d: serve open: %s\n", B, err.msg);
        return rc;
    }
    q35_serve_info(e, &r->info);
    if (r->info.max_seqs < B) {
        fprintf(stderr, "B %d: only %d sequences fit\n", B, r->info.max_seqs);
        q35_serve_close(e);
        return 1;
    }
    const int V = q35_vocab_size(e), nv = V < 50000 ? V : 50000;
    r->seq = malloc(sizeof(int) * (size_t)B), r->ids = malloc(sizeof(int) * (size_t)ctx),
    r->next = malloc(sizeof(int) * (size_t)B);
    r->it = malloc(sizeof(Q35StepItem) * (size_t)B);
    r->out = malloc(sizeof(Q35StepOut) * (size_t)B);
    r->t = malloc(sizeof(double) * (size_t)(steps > 0 ? steps : 1));
    int *seq = r->seq, *ids = r->ids, *next = r->next;
    Q35StepItem *it = r->it;
    Q35StepOut *out = r->out;
    Q35SeqParams sp;
    memset(&sp, 0, sizeof sp);
    sp.sampling.temperature = g_temp;
    sp.sampling.top_p = g_top_p;
    sp.sampling.top_k = g_top_k;
    sp.sampling.presence_penalty = g_presence;
    sp.sampling.repetition_penalty = 1.0f;
    sp.sampling.seed = 1;
    sp.top_logprobs = g_logprobs;
    for (int i = 0; i < ctx; i++) ids[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)nv);
    for (int b = 0; b < B; b++) seq[b] = -1;
    for (int b = 0; b < B && !rc; b++) rc = q35_seq_open(e, &sp, &seq[b], &err);
    /* prefill: chunks of up to 2048 tokens per step in total */
    const int budget = 2048;
    for (int b0 = 0; b0 < B && !rc;) {
        int n = 0, rows = 0;
        while (b0 < B && !rc) {
            const int len = q35_seq_length(e, seq[b0]), m = ctx - len < budget - rows ? ctx - len : budget - rows;
            if (m <= 0) break;
            it[n] = (Q35StepItem){.seq = seq[b0], .ids = ids + len, .n = m, .sample = len + m == ctx};
            rows += m;
            n++;
            if (len + m == ctx) b0++;
        }
        if (n) rc = q35_step(e, it, n, out, &err);
        for (int i = 0; i < n && !rc; i++)
            if (it[i].sample)
                for (int b = 0; b < B; b++)
                    if (seq[b] == it[i].seq) next[b] = out[i].id;
    }
    if (rc) fprintf(stderr, "B %d: prefill: %s\n", B, err.msg);
    return r->rc = rc;
}

/* Decode steps r->from .. r->to - 1 of every sequence of r (those >= 0 timed into r->t). */
static void *run_steps(void *p) {
    Run *r = p;
    Q35Err err = {0};
    for (int s = r->from; s < r->to && !r->rc; s++) {
        for (int b = 0; b < r->B; b++)
            r->it[b] = (Q35StepItem){.seq = r->seq[b], .ids = &r->next[b], .n = 1, .sample = 1};
        const double t0 = now_s();
        r->rc = q35_step(r->e, r->it, r->B, r->out, &err);
        const double t1 = now_s();
        if (s >= 0) r->t[s] = t1 - t0;
        for (int b = 0; b < r->B && !r->rc; b++) r->next[b] = r->out[b].id;
    }
    if (r->rc) fprintf(stderr, "B %d: step: %s\n", r->B, err.msg);
    return NULL;
}

#ifdef Q35_TRACE
/* common.cuh's Q35TraceRec and the fetchers of the batched step's kernels (extern "C" in the trace build) */
typedef struct TraceRec {
    unsigned long long t0, t1, t2;
    unsigned id, block;
} TraceRec;
int cuda_trace_fetch_skinny(void *dst, int cap);
int cuda_trace_fetch_serve(void *dst, int cap);
int cuda_trace_fetch_lm_rows(void *dst, int cap);

/* TRACE_STEPS more decode steps of r (untimed), each one's block records appended to g_trace_csv */
static int trace_b(Run *r) {
    int (*fetch[3])(void *, int) = {cuda_trace_fetch_skinny, cuda_trace_fetch_serve, cuda_trace_fetch_lm_rows};
    const int cap = 1 << 16;
    TraceRec *buf = malloc(sizeof(TraceRec) * (size_t)cap);
    FILE *f = buf ? fopen(g_trace_csv, "a") : NULL;
    if (!f) {
        fprintf(stderr, "B %d: cannot write the trace %s\n", r->B, g_trace_csv);
        free(buf);
        return 1;
    }
    int rc = 0;
    for (int k = 0; k < 3 && !rc; k++) rc = fetch[k](buf, cap) < 0; /* the timed steps' records: dropped */
    for (int s = 0; s < TRACE_STEPS && !rc; s++) {
        r->from = -1, r->to = 0;
        run_steps(r);
        rc = r->rc;
        for (int k = 0; k < 3 && !rc; k++) {
            const int n = fetch[k](buf, cap);
            rc = n < 0;
            for (int i = 0; i < n; i++)
                fprintf(f, "%d,%d,%u,%u,%llu,%llu,%llu\n", r->B, s, buf[i].id, buf[i].block, buf[i].t0, buf[i].t1,
                        buf[i].t2);
        }
    }
    if (rc) fprintf(stderr, "B %d: the traced steps failed\n", r->B);
    fclose(f);
    free(buf);
    return rc;
}
#endif

static void run_close(Run *r) {
    for (int b = 0; b < r->B && r->seq; b++)
        if (r->seq[b] >= 0) q35_seq_close(r->e, r->seq[b]);
    q35_serve_close(r->e);
    free(r->seq), free(r->ids), free(r->next), free(r->it), free(r->out), free(r->t);
}

/* One batch size over the engines e[0 .. ne): each takes B / ne of the sequences and steps them from a thread of its
 * own, all at once (--engines: what two batches stepping side by side on one GPU give); returns 0 or an error code. */
static int run_b(Q35Engine **e, int ne, int B, int ctx, int steps) {
    if (B < ne) {
        fprintf(stderr, "B %d: fewer sequences than the %d engines\n", B, ne);
        return 1;
    }
    Run r[8];
    memset(r, 0, sizeof r);
    int rc = 0, opened = 0;
    for (int k = 0; k < ne && !rc; k++, opened++) {
        r[k] = (Run){.e = e[k], .B = B / ne + (k < B % ne), .ctx = ctx, .steps = steps, .from = -3, .to = 0};
        rc = run_open(&r[k]);
        if (!rc) run_steps(&r[k]); /* its 3 warm-up steps, alone */
        rc = rc ? rc : r[k].rc;
        r[k].from = 0, r[k].to = steps;
    }
    double wall = 0.0;
    if (!rc) {
        pthread_t th[8];
        const double t0 = now_s();
        int started[8] = {0};
        for (int k = 1; k < ne; k++) started[k] = pthread_create(&th[k], NULL, run_steps, &r[k]) == 0;
        run_steps(&r[0]);
        for (int k = 1; k < ne; k++) {
            if (started[k]) {
                pthread_join(th[k], NULL);
            } else {
                fprintf(stderr, "B %d: engine %d: no thread\n", B, k);
                rc = 1;
            }
        }
        wall = now_s() - t0;
        for (int k = 0; k < ne; k++) rc = rc ? rc : r[k].rc;
    }
    if (!rc && steps > 0) {
        qsort(r[0].t, (size_t)steps, sizeof r[0].t[0], cmp_double);
        const double med = r[0].t[steps / 2];
        const Q35ServeInfo *info = &r[0].info;
        const double st =
            (double)B * (2.0 * (double)info->slot_bytes + (double)info->block_bytes / info->kv_block * ctx);
        if (ne == 1)
            printf("B %4d  ctx %5d  step %8.3f ms (min %.3f)  %9.0f tokens/s  state+KV %.2f GB/step\n", B, ctx,
                   1e3 * med, 1e3 * r[0].t[0], B / med, st / 1e9);
        else
            printf("B %4d  ctx %5d  %d engines side by side: engine 0 step %8.3f ms (min %.3f)  %9.0f tokens/s in all "
                   "(%d steps each in %.3f s)  state+KV %.2f GB/step\n",
                   B, ctx, ne, 1e3 * med, 1e3 * r[0].t[0], (double)B * steps / wall, steps, wall, st / 1e9);
    }
#ifdef Q35_TRACE
    if (!rc && g_trace_csv && ne == 1 && B > 1) rc = trace_b(&r[0]);
#endif
    for (int k = 0; k < opened; k++) run_close(&r[k]);
    return rc;
}

int main(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    o.dummy = "qwen3.5-0.8b";
    o.backend = "cuda";
    int ctx = 1024, steps = 20, bs[16], nb = 0, prompt = 0, ne = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dummy") && i + 1 < argc)
            o.dummy = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            o.backend = argv[++i];
        else if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--deterministic"))
            o.deterministic = 1;
        else if (!strcmp(argv[i], "--weights") && i + 1 < argc)
            o.weights = argv[++i];
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc)
            g_temp = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--top-p") && i + 1 < argc)
            g_top_p = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--top-k") && i + 1 < argc)
            g_top_k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--presence-penalty") && i + 1 < argc)
            g_presence = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--logprobs") && i + 1 < argc)
            g_logprobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-memory") && i + 1 < argc)
            g_kv_bytes = (size_t)(atof(argv[++i]) * 1e9);
        else if (!strcmp(argv[i], "--kv-block") && i + 1 < argc)
            g_kv_block = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--state-dtype") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "float32") || !strcmp(argv[i + 1], "bfloat16")))
            g_state_bf16 = !strcmp(argv[++i], "bfloat16");
        else if (!strcmp(argv[i], "--kv-cache-dtype") && i + 1 < argc &&
                 (!strcmp(argv[i + 1], "bfloat16") || !strcmp(argv[i + 1], "fp8")))
            g_kv_fp8 = !strcmp(argv[++i], "fp8");
        else if (!strcmp(argv[i], "--ablate") && i + 1 < argc)
            g_ablate = argv[++i];
        else if (!strcmp(argv[i], "--trace-csv") && i + 1 < argc) {
#ifdef Q35_TRACE
            g_trace_csv = argv[++i];
#else
            fprintf(stderr, "serve_step: --trace-csv needs the trace build (make TRACE=1 BUILD=build-trace "
                            "build-trace/bench/serve_step)\n");
            return 2;
#endif
        } else if (!strcmp(argv[i], "--engines") && i + 1 < argc && atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 8)
            ne = atoi(argv[++i]);
        else if (nb < 16 && atoi(argv[i]) > 0)
            bs[nb++] = atoi(argv[i]);
        else {
            fprintf(stderr,
                    "usage: serve_step [--dummy NAME] [--backend cpu|cuda] [--ctx N] [--steps N] [--deterministic] "
                    "[--weights auto|fp8] [--temperature T] [--top-p P] [--top-k K] [--presence-penalty X] "
                    "[--logprobs K] [--prompt N] [--kv-memory GB] [--kv-block N] [--state-dtype float32|bfloat16] "
                    "[--kv-cache-dtype bfloat16|fp8] [--ablate sv.KIND,...] [--engines N] [--trace-csv PATH] "
                    "[B ...]\n");
            return 2;
        }
    }
    if (ctx < 1 || steps < 0) return 2;
    if (!nb) {
        const int d[6] = {1, 8, 32, 64, 128, 256};
        for (nb = 0; nb < 6; nb++) bs[nb] = d[nb];
    }
    o.max_seq = ctx + steps + (g_trace_csv ? TRACE_STEPS : 0) + 8;
    Q35Engine *e[8] = {NULL};
    Q35Err err = {0};
    int fails = 0;
    if (prompt > 0) ne = 1; /* --prompt times one engine */
    for (int k = 0; k < ne && !fails; k++)
        if (q35_engine_open(&e[k], &o, &err)) {
            fprintf(stderr, "engine: %s\n", err.msg);
            fails = 1;
        }
    if (fails) {
    } else if (prompt > 0)
        fails += run_prompt(e[0], prompt, steps) != 0;
    else
        for (int i = 0; i < nb; i++) fails += run_b(e, ne, bs[i], ctx, steps) != 0;
    for (int k = 0; k < ne; k++)
        if (e[k]) q35_engine_close(e[k]);
    return fails ? 1 : 0;
}
