/* serve.c — `qwen35 serve`: an OpenAI-compatible HTTP server (src/server/) over one engine in serve mode.
 * Flags -> engine + q35_serve_open -> scheduler thread -> HTTP daemon; then the main thread waits for SIGINT /
 * SIGTERM (blocked in every thread, taken by sigwait), stops accepting, cancels what runs and exits 0. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/sched.h"

/* "512M", "2G", "1048576" -> bytes; -1 if malformed. */
static long long parse_bytes(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0)) return -1;
    static const char units[] = "kmg";
    double mul = 1;
    const char *u = *end ? strchr(units, *end | 0x20) : NULL;
    if (u) {
        for (const char *x = units; x <= u; x++) mul *= 1024.0;
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
    }
    if (*end || v * mul > 9e18) return -1;
    return (long long)(v * mul);
}

static const char *base_name(const char *path) {
    const char *b = path;
    for (const char *p = path; *p; p++)
        if (*p == '/' && p[1]) b = p + 1;
    return b;
}

int cmd_serve(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    const char *host = "127.0.0.1", *api_key = NULL, *kv_memory = NULL, *name = NULL, *prefix_memory = NULL;
    const char *host_memory = NULL, *state_dtype = NULL, *kv_dtype = NULL;
    int port = 8000, max_seqs = 0, max_queue = 256, max_body_kb = 4096, step_tokens = 0, think = 0, quiet = 0;
    int device = 0, kv_block = 0, idle_spin_us = -1;
    float kv_fraction = 0;
    const CliFlag own[] = {
        {"--host", NULL, CLI_STR, &host, .arg = "ADDR", .help = "address to listen on (default 127.0.0.1)"},
        {"--port", NULL, CLI_INT, &port, .lo = 0, .hi = 65535, .arg = "N",
         .help = "port (default 8000; 0: any free port, printed at start)"},
        {"--api-key", NULL, CLI_STR, &api_key, .arg = "KEY", .help = "require 'Authorization: Bearer KEY' on /v1/"},
        {"--served-model-name", NULL, CLI_STR, &name, .arg = "NAME",
         .help = "the model's name in the API (default: the model directory's name)"},
        {"--device", NULL, CLI_INT, &device, .lo = 0, .hi = 1024, .arg = "N", .help = "CUDA device index (default 0)"},
        {"--max-seqs", NULL, CLI_INT, &max_seqs, .lo = 0, .hi = 4096, .arg = "N",
         .help = "sequences decoded together (default 64, capped by memory)"},
        {"--kv-memory", NULL, CLI_STR, &kv_memory, .arg = "BYTES",
         .help = "memory for KV blocks and sequence states, e.g. 2G or 512M"},
        {"--kv-fraction", NULL, CLI_FLOAT, &kv_fraction, .lo = 0, .hi = 1, .lo_open = 1, .arg = "F",
         .help = "... or this fraction of the free memory (default 0.9 GPU, 0.25 CPU)"},
        {"--kv-block", NULL, CLI_INT, &kv_block, .lo = 1, .hi = 4096, .arg = "N", .help = "tokens per KV block (16)"},
        {"--prefix-cache-memory", NULL, CLI_STR, &prefix_memory, .arg = "BYTES",
         .help = "prefix cache: DeltaNet snapshots + cached KV blocks, e.g. 1G; 0 = off (default a quarter of the KV "
                 "memory)"},
        {"--prefix-cache-host-memory", NULL, CLI_STR, &host_memory, .arg = "BYTES",
         .help = "prefix cache: host memory for snapshots moved out of the full device tier, e.g. 4G; 0 = off "
                 "(default min(4G, a quarter of the RAM) on a GPU, off on the CPU)"},
        {"--state-dtype", NULL, CLI_STR, &state_dtype, .arg = "float32|bfloat16",
         .help = "DeltaNet recurrent states of the served sequences (default float32; bfloat16: half their bytes, "
                 "faster large batches, slightly different numerics)"},
        {"--kv-cache-dtype", NULL, CLI_STR, &kv_dtype, .arg = "auto|bfloat16|fp8",
         .help = "K and V of the served sequences (default auto = bfloat16; fp8 (or fp8_e4m3): e4m3 values, no scale, "
                 "half the bytes: twice the tokens in the same memory, coarser numerics)"},
        {"--max-queue", NULL, CLI_INT, &max_queue, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "requests waiting for a slot before 429 (default 256)"},
        {"--max-body-kb", NULL, CLI_INT, &max_body_kb, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "largest request body in KiB before 413 (default 4096)"},
        {"--step-tokens", NULL, CLI_INT, &step_tokens, .lo = 1, .hi = 1 << 20, .arg = "N",
         .help = "tokens per engine step: prompt chunks + decodes (default 2048 on a GPU, 512 on the CPU)"},
        {"--idle-spin-us", NULL, CLI_INT, &idle_spin_us, .lo = 0, .hi = 1000000, .arg = "N",
         .help = "an idle scheduler polls for requests this long before it sleeps (default 20000 on a GPU, 0 on "
                 "the CPU; 0 = sleep at once)"},
        {"--think", NULL, CLI_BOOL, &think,
         .help = "chat requests think by default (else only with chat_template_kwargs.enable_thinking)"},
        {"--quiet", NULL, CLI_BOOL, &quiet, .help = "no log line per request"},
        {0}};
    const CliGroup groups[] = {{"serve flags", own}, {"model flags", m.flags}, {0}};
    const CliSpec spec = {"serve", "--model DIR | --dummy NAME [flags]",
                          "OpenAI-compatible HTTP server: POST /v1/chat/completions, /v1/completions; GET /v1/models, "
                          "/health,\n/metrics (docs/SERVE.md). SIGINT / SIGTERM stop it.",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    int rc = cli_model_check("serve", &m);
    if (rc) return rc;
    long long kv_bytes = 0;
    if (kv_memory && (kv_bytes = parse_bytes(kv_memory)) <= 0)
        return cli_usage_error("serve", "--kv-memory: '%s' is not a size (e.g. 2G, 512M, 1048576)", kv_memory);
    long long prefix_bytes = 0;
    if (prefix_memory && strcmp(prefix_memory, "0") && (prefix_bytes = parse_bytes(prefix_memory)) <= 0)
        return cli_usage_error("serve", "--prefix-cache-memory: '%s' is not a size (e.g. 1G, 256M, 0 = off)",
                               prefix_memory);
    long long host_bytes = 0;
    if (host_memory && strcmp(host_memory, "0") && (host_bytes = parse_bytes(host_memory)) <= 0)
        return cli_usage_error("serve", "--prefix-cache-host-memory: '%s' is not a size (e.g. 4G, 512M, 0 = off)",
                               host_memory);
    if (state_dtype && strcmp(state_dtype, "float32") && strcmp(state_dtype, "bfloat16"))
        return cli_usage_error("serve", "--state-dtype: '%s' is not float32 or bfloat16", state_dtype);
    const int kv_fp8 = kv_dtype && (!strcmp(kv_dtype, "fp8") || !strcmp(kv_dtype, "fp8_e4m3"));
    if (kv_dtype && !kv_fp8 && strcmp(kv_dtype, "auto") && strcmp(kv_dtype, "bfloat16"))
        return cli_usage_error("serve", "--kv-cache-dtype: '%s' is not auto, bfloat16, fp8 or fp8_e4m3", kv_dtype);
    m.o.device = device;

    /* SIGINT / SIGTERM go to sigwait below; every thread started from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    Q35Engine *e;
    if ((rc = cli_open("serve", &e, &m))) return rc;
    cli_note("serve", e);
    Q35Err err = {0};
    Q35ServeOptions so = {.max_seqs = max_seqs,
                          .kv_bytes = (size_t)kv_bytes,
                          .kv_fraction = kv_fraction,
                          .kv_block = kv_block,
                          .prefix_bytes = (size_t)prefix_bytes,
                          .no_prefix_cache = prefix_memory && !strcmp(prefix_memory, "0"),
                          .prefix_host_bytes = (size_t)host_bytes,
                          .no_prefix_host = host_memory && !strcmp(host_memory, "0"),
                          .state_bf16 = state_dtype && !strcmp(state_dtype, "bfloat16"),
                          .kv_fp8 = kv_fp8};
    if (q35_serve_open(e, &so, &err)) {
        q35_engine_close(e);
        return cli_fail("serve", &err);
    }
    if (!q35_engine_tokenizer(e)) fprintf(stderr, "qwen35: serve: no tokenizer.json: only token-id prompts work\n");
    if (!name) name = m.o.model_dir ? base_name(m.o.model_dir) : m.o.dummy;

    Metrics metrics;
    metrics_init(&metrics, name);
    Sched *s = NULL;
    Http *h = NULL;
    /* Default budget: one pass of the CUDA batched step (2048 rows: a 1k prompt's first token in one step). A CPU
     * step costs seconds per thousand tokens, so there a smaller chunk keeps the running streams moving. */
    if (step_tokens == 0) step_tokens = strcmp(q35_backend_name(e), "cuda") ? 512 : 2048;
    if (idle_spin_us < 0) idle_spin_us = strcmp(q35_backend_name(e), "cuda") ? 0 : 20000;
    SchedConfig sc = {.max_queue = max_queue, .step_tokens = step_tokens, .quiet = quiet, .idle_spin_us = idle_spin_us};
    char msg[256];
    if (sched_open(&s, e, &sc, &metrics, &err)) {
        rc = cli_fail("serve", &err);
        goto done;
    }
    HttpConfig hc = {.host = host,
                     .port = port,
                     .api_key = api_key,
                     .max_body = (size_t)max_body_kb * 1024,
                     .model = name,
                     .think = think ? Q35_THINK_ON : Q35_THINK_OFF,
                     .max_connections = 1024,
                     .quiet = quiet};
    if (http_start(&h, &hc, e, s, &metrics, msg, sizeof msg)) {
        rc = cli_error("serve", "%s", msg);
        goto done;
    }
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    int ctx = sched_max_context(s);
    long long fit = in.kv_block > 0 ? (long long)in.n_blocks * in.kv_block / (ctx > 0 ? ctx : 1) : 0;
    fprintf(stderr,
            "qwen35 serve: %s on %s; %d sequences at once, KV pool %d blocks x %d tokens (%.1f MiB): %lld "
            "sequences of the full context %d fit, %d tokens in all; KV cache %s; DeltaNet states %s, %.2f MiB a "
            "sequence\n",
            name, q35_backend_name(e), in.max_seqs, in.n_blocks, in.kv_block,
            ((double)in.n_blocks * (double)in.block_bytes + (double)in.max_seqs * (double)in.slot_bytes) / 1048576.0,
            fit, ctx, in.n_blocks * in.kv_block, in.kv_fp8 ? "fp8 e4m3" : "bfloat16",
            in.state_bf16 ? "bfloat16" : "float32", (double)in.slot_bytes / 1048576.0);
    if (in.prefix_bytes)
        fprintf(stderr,
                "qwen35 serve: prefix cache %.1f MiB: %d DeltaNet snapshots of %.2f MiB, up to %d cached KV blocks; "
                "host tier %d snapshots (%.1f MiB)\n",
                (double)in.prefix_bytes / 1048576.0, in.prefix_snaps, (double)in.slot_bytes / 1048576.0,
                in.prefix_max_blocks, in.prefix_host_snaps,
                (double)in.prefix_host_snaps * (double)in.slot_bytes / 1048576.0);
    else
        fprintf(stderr, "qwen35 serve: prefix cache off\n");
    fprintf(stderr, "qwen35 serve: listening on http://%s:%d\n", host, http_port(h));
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "qwen35 serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    http_quiesce(h);
    rc = 0;
done:
    sched_stop(s);       /* cancels what runs: every handler waiting on a request returns */
    http_drain(h, 2000); /* ... and writes its end (a stream its last events) before the connections close */
    http_stop(h);
    sched_close(s); /* after the last request was released */
    metrics_free(&metrics);
    q35_serve_close(e);
    q35_engine_close(e);
    return rc;
}
