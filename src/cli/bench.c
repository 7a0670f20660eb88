/* bench.c — `qwen35 bench`: decode ms/token at several context lengths (device timers over many
 * graph replays, median, when the backend has them; wall clock otherwise), achieved GB/s against
 * the copy/read bandwidth measured in the same run, launches per step, atomic vs deterministic
 * split-K, graph/PDL on/off, an optional per-op breakdown (--ops), and prefill: device-timed
 * prompts of --prefill-list lengths with TFLOP/s against our GEMM's rate in the same run (and with
 * a per-launch breakdown of one piece: the longest listed length up to 2048, else 2048), plus the wall-clock
 * q35_forward. Prints markdown; --json/--md write the results. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/common.h"

static double wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Appends printf output to a growing buffer. */
typedef struct Buf {
    char *s;
    size_t n, cap;
} Buf;
static void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(Buf *b, const char *fmt, ...) {
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int k = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        if (k >= 0 && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (k >= 0 && cap < b->n + (size_t)k + 1) cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) return;
        b->s = s, b->cap = cap;
    }
}

/* Per-op breakdown grouped by the op name after "Lxx." (summed over layers). */
static void ops_table(Buf *md, const Q35BenchResult *r) {
    char names[64][40];
    double us[64] = {0}, bytes[64] = {0};
    int cnt[64] = {0}, k = 0;
    double tot_us = 0;
    for (int i = 0; i < r->n_ops; i++) {
        const char *n = r->ops[i].name;
        if (!strncmp(n, "sampling:", 9)) continue; /* printed below */
        if (n[0] == 'L' && strchr(n, '.')) n = strchr(n, '.') + 1;
        int j = 0;
        while (j < k && strcmp(names[j], n)) j++;
        if (j == k && k < 64) snprintf(names[k++], 40, "%s", n);
        if (j < 64) us[j] += r->ops[i].us, bytes[j] += r->ops[i].bytes, cnt[j]++;
        tot_us += r->ops[i].us;
    }
    bprintf(md, "\nPer-op breakdown of one eager step (events, no PDL; summed over layers):\n\n"
                "| op | launches | us | %% of step | MB | GB/s | %% of read BW |\n|---|---|---|---|---|---|---|\n");
    for (int j = 0; j < k; j++)
        bprintf(md, "| %s | %d | %.1f | %.1f | %.2f | %.0f | %.0f |\n", names[j], cnt[j], us[j], 100 * us[j] / tot_us,
                bytes[j] / 1e6, bytes[j] / us[j] / 1e3, 100 * bytes[j] / us[j] / 1e3 / r->read_gbs);
    int n_phase = 0;
    int n_samp = 0;
    for (int i = 0; i < r->n_ops; i++) {
        n_samp += !strncmp(r->ops[i].name, "sampling:", 9);
        n_phase += strncmp(r->ops[i].name, "sampling:", 9) != 0;
    }
    bprintf(md, "| total | %d | %.1f | 100 | %.1f | %.0f | %.0f |\n", n_phase, tot_us, r->step_bytes / 1e6,
            r->step_bytes / tot_us / 1e3, 100 * r->step_bytes / tot_us / 1e3 / r->read_gbs);
    if (n_samp) {
        /* the settings of src/cuda/bench.cu bench_sampling */
        bprintf(md, "\nThe sampling step's own launches (T 1, top-k 20, top-p 0.95, min-p 0.05; eager, events):");
        for (int i = 0; i < r->n_ops; i++)
            if (!strncmp(r->ops[i].name, "sampling:", 9)) bprintf(md, " %s %.1f us;", r->ops[i].name + 9, r->ops[i].us);
        bprintf(md, "\n");
    }
}

/* Prefill timings (device events) at each length, the GEMM rate of the same run, and with ops the
 * per-launch breakdown of one prefill piece grouped by kind; ablate: --ablate's list (its pf.* kinds are left out of
 * every prefill timed). A backend without device timers gets a line saying so, or with unsupported set *unsupported
 * = 1 and nothing written. Returns 1 on a hard failure. */
