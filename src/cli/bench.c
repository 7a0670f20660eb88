/* bench.c — `qwen35 bench`: end-to-end prefill and decode speed through the public API,
 * printed as a markdown table and optionally written as JSON. */
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

int cmd_bench(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    cli_env_options(&o);
    int n_prompt = 128, n_gen = 16;
    const char *json = NULL, *md = NULL;
    for (int i = 0; i < argc; i++) {
        int k = cli_model_flag(&o, argc, argv, &i);
        if (k < 0) return 1;
        if (k) continue;
        const char *f = argv[i], *v;
        if (!(v = cli_value(argc, argv, &i))) return 1;
        int bad = 0;
        if (!strcmp(f, "--prompt-len")) bad = cli_int(f, v, 1, 1 << 20, &n_prompt);
        else if (!strcmp(f, "--gen")) bad = cli_int(f, v, 1, 1 << 20, &n_gen);
        else if (!strcmp(f, "--json")) json = v;
        else if (!strcmp(f, "--md")) md = v;
        else { fprintf(stderr, "qwen35 bench: unknown flag %s\n", f); return 1; }
        if (bad) return 1;
    }
    if (!o.max_seq) o.max_seq = n_prompt + n_gen + 1;
    Q35Engine *e;
    if (cli_open(&e, &o)) return 1;
    int V = q35_vocab_size(e), rc = 1;
    int *ids = malloc(sizeof(int) * (size_t)n_prompt);
    float *logits = malloc(sizeof(float) * (size_t)V);
    Q35Err err = {0};
    if (!ids || !logits) { fprintf(stderr, "qwen35 bench: out of memory\n"); goto done; }
    for (int i = 0; i < n_prompt; i++) ids[i] = (int)((1103515245u * (unsigned)i + 12345u) % 50000u);
    double t0 = wall();
    if (q35_forward(e, ids, n_prompt, 0, logits, &err)) { cli_fail(&err); goto done; }
    double t_prefill = wall() - t0;
    int id = 0;
    t0 = wall();
    for (int t = 0; t < n_gen; t++) {
        for (int j = 1; j < V; j++) if (logits[j] > logits[id]) id = j;
        if (q35_forward(e, &id, 1, 0, logits, &err)) { cli_fail(&err); goto done; }
    }
    double t_decode = (wall() - t0) / n_gen;
    char table[1024];
    snprintf(table, sizeof table,
             "| backend | prefill tokens | prefill s | prefill tok/s | decode ctx | decode ms/token | decode tok/s |\n"
             "|---|---|---|---|---|---|---|\n| %s | %d | %.3f | %.1f | %d | %.3f | %.2f |\n",
             q35_backend_name(e), n_prompt, t_prefill, n_prompt / t_prefill, n_prompt, 1e3 * t_decode,
             1.0 / t_decode);
    fputs(table, stdout);
    if (md) {
        FILE *f = fopen(md, "w");
        if (!f) { fprintf(stderr, "qwen35 bench: cannot write %s\n", md); goto done; }
        fputs(table, f);
        fclose(f);
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) { fprintf(stderr, "qwen35 bench: cannot write %s\n", json); goto done; }
        fprintf(f,
                "{\"backend\":\"%s\",\"prefill_tokens\":%d,\"prefill_s\":%.6f,\"prefill_tok_s\":%.3f,"
                "\"decode_ctx\":%d,\"decode_ms_per_token\":%.4f,\"decode_tok_s\":%.3f}\n",
                q35_backend_name(e), n_prompt, t_prefill, n_prompt / t_prefill, n_prompt, 1e3 * t_decode,
                1.0 / t_decode);
        fclose(f);
    }
    rc = 0;
done:
    free(ids);
    free(logits);
    q35_engine_close(e);
    return rc;
}
