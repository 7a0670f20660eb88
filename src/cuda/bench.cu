/* bench.cu — the CUDA backend's bench hook: decode ms/token at a given context length (KV
 * positions [0, ctx_len) filled with random bf16, the timed token at pos = ctx_len, the same
 * step replayed), for graph/eager, PDL on/off, atomic/deterministic split-K, greedy/sampling,
 * with and without the per-token host sync; with the fused MLP, the same step with the two MLP GEMVs for
 * comparison; with the LM head's screen, the same step with the full head; the launches per step; per-launch
 * event times and bytes of one eager step; and the copy / streaming-read bandwidth measured in the same run.
 * rq->ablate leaves launch kinds out of every step timed (measurement only). */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/backend.cuh"

#define BENCH_BATCHES 5

static int bfail(cudaError_t e, const char *what, Err *err) {
    return err_set(err, Q35_ERR_CUDA, "cuda bench: %s: %s", what, cudaGetErrorString(e));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

/* ms per step over batches of `iters` back-to-back steps (no host sync inside a batch). */
static int time_steps(CudaCtx *ctx, int sample, int iters, double *ms, Err *err) {
    cudaEvent_t a = NULL, b = NULL;
    cudaError_t e = cudaEventCreate(&a);
    if (e == cudaSuccess) e = cudaEventCreate(&b);
    int rc = e == cudaSuccess ? 0 : bfail(e, "event create", err);
    for (int i = 0; i < 5 && !rc; i++) rc = cuda_run_step(ctx, sample, err); /* warm-up (and capture) */
    double t[BENCH_BATCHES];
    for (int bt = 0; bt < BENCH_BATCHES && !rc; bt++) {
        cudaEventRecord(a, ctx->stream);
        for (int i = 0; i < iters && !rc; i++) rc = cuda_run_step(ctx, sample, err);
        cudaEventRecord(b, ctx->stream);
        if (!rc && (e = cudaEventSynchronize(b)) != cudaSuccess) rc = bfail(e, "step", err);
        float f = 0;
        if (!rc) cudaEventElapsedTime(&f, a, b);
        t[bt] = f / iters;
    }
    if (!rc) *ms = median(t, BENCH_BATCHES);
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    return rc;
}

static int time_mode(CudaCtx *ctx, int det, int pdl, int no_graph, int sample, int iters, double *ms, Err *err) {
    ctx->deterministic = det;
    ctx->pdl = pdl;
    ctx->no_graph = no_graph;
    cuda_graphs_drop(ctx);
    return time_steps(ctx, sample, iters, ms, err);
}

/* decode_sample's loop: replay, 4-byte readback, host sync; median per token. */
static int time_sync(CudaCtx *ctx, int iters, double *ms, Err *err) {
    double *t = (double *)malloc(sizeof(double) * (size_t)iters);
    if (!t) return err_set(err, Q35_ERR_OOM, "cuda bench: out of host memory");
    int rc = 0;
    for (int i = 0; i < iters && !rc; i++) {
        double t0 = now_s();
        const int screen = cuda_step_screen(ctx, 0); /* as decode_sample: the id as the screen's key */
        rc = cuda_run_step(ctx, 0, err);
        cudaError_t e = cudaSuccess;
        if (!rc && screen)
            e = cudaMemcpyAsync(ctx->key_host, ctx->lm_key, 8, cudaMemcpyDeviceToHost, ctx->stream);
        else if (!rc)
            e = cudaMemcpyAsync(ctx->id_host, ctx->out_id, sizeof(int), cudaMemcpyDeviceToHost, ctx->stream);
        if (!rc && e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
        if (!rc && e != cudaSuccess) rc = bfail(e, "step", err);
        t[i] = 1e3 * (now_s() - t0);
    }
    if (!rc) *ms = median(t, iters);
    free(t);
    return rc;
}

/* The bench's sampling settings (its `sampling` column and the sampling step's --ops line). */
static void bench_sampling(StepParams *sp) {
    sp->temperature = 1.0f;
    sp->top_k = 20;
    sp->top_p = 0.95f;
    sp->min_p = 0.05f;
    sp->write_logits = 1;
    sp->seed = 1;
}

/* Two eager steps (greedy, or the sampling graph's launches), the second with its launches recorded (and an
 * event before each with `events`). */
static int eager_step(CudaCtx *ctx, int events, int sample, Err *err) {
    ctx->no_graph = 1;
    ctx->rec_ops = events ? 2 : 1;
    int rc = cuda_state_clean(ctx, err);
    for (int rep = 0; rep < 2 && !rc; rep++) rc = cuda_step_enqueue(ctx, sample, err); /* second one is timed */
    cudaError_t e = cudaStreamSynchronize(ctx->stream);
    ctx->rec_ops = 0;
    if (rc) return rc;
    return e != cudaSuccess ? bfail(e, sample ? "eager sampling step" : "eager step", err) : 0;
}

/* Recorded launch i of the last eager step as a BenchOp named prefix + its name (its time from the events). */
static void op_from(const CudaCtx *ctx, int i, int events, const char *prefix, BenchOp *o) {
    snprintf(o->name, sizeof o->name, "%s%s", prefix, ctx->ops[i].name);
    o->bytes = ctx->ops[i].bytes;
    float f = 0;
    if (events) cudaEventElapsedTime(&f, ctx->ev[i], ctx->ev[i + 1]);
    o->us = 1e3 * f;
}

/* One eager step with an event before every launch: per-launch times and bytes in res->ops, and
 * res->step_bytes = their sum. */
static int time_ops(CudaCtx *ctx, int events, BenchResult *res, Err *err) {
    if (events && !ctx->ev_ready) {
        for (int i = 0; i <= CUDA_MAX_OPS; i++) {
            cudaError_t e = cudaEventCreate(&ctx->ev[i]);
            if (e != cudaSuccess) return bfail(e, "event create", err);
        }
        ctx->ev_ready = 1;
    }
    int rc = eager_step(ctx, events, 0, err);
    if (rc) return rc;
    res->n_ops = ctx->n_ops < BENCH_MAX_OPS ? ctx->n_ops : BENCH_MAX_OPS;
    res->step_bytes = 0;
    for (int i = 0; i < res->n_ops; i++) {
        op_from(ctx, i, events, "", &res->ops[i]);
        res->step_bytes += res->ops[i].bytes;
    }
    if (!events) res->n_ops = 0;
    return 0;
}

/* The sampling step's own cost (with --ops, after time_ops made the events): one eager step of the sampling
 * graph's launches, its LM head (logits written) and sampler appended as "sampling:lm_head" / "sampling:sample"
 * (printed apart from the greedy step's table), at the bench's sampling settings. */
static int time_sample_ops(CudaCtx *ctx, StepParams *sp, BenchResult *res, Err *err) {
    const StepParams keep = *sp;
    bench_sampling(sp);
    const int rc = eager_step(ctx, 1, 1, err);
    *sp = keep;
    if (rc) return rc;
    for (int i = 0; i < ctx->n_ops && res->n_ops < BENCH_MAX_OPS; i++)
        if (!strcmp(ctx->ops[i].name, "lm_head") || !strcmp(ctx->ops[i].name, "sample"))
            op_from(ctx, i, 1, "sampling:", &res->ops[res->n_ops++]);
    return 0;
}

#ifdef Q35_TRACE
extern "C" int cuda_trace_fetch_matvec(void *dst, int cap);
extern "C" int cuda_trace_fetch_deltanet(void *dst, int cap);
extern "C" int cuda_trace_fetch_attention(void *dst, int cap);
extern "C" int cuda_trace_fetch_mlp(void *dst, int cap);
extern "C" int cuda_trace_fetch_dn_layer(void *dst, int cap);
extern "C" int cuda_trace_fetch_lm_screen(void *dst, int cap);

/* The trace build (common.cuh "step trace"): 20 replays of the default step, each synchronised and its
 * block records appended to `path` (bench --trace-csv; default step_trace.csv) as
 * ctx,replay,id,block,t0,t1,t2 (global timer, ns); tools/step_trace.py reads them. */
static int trace_steps(CudaCtx *ctx, int ctx_len, const char *path, Err *err) {
    int (*fetch[6])(void *, int) = {cuda_trace_fetch_matvec, cuda_trace_fetch_deltanet, cuda_trace_fetch_attention,
                                    cuda_trace_fetch_mlp,    cuda_trace_fetch_dn_layer, cuda_trace_fetch_lm_screen};
    const int n_fetch = (int)(sizeof fetch / sizeof fetch[0]);
    if (!path || !*path) path = "step_trace.csv";
    const int cap = Q35_TRACE_CAP;
    Q35TraceRec *buf = (Q35TraceRec *)malloc(sizeof(Q35TraceRec) * (size_t)cap);
    FILE *f = buf ? fopen(path, "a") : NULL;
    if (!f) {
        free(buf);
        return err_set(err, Q35_ERR_IO, "cuda bench: cannot write the step trace %s", path);
    }
    int rc = cuda_run_step(ctx, 0, err); /* capture + warm-up */
    cudaError_t e = rc ? cudaSuccess : cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) rc = bfail(e, "trace warm-up", err);
    for (int k = 0; k < n_fetch && !rc; k++)
        if (fetch[k](buf, cap) < 0) rc = bfail(cudaErrorUnknown, "trace fetch", err);
    for (int r = 0; r < 20 && !rc; r++) {
        rc = cuda_run_step(ctx, 0, err);
        if (!rc && (e = cudaStreamSynchronize(ctx->stream)) != cudaSuccess) rc = bfail(e, "traced step", err);
        for (int k = 0; k < n_fetch && !rc; k++) {
            const int n = fetch[k](buf, cap);
            if (n < 0) rc = bfail(cudaErrorUnknown, "trace fetch", err);
            for (int i = 0; i < n; i++)
                fprintf(f, "%d,%d,%u,%u,%llu,%llu,%llu\n", ctx_len, r, buf[i].id, buf[i].block, buf[i].t0, buf[i].t1,
                        buf[i].t2);
        }
    }
    fclose(f);
    free(buf);
    return rc;
}
#endif

/* Device-to-device copy and streaming-read bandwidth over 256 MiB buffers (L2 is 60 MB). */
static int bandwidth(CudaCtx *ctx, BenchResult *res, Err *err) {
    const size_t bytes = (size_t)256 << 20;
    void *src = NULL, *dst = NULL;
    if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        if (src) cudaFree(src);
        return 0; /* no room for the probe: leave 0 */
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemsetAsync(src, 1, bytes, ctx->stream);
    double tc[BENCH_BATCHES], tr[BENCH_BATCHES];
    CudaLaunch lc = {ctx->stream, 0, NULL, 0};
    ReadBwParams rp = {src, (int64_t)(bytes / 16), (unsigned *)dst, 4 * ctx->n_sm};
    int rc = 0;
    for (int i = 0; i < BENCH_BATCHES + 1 && !rc; i++) { /* the first round warms up */
        float f = 0;
        cudaEventRecord(a, ctx->stream);
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
        cudaEventRecord(b, ctx->stream);
        if (e == cudaSuccess) e = cudaEventSynchronize(b);
        if (e != cudaSuccess) rc = bfail(e, "copy", err);
        cudaEventElapsedTime(&f, a, b);
        if (i) tc[i - 1] = 2.0 * bytes / (f * 1e-3) / 1e9;
        cudaEventRecord(a, ctx->stream);
        if (!rc && (rc = cuda_read_bw(&rp, &lc))) rc = bfail((cudaError_t)rc, "read", err);
        cudaEventRecord(b, ctx->stream);
        if (!rc && (e = cudaEventSynchronize(b)) != cudaSuccess) rc = bfail(e, "read", err);
        cudaEventElapsedTime(&f, a, b);
        if (i) tr[i - 1] = (double)bytes / (f * 1e-3) / 1e9;
    }
    if (!rc) {
        res->copy_gbs = median(tc, BENCH_BATCHES);
        res->read_gbs = median(tr, BENCH_BATCHES);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaFree(src);
    cudaFree(dst);
    return rc;
}

int cuda_bench_run(CudaCtx *ctx, const BenchRequest *rq, BenchResult *res, Err *err) {
    const Config *c = ctx->c;
    memset(res, 0, sizeof *res);
    if (rq->ctx_len < 0 || rq->ctx_len >= ctx->max_seq)
        return err_set(err, Q35_ERR_ARG, "cuda bench: context %d outside [0, %d)", rq->ctx_len, ctx->max_seq);
    if (ctx->probe.dir) return err_set(err, Q35_ERR_ARG, "cuda bench: not with probes");
    const int iters = rq->iters > 0 ? rq->iters : 200;
    const int det0 = ctx->deterministic, pdl0 = ctx->pdl, ng0 = ctx->no_graph, mf0 = ctx->mlp_fused;
    ctx->ablate = rq->ablate && *rq->ablate ? rq->ablate : NULL; /* checked by be_bench */
    cudaDeviceProp prop;
    int dev = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        snprintf(res->device, sizeof res->device, "%.63s", prop.name);
    res->n_sm = ctx->n_sm;

    /* random KV contents for every full-attention layer; the DeltaNet state stays as it is */
    CudaLaunch lc = {ctx->stream, 0, NULL, 0};
    const int64_t kv = (int64_t)c->num_key_value_heads * ctx->max_seq * c->head_dim;
    int rc = 0;
    for (int l = 0; l < c->num_hidden_layers && !rc; l++) {
        CudaLayer *ly = &ctx->layers[l];
        if (ly->type != LAYER_FULL_ATTN) continue;
        FillParams fk = {ly->Kc, kv, 0x5eedull * (uint64_t)(2 * l + 1), 1.0f};
        FillParams fv = {ly->Vc, kv, 0x5eedull * (uint64_t)(2 * l + 2), 1.0f};
        if ((rc = cuda_fill_bf16(&fk, &lc)) || (rc = cuda_fill_bf16(&fv, &lc)))
            rc = bfail((cudaError_t)rc, "fill", err);
    }
    StepParams *sp = ctx->step_host;
    memset(sp, 0, sizeof *sp);
    sp->token = 1 < c->vocab_size ? 1 : 0;
    sp->pos = rq->ctx_len;
    sp->top_p = 1.0f;

    res->lm_screen = ctx->lm_screen;
    if (!rc && ctx->lm_screen && cudaMemset(ctx->lm_stats, 0, 3 * sizeof(unsigned)) != cudaSuccess)
        rc = bfail(cudaGetLastError(), "screen stats", err);
    if (!rc) rc = time_mode(ctx, det0, pdl0, ng0, 0, iters, &res->ms_token, err);
    if (!rc && ctx->lm_screen) { /* the screen's counters over those steps, then the step with the full head */
        unsigned st[3] = {0, 0, 0};
        cudaError_t e = cudaMemcpy(st, ctx->lm_stats, sizeof st, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess) rc = bfail(e, "screen stats", err);
        const double steps = ctx->lm_blocks > 0 ? (double)st[2] / ctx->lm_blocks : 0;
        res->screen_rows = steps > 0 ? st[0] / steps : 0;
        res->screen_fallback = steps > 0 ? st[1] / steps : 0;
        const int ls0 = ctx->lm_screen;
        ctx->lm_screen = 0;
        if (!rc) rc = time_mode(ctx, 0, 1, 0, 0, iters, &res->ms_lm_full, err);
        ctx->lm_screen = ls0;
        cuda_graphs_drop(ctx);
    }
    if (!rc) rc = time_mode(ctx, 0, 1, 0, 0, iters, &res->ms_atomic, err);
    if (!rc) res->launches = ctx->graph_kernels[cuda_graph_index(ctx, 0)];
    /* the fused MLP against the two MLP GEMVs, same run */
    res->mlp_fused = mf0;
    if (!rc && mf0) {
        ctx->mlp_fused = 0;
        rc = time_mode(ctx, 0, 1, 0, 0, iters, &res->ms_mlp_unfused, err);
        if (!rc) res->launches_mlp_unfused = ctx->graph_kernels[cuda_graph_index(ctx, 0)];
        ctx->mlp_fused = 1;
        cuda_graphs_drop(ctx);
    }
    if (!rc) rc = time_mode(ctx, 1, 1, 0, 0, iters, &res->ms_det, err);
    if (!rc) rc = time_mode(ctx, 0, 0, 0, 0, iters, &res->ms_nopdl, err);
    if (!rc) rc = time_mode(ctx, 0, 1, 1, 0, iters, &res->ms_eager, err);
    if (!rc) {
        ctx->deterministic = det0;
        ctx->pdl = pdl0;
        ctx->no_graph = ng0;
        cuda_graphs_drop(ctx);
        rc = time_sync(ctx, iters, &res->ms_sync, err);
    }
    if (!rc) {
        bench_sampling(sp);
        rc = time_steps(ctx, 1, iters, &res->ms_sample, err);
        memset(sp, 0, sizeof *sp);
        sp->token = 1 < c->vocab_size ? 1 : 0;
        sp->pos = rq->ctx_len;
        sp->top_p = 1.0f;
    }
    /* per-launch breakdown: where a token's time goes */
    if (!rc) rc = time_ops(ctx, rq->ops, res, err);
    if (!rc && rq->ops) rc = time_sample_ops(ctx, sp, res, err);
#ifdef Q35_TRACE
    if (!rc) {
        ctx->deterministic = det0;
        ctx->pdl = pdl0;
        ctx->no_graph = ng0;
        ctx->rec_ops = 0;
        cuda_graphs_drop(ctx);
        rc = trace_steps(ctx, rq->ctx_len, rq->trace_csv, err);
        cuda_graphs_drop(ctx);
    }
#else
    if (!rc && rq->trace_csv && *rq->trace_csv)
        rc = err_set(err, Q35_ERR_UNSUPPORTED, "bench --trace-csv needs the trace build (make TRACE=1)");
#endif
    if (!rc) rc = bandwidth(ctx, res, err);
    ctx->deterministic = det0;
    ctx->pdl = pdl0;
    ctx->no_graph = ng0;
    ctx->rec_ops = 0;
    ctx->mlp_fused = mf0;
    ctx->ablate = NULL;
    return rc;
}
