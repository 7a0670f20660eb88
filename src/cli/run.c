/* run.c — `run` (generate), `logits` (raw float32 logits for harnesses), `info`, `bench`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"

typedef struct RunState {
    int print_ids, n;
    Q35Detok *detok; /* streaming detokenizer: holds back incomplete UTF-8 */
} RunState;

static int on_token(void *user, int id) {
    RunState *r = user;
    if (r->print_ids) {
        printf("%s%d", r->n++ ? " " : "", id);
        fflush(stdout);
        return 0;
    }
    const char *text;
    size_t len;
    Q35Err err = {0};
    if (q35_detok_push(r->detok, id, &text, &len, &err)) return 1;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int cmd_run(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    cli_env_options(&o);
    const char *prompt = NULL, *ids_s = NULL;
    int n_new = 64, print_ids = 0, quiet = 0;
    SamplingFlags sf;
    cli_sampling_init(&sf);
    for (int i = 0; i < argc; i++) {
        int k = cli_model_flag(&o, argc, argv, &i);
        if (!k) k = cli_sampling_flag(&sf, argc, argv, &i);
        if (k < 0) return 1;
        if (k) continue;
        const char *f = argv[i], *v = NULL;
        if (!strcmp(f, "--print-ids")) { print_ids = 1; continue; }
        if (!strcmp(f, "--quiet")) { quiet = 1; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 1;
        int bad = 0;
        if (!strcmp(f, "--prompt")) prompt = v;
        else if (!strcmp(f, "--ids")) ids_s = v;
        else if (!strcmp(f, "-n")) bad = cli_int(f, v, 0, 1 << 24, &n_new);
        else { fprintf(stderr, "qwen35 run: unknown flag %s\n", f); return 1; }
        if (bad) return 1;
    }
    if (!!prompt == !!ids_s) {
        fprintf(stderr, "qwen35 run: give exactly one of --prompt TEXT or --ids 1,2,3\n");
        return 1;
    }
    Q35Engine *e;
    if (cli_open(&e, &o)) return 1;
    Q35Err err = {0};
    int *ids = NULL, n = 0, rc = 1;
    Q35Tokenizer *tok = q35_engine_tokenizer(e);
    if (prompt) {
        if (!tok) {
            fprintf(stderr, "qwen35 run: --prompt needs tokenizer.json in the model directory (use --ids)\n");
            goto done;
        }
        if (q35_tokenize(tok, prompt, strlen(prompt), &ids, &n, &err)) { cli_fail(&err); goto done; }
        if (n == 0) { fprintf(stderr, "qwen35 run: the prompt encodes to no tokens\n"); goto done; }
    } else if (cli_parse_ids(ids_s, &ids, &n)) {
        goto done;
    }
    if (!print_ids && !tok) {
        fprintf(stderr, "qwen35 run: no tokenizer.json: printing ids\n");
        print_ids = 1;
    }
    Q35Sampling s;
    cli_sampling_apply(&sf, e, &s);
    RunState st = {print_ids, 0, NULL};
    if (!print_ids && q35_detok_open(&st.detok, tok, 0, &err)) { cli_fail(&err); goto done; }
    Q35GenStats gs;
    int grc = q35_generate(e, ids, n, n_new, &s, on_token, &st, &gs, &err);
    if (st.detok) {
        const char *text;
        size_t len;
        q35_detok_flush(st.detok, &text, &len);
        fwrite(text, 1, len, stdout);
        q35_detok_close(st.detok);
    }
    printf("\n");
    fflush(stdout); /* before the timing line on stderr */
    if (grc) { cli_fail(&err); goto done; }
    if (!quiet)
        fprintf(stderr, "[%s] prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.2f tok/s)\n",
                q35_backend_name(e), gs.n_prompt, gs.prefill_s, gs.n_prompt / (gs.prefill_s + 1e-12), gs.n_generated,
                gs.decode_s, gs.n_generated > 1 ? (gs.n_generated - 1) / (gs.decode_s + 1e-12) : 0.0);
    rc = 0;
done:
    free(ids);
    q35_engine_close(e);
    return rc;
}

int cmd_logits(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    cli_env_options(&o);
    const char *ids_s = NULL, *out = NULL, *mode = "prefill";
    int last = 0; /* --last: only the last position's row (prefill: one forward with last-row logits) */
    for (int i = 0; i < argc; i++) {
        int k = cli_model_flag(&o, argc, argv, &i);
        if (k < 0) return 1;
        if (k) continue;
        const char *f = argv[i], *v;
        if (!strcmp(f, "--last")) { last = 1; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 1;
        if (!strcmp(f, "--ids")) ids_s = v;
        else if (!strcmp(f, "--out")) out = v;
        else if (!strcmp(f, "--mode")) mode = v;
        else { fprintf(stderr, "qwen35 logits: unknown flag %s\n", f); return 1; }
    }
    if (!ids_s || !out) {
        fprintf(stderr, "qwen35 logits: needs --ids 1,2,3 and --out FILE\n");
        return 1;
    }
    int decode = !strcmp(mode, "decode");
    if (!decode && strcmp(mode, "prefill")) {
        fprintf(stderr, "qwen35 logits: --mode must be prefill or decode (got '%s')\n", mode);
        return 1;
    }
    int *ids, n;
    if (cli_parse_ids(ids_s, &ids, &n)) return 1;
    Q35Engine *e;
    if (cli_open(&e, &o)) { free(ids); return 1; }
    int V = q35_vocab_size(e), rc = 1, rows = last ? 1 : n;
    float *logits = malloc(sizeof(float) * (size_t)rows * (size_t)V);
    Q35Err err = {0};
    FILE *f = NULL;
    if (!logits) { fprintf(stderr, "qwen35 logits: out of memory\n"); goto done; }
    if (decode) {
        for (int t = 0; t < n; t++)
            if (q35_forward(e, ids + t, 1, 1, logits + (last ? 0 : (size_t)t * V), &err)) { cli_fail(&err); goto done; }
    } else if (q35_forward(e, ids, n, !last, logits, &err)) {
        cli_fail(&err);
        goto done;
    }
    f = fopen(out, "wb");
    if (!f || fwrite(logits, sizeof(float) * (size_t)V, (size_t)rows, f) != (size_t)rows || fclose(f) != 0) {
        fprintf(stderr, "qwen35 logits: cannot write %s\n", out);
        f = NULL;
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) fclose(f);
    free(logits);
    free(ids);
    q35_engine_close(e);
    return rc;
}

int cmd_info(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    o.backend = "cpu";
    for (int i = 0; i < argc; i++) {
        int k = cli_model_flag(&o, argc, argv, &i);
        if (k < 0) return 1;
        if (!k) { fprintf(stderr, "qwen35 info: unknown flag %s\n", argv[i]); return 1; }
    }
    o.max_seq = o.max_seq ? o.max_seq : 16;
    Q35Engine *e;
    if (cli_open(&e, &o)) return 1;
    static char buf[8192];
    q35_engine_describe(e, buf, sizeof buf);
    fputs(buf, stdout);
    q35_engine_close(e);
    return 0;
}