static int prefill_bench(Q35Engine *e, const int *lens, int n, int ops, const char *ablate, Buf *md, Buf *js,
                         Q35BenchResult *r, int *unsupported) {
    Q35BenchRequest rq = {.ops = ops, .n_prefill = n, .ablate = ablate};
    memcpy(rq.prefill_lens, lens, sizeof(int) * (size_t)n);
    Q35Err err = {0};
    if (q35_bench_decode(e, &rq, r, &err)) {
        if (err.code != Q35_ERR_UNSUPPORTED) {
            cli_fail("bench", &err);
            return 1;
        }
        if (unsupported)
            *unsupported = 1;
        else
            bprintf(md, "\nPrefill: %s\n", err.msg);
        return 0;
    }
    bprintf(md,
            "\nPrefill on %s, pieces of %d tokens; our bf16 GEMM (hand-written, no cuBLAS) at %dx%dx%d: "
            "%.0f TFLOP/s in this run; `no PDL`: the same prefill, kernels launched without programmatic dependent "
            "launch; `graph ms`: the same launches replayed as one CUDA graph (the device time without the host's "
            "launch work)\n\n| tokens | ms | tok/s | TFLOP | TFLOP/s | %% of GEMM rate | no PDL ms | graph ms |\n"
            "|---|---|---|---|---|---|---|---|\n",
            r->device, r->prefill_piece, r->gemm_m, r->gemm_n, r->gemm_k, r->gemm_tflops);
    bprintf(js, ",\"gemm_tflops\":%.1f,\"prefill_piece\":%d,\"prefill\":[", r->gemm_tflops, r->prefill_piece);
    for (int i = 0; i < r->n_prefill; i++) {
        const Q35BenchPrefill *p = &r->prefill[i];
        const double tf = p->tflop / (p->ms * 1e-3);
        bprintf(md, "| %d | %.2f | %.0f | %.3f | %.0f | %.0f | %.2f | %.2f |\n", p->tokens, p->ms,
                p->tokens / (p->ms * 1e-3), p->tflop, tf, r->gemm_tflops > 0 ? 100 * tf / r->gemm_tflops : 0.0,
                p->ms_nopdl, p->ms_graph);
        bprintf(js, "%s{\"tokens\":%d,\"ms\":%.3f,\"ms_nopdl\":%.3f,\"ms_graph\":%.3f,\"tflop\":%.4f}", i ? "," : "",
                p->tokens, p->ms, p->ms_nopdl, p->ms_graph, p->tflop);
    }
    bprintf(js, "]");
    if (!ops || !r->n_ops) return 0;
    char names[64][40];
    double us[64] = {0}, fl[64] = {0}, tot = 0, tot_fl = 0;
    int cnt[64] = {0}, k = 0;
    for (int i = 0; i < r->n_ops; i++) {
        const char *nm = r->ops[i].name;
        if (nm[0] == 'L' && strchr(nm, '.')) nm = strchr(nm, '.') + 1;
        int j = 0;
        while (j < k && strcmp(names[j], nm)) j++;
        if (j == k && k < 64) snprintf(names[k++], 40, "%s", nm);
        if (j < 64) us[j] += r->ops[i].us, fl[j] += r->ops[i].flop, cnt[j]++;
        tot += r->ops[i].us, tot_fl += r->ops[i].flop;
    }
    bprintf(md,
            "\nPer-launch breakdown of one eager prefill of %d tokens (events; summed over layers):\n\n"
            "| op | launches | us | %% of prefill | GFLOP | TFLOP/s |\n|---|---|---|---|---|---|\n",
            r->ops_tokens);
    for (int j = 0; j < k; j++)
        bprintf(md, "| %s | %d | %.1f | %.1f | %.1f | %.0f |\n", names[j], cnt[j], us[j], 100 * us[j] / tot,
                fl[j] / 1e9, us[j] > 0 ? fl[j] / us[j] / 1e6 : 0.0);
    bprintf(md, "| total | %d | %.1f | 100 | %.1f | %.0f |\n", r->n_ops, tot, tot_fl / 1e9, tot_fl / tot / 1e6);
    return 0;
}

/* Without --ctx-list / --prefill-list the CPU times one short length (the GPU's lists take hours there). */
static void cpu_lists(int *ctxs, int *n_ctx, int ctx_seen, int *plens, int *n_plen, int plen_seen, int n_prompt) {
    if (!ctx_seen) ctxs[0] = n_prompt ? n_prompt : 64, *n_ctx = 1;
    if (!plen_seen) plens[0] = n_prompt ? n_prompt : 64, *n_plen = 1;
}

/* Wall-clock bench without a device timer (the CPU): a q35_forward of each prefill length from position 0,
 * then at each context length ctx (prompt of ctx ids, untimed) gen greedy decode steps, ms per step. */
static int cpu_bench(Q35Engine *e, const int *ids, const int *ctxs, int n_ctx, const int *plens, int n_plen, int gen,
                     float *logits, Buf *md, Buf *js) {
    Q35Err err = {0};
    const int V = q35_vocab_size(e);
    bprintf(md,
            "\nPrefill on %s (wall clock, q35_forward from position 0, last-row logits):\n\n"
            "| prefill tokens | ms | tok/s |\n|---|---|---|\n",
            q35_backend_name(e));
    bprintf(js, ",\"prefill\":[");
    for (int i = 0; i < n_plen; i++) {
        if (q35_reset(e, &err)) return cli_fail("bench", &err);
        double t0 = wall();
        if (q35_forward(e, ids, plens[i], 0, logits, &err)) return cli_fail("bench", &err);
        double t = wall() - t0;
        bprintf(md, "| %d | %.2f | %.1f |\n", plens[i], 1e3 * t, plens[i] / t);
        bprintf(js, "%s{\"tokens\":%d,\"ms\":%.3f}", i ? "," : "", plens[i], 1e3 * t);
    }
    bprintf(js, "],\"decode_wall\":[");
    if (n_ctx > 0)
        bprintf(md,
                "\nDecode on %s (wall clock, %d greedy steps after a prompt of ctx tokens):\n\n"
                "| ctx | ms/token | tok/s |\n|---|---|---|\n",
                q35_backend_name(e), gen);
    for (int c = 0; c < n_ctx; c++) {
        if (q35_reset(e, &err) || q35_forward(e, ids, ctxs[c], 0, logits, &err)) return cli_fail("bench", &err);
        int id = 0;
        double t0 = wall();
        for (int t = 0; t < gen; t++) {
            for (int j = 1; j < V; j++)
                if (logits[j] > logits[id]) id = j;
            if (q35_forward(e, &id, 1, 0, logits, &err)) return cli_fail("bench", &err);
        }
        double t_dec = (wall() - t0) / gen;
        bprintf(md, "| %d | %.3f | %.2f |\n", ctxs[c], 1e3 * t_dec, 1.0 / t_dec);
        bprintf(js, "%s{\"ctx\":%d,\"ms_token\":%.4f}", c ? "," : "", ctxs[c], 1e3 * t_dec);
    }
    bprintf(js, "]");
    return 0;
}

int cmd_bench(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    int n_prompt = 0, n_gen = 16, ops = 0, iters = 0, ctx_seen = 0, plen_seen = 0, no_decode = 0;
    int ctxs[8] = {128, 2048, 16384}, n_ctx = 3;
    int plens[8] = {128, 512, 2048, 8192, 32768}, n_plen = 5;
    const char *json = NULL, *md_path = NULL, *ablate = NULL, *trace_csv = NULL;
    CliIds ctx_l = {0}, plen_l = {0};
    const CliFlag own[] = {
        {"--ctx-list", NULL, CLI_IDS, &ctx_l, .lo = 1, .hi = 1 << 24, .seen = &ctx_seen, .arg = "L",
         .help = "decode at these context lengths, at most 8 (default: CUDA 128,2048,16384; CPU 64)"},
        {"--prefill-list", NULL, CLI_IDS, &plen_l, .lo = 1, .hi = 1 << 24, .seen = &plen_seen, .arg = "L",
         .help = "prefill these prompt lengths, at most 8 (default: CUDA 128,...,32768; CPU 64)"},
        {"--prompt-len", NULL, CLI_INT, &n_prompt, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "wall-clock q35_forward prompt (default: CPU 64, CUDA 2048)"},
        {"--gen", NULL, CLI_INT, &n_gen, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "CPU: decode steps timed per context (default 16)"},
        {"--iters", NULL, CLI_INT, &iters, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "CUDA: graph replays per timing batch (default 200)"},
        {"--ops", NULL, CLI_BOOL, &ops, .help = "CUDA: per-op breakdown of one eager step"},
        {"--no-decode", NULL, CLI_BOOL, &no_decode,
         .help = "measurement: time only the --prefill-list lengths (no decode table; a profiler reaches the prefill "
                 "kernels sooner)"},
        {"--json", NULL, CLI_STR, &json, .arg = "FILE", .help = "write the results as JSON"},
        {"--md", NULL, CLI_STR, &md_path, .arg = "FILE", .help = "write the markdown tables"},
        {"--ablate", NULL, CLI_STR, &ablate, .arg = "LIST",
         .help =
             "measurement only (CUDA): launch kinds left out of the step, pf.* of the prefill (outputs are garbage)"},
        {"--trace-csv", NULL, CLI_STR, &trace_csv, .arg = "FILE",
         .help = "measurement only (CUDA, TRACE=1 build): per-block timer stamps into FILE"},
        {0}};
    const CliGroup groups[] = {{"bench flags", own}, {"model flags", m.flags}, {0}};
    const CliSpec spec = {"bench", "--model DIR | --dummy qwen3.5-0.8b [--backend cpu|cuda] [flags]",
                          "Decode ms/token at each context of --ctx-list and prefill time at each length of "
                          "--prefill-list\n(CUDA: device timers; CPU: wall clock), as markdown on stdout.",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    int rc = pr == CLI_OK ? cli_model_check("bench", &m) : pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    if (pr == CLI_OK && !rc && (ctx_l.n > 8 || plen_l.n > 8))
        rc = cli_usage_error("bench", "%s: at most 8 lengths", ctx_l.n > 8 ? "--ctx-list" : "--prefill-list");
    if (pr == CLI_OK && !rc && no_decode && (ctx_seen || ops))
        rc = cli_usage_error("bench", "--no-decode excludes %s", ctx_seen ? "--ctx-list" : "--ops");
    if (pr != CLI_OK || rc) {
        cli_ids_free(&ctx_l), cli_ids_free(&plen_l);
        return rc;
    }
    if (ctx_seen) n_ctx = ctx_l.n, memcpy(ctxs, ctx_l.v, sizeof(int) * (size_t)n_ctx);
    if (plen_seen) n_plen = plen_l.n, memcpy(plens, plen_l.v, sizeof(int) * (size_t)n_plen);
    if (no_decode) n_ctx = 0, ctx_seen = 1; /* cpu_lists adds none either */
    cli_ids_free(&ctx_l), cli_ids_free(&plen_l);
    Q35Options o = m.o;
    const int cpu = o.backend && !strcmp(o.backend, "cpu");
    if (cpu) cpu_lists(ctxs, &n_ctx, ctx_seen, plens, &n_plen, plen_seen, n_prompt);
    int max_ctx = 0;
    for (int i = 0; i < n_ctx; i++) max_ctx = ctxs[i] > max_ctx ? ctxs[i] : max_ctx;
    if (!n_prompt) n_prompt = cpu ? 64 : 2048;
    for (int i = 0; i < n_plen; i++) max_ctx = plens[i] > max_ctx ? plens[i] : max_ctx;
    if (!o.max_seq) o.max_seq = (max_ctx + n_gen > n_prompt + n_gen ? max_ctx + n_gen : n_prompt + n_gen) + 1;
    m.o = o;
    Q35Engine *e;
    if ((rc = cli_open("bench", &e, &m))) return rc;
    if (!strcmp(q35_backend_name(e), "cpu")) cpu_lists(ctxs, &n_ctx, ctx_seen, plens, &n_plen, plen_seen, n_prompt);
    int V = q35_vocab_size(e), n_ids = n_prompt;
    for (int i = 0; i < n_ctx; i++) n_ids = ctxs[i] > n_ids ? ctxs[i] : n_ids;
    for (int i = 0; i < n_plen; i++) n_ids = plens[i] > n_ids ? plens[i] : n_ids;
    for (int i = 0; i < n_ctx && !rc; i++)
        if (ctxs[i] + n_gen > q35_context_size(e))
            rc = cli_usage_error("bench", "--ctx-list: %d + %d decode steps pass the context of %d tokens (--ctx)",
                                 ctxs[i], n_gen, q35_context_size(e));
    for (int i = 0; i < n_plen && !rc; i++)
        if (plens[i] > q35_context_size(e))
            rc = cli_usage_error("bench", "--prefill-list: %d passes the context of %d tokens (--ctx)", plens[i],
                                 q35_context_size(e));
    if (rc) {
        q35_engine_close(e);
        return rc;
    }
    cli_note("bench", e);
    rc = CLI_EXIT_RUNTIME;
    Q35Err err = {0};
    Buf md = {0}, js = {0}, fz = {0}, sc = {0};
    Q35BenchResult *res = calloc(1, sizeof *res);
    int *ids = malloc(sizeof(int) * (size_t)n_ids);
    float *logits = malloc(sizeof(float) * (size_t)V);
    if (!res || !ids || !logits) {
        cli_error("bench", "out of memory");
        goto done;
    }
    for (int i = 0; i < n_ids; i++)
        ids[i] = (int)((1103515245u * (unsigned)i + 12345u) % (unsigned)(V < 50000 ? V : 50000));

    bprintf(&js, "{\"backend\":\"%s\",\"decode\":[", q35_backend_name(e));
    Q35BenchRequest rq = {0};
    rq.ctx_len = ctxs[0], rq.iters = iters;
    rq.ablate = ablate, rq.trace_csv = trace_csv; /* measurement only */
    int dev = 0;
    if (no_decode) { /* the device's prefill table alone; the CPU's wall-clock prefill below */
        int unsupported = 0;
        bprintf(&js, "]");
        if (prefill_bench(e, plens, n_plen, 1, ablate, &md, &js, res, &unsupported)) goto done;
        dev = !unsupported;
        if (dev && q35_reset(e, &err)) {
            cli_fail("bench", &err);
            goto done;
        }
    } else if ((dev = q35_bench_decode(e, &rq, res, &err) == 0)) {
        bprintf(&md,
                "Decode on %s (%d SMs); copy %.0f GB/s (read+write), streaming read %.0f GB/s; %.3f GB per step "
                "at ctx %d\n\n",
                res->device, res->n_sm, res->copy_gbs, res->read_gbs, res->step_bytes / 1e9, ctxs[0]);
        bprintf(&md,
                "Step: %s. Columns after `launches`: the same step as a graph + PDL with atomic "
                "split-K, deterministic, without PDL, eager (no graph), with the per-token readback, sampling.\n\n",
                "one CUDA graph per token (`qwen35 info --backend cuda` shows its schedule)");
        if (res->mlp_fused)
            bprintf(&md, "Fused MLP: ON in every column with atomic "
                         "split-K (not in `deterministic`); the same step with the two MLP GEMVs is listed below the "
                         "table.\n\n");
        bprintf(&md, "| ctx | ms/token | tok/s | GB/s | %% of read BW | launches | atomic | deterministic | no PDL | "
                     "eager | +readback | sampling |\n"
                     "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int c = 0; c < n_ctx; c++) {
            rq.ctx_len = ctxs[c];
            rq.ops = 0;
            if (c > 0 && q35_bench_decode(e, &rq, res, &err)) {
                cli_fail("bench", &err);
                goto done;
            }
            const double gbs = res->step_bytes / res->ms_token / 1e6;
            bprintf(&md, "| %d | %.4f | %.0f | %.0f | %.1f | %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", ctxs[c],
                    res->ms_token, 1e3 / res->ms_token, gbs, 100 * gbs / res->read_gbs, res->launches, res->ms_atomic,
                    res->ms_det, res->ms_nopdl, res->ms_eager, res->ms_sync, res->ms_sample);
            if (res->lm_screen)
                bprintf(&sc, "| %d | %.4f | %.4f | %+.1f | %.1f | %.2f |\n", ctxs[c], res->ms_token, res->ms_lm_full,
                        1e3 * (res->ms_token - res->ms_lm_full), res->screen_rows, res->screen_fallback);
            if (res->mlp_fused)
                bprintf(&fz, "| %d | %.4f (%d) | %.4f (%d) | %+.1f |\n", ctxs[c], res->ms_atomic, res->launches,
                        res->ms_mlp_unfused, res->launches_mlp_unfused, 1e3 * (res->ms_atomic - res->ms_mlp_unfused));
            bprintf(
                &js,
                "%s{\"ctx\":%d,\"ms_token\":%.5f,\"gbs\":%.1f,\"step_bytes\":%.0f,\"launches\":%d,\"ms_atomic\":%.5f,"
                "\"ms_det\":%.5f,\"ms_nopdl\":%.5f,\"ms_eager\":%.5f,\"ms_sync\":%.5f,\"ms_sample\":%.5f,"
                "\"copy_gbs\":%.1f,\"read_gbs\":%.1f,"
                "\"mlp_fused\":%d,\"ms_mlp_unfused\":%.5f,\"launches_mlp_unfused\":%d,\"lm_screen\":%d,"
                "\"ms_lm_full\":%.5f,\"screen_rows\":%.2f,\"screen_fallback\":%.3f}",
                c ? "," : "", ctxs[c], res->ms_token, gbs, res->step_bytes, res->launches, res->ms_atomic, res->ms_det,
                res->ms_nopdl, res->ms_eager, res->ms_sync, res->ms_sample, res->copy_gbs, res->read_gbs,
                res->mlp_fused, res->ms_mlp_unfused, res->launches_mlp_unfused, res->lm_screen, res->ms_lm_full,
                res->screen_rows, res->screen_fallback);
        }
        if (sc.n)
            bprintf(&md,
                    "\nLM head of the greedy step: its argmax through the quantized screen (the default in every "
                    "greedy column; the same id and value as the full head) vs the full "
                    "bf16 head (graph + PDL, atomic split-K, same run):\n\n"
                    "| ctx | screen ms/token | full head ms/token | screen - full, us | "
                    "rows recomputed per step | blocks per step computing all their rows |\n"
                    "|---|---|---|---|---|---|\n%s",
                    sc.s);
        if (fz.n)
            bprintf(&md,
                    "\nFused MLP vs the two MLP GEMVs (graph + PDL, atomic split-K, same run):\n\n"
                    "| ctx | fused ms/token (launches) | two GEMVs ms/token (launches) | fused - two GEMVs, us |\n"
                    "|---|---|---|---|\n%s",
                    fz.s);
        if (ops) { /* the per-op table of the first context, printed after the summary rows */
            rq.ctx_len = ctxs[0];
            rq.ops = 1;
            if (q35_bench_decode(e, &rq, res, &err)) {
                cli_fail("bench", &err);
                goto done;
            }
            ops_table(&md, res);
        }
        bprintf(&js, "]");
        if (prefill_bench(e, plens, n_plen, 1, ablate, &md, &js, res, NULL)) goto done; /* breakdown always */
        if (q35_reset(e, &err)) {
            cli_fail("bench", &err);
            goto done;
        }
    } else if (err.code != Q35_ERR_UNSUPPORTED) {
        cli_fail("bench", &err);
        goto done;
    } else {
        bprintf(&js, "]");
    }

    if (!dev) {
        if (ablate || trace_csv)
            fprintf(stderr, "qwen35: bench: note: --ablate / --trace-csv apply to the CUDA benches only\n");
        if (cpu_bench(e, ids, ctxs, n_ctx, plens, n_plen, n_gen, logits, &md, &js)) goto done;
    } else { /* the wall-clock q35_forward of one prompt beside the device timings */
        err.code = 0;
        double t0 = wall();
        if (q35_forward(e, ids, n_prompt, 0, logits, &err)) {
            cli_fail("bench", &err);
            goto done;
        }
        double t_prefill = wall() - t0;
        bprintf(&md,
                "\n| backend | prefill tokens | prefill ms (wall, q35_forward) | prefill tok/s |\n|---|---|---|---|\n"
                "| %s | %d | %.2f | %.1f |",
                q35_backend_name(e), n_prompt, 1e3 * t_prefill, n_prompt / t_prefill);
        bprintf(&js, ",\"prefill_tokens\":%d,\"prefill_ms\":%.3f", n_prompt, 1e3 * t_prefill);
    }
    bprintf(&md, "\n");
    bprintf(&js, "}\n");
    fputs(md.s, stdout);
    if (md_path || json) {
        const char *paths[2] = {md_path, json};
        const Buf *bufs[2] = {&md, &js};
        for (int i = 0; i < 2; i++) {
            if (!paths[i]) continue;
            FILE *f = fopen(paths[i], "w");
            if (!f || fputs(bufs[i]->s, f) < 0 || fclose(f)) {
                cli_error("bench", "cannot write %s", paths[i]);
                goto done;
            }
        }
    }
    rc = 0;
done:
    free(md.s);
    free(js.s);
    free(fz.s);
    free(sc.s);
    free(res);
    free(ids);
    free(logits);
    q35_engine_close(e);
    return rc;
}
