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

/* Run-time checks of an id list against the model's vocabulary (the parser only knows it is non-negative). */
static int check_vocab(const char *cmd, const CliIds *ids, const Q35Engine *e) {
    int V = q35_vocab_size(e);
    for (int i = 0; i < ids->n; i++)
        if (ids->v[i] >= V) return cli_error(cmd, "--ids: id %d out of range (vocabulary of %d ids)", ids->v[i], V);
    return 0;
}

int cmd_run(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    SamplingFlags sf;
    cli_sampling_init(&sf);
    const char *prompt = NULL;
    CliIds ids = {0};
    int n_new = 64, print_ids = 0, quiet = 0;
    const CliFlag own[] = {
        {"--prompt", NULL, CLI_STR, &prompt, .arg = "TEXT", .help = "the prompt (needs tokenizer.json)"},
        {"--ids", NULL, CLI_IDS, &ids, .lo = 0, .hi = 2147483647, .arg = "1,2,3", .help = "the prompt as token ids"},
        {"-n", "--max-tokens", CLI_INT, &n_new, .lo = 0, .hi = 1 << 24, .arg = "N",
         .help = "tokens to generate at most (default 64)"},
        {"--print-ids", NULL, CLI_BOOL, &print_ids, .help = "print the generated ids instead of text"},
        {"--quiet", NULL, CLI_BOOL, &quiet, .help = "no timing line on stderr"},
        {0}};
    const CliGroup groups[] = {{"run flags", own}, {"sampling flags", sf.flags}, {"model flags", m.flags}, {0}};
    const CliSpec spec = {"run", "--model DIR | --dummy NAME  (--prompt TEXT | --ids 1,2,3) [flags]",
                          "Generates text after a prompt; the text goes to stdout, timings to stderr. Stopping at the "
                          "end of the\ncontext (--ctx) is said on stderr.",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) {
        cli_ids_free(&ids);
        return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    }
    int rc = cli_model_check("run", &m);
    if (!rc && !!prompt == !!ids.v) rc = cli_usage_error("run", "give exactly one of --prompt TEXT or --ids 1,2,3");
    if (rc) {
        cli_ids_free(&ids);
        return rc;
    }
    Q35Engine *e;
    if ((rc = cli_open("run", &e, &m))) {
        cli_ids_free(&ids);
        return rc;
    }
    Q35Err err = {0};
    int *tids = NULL, n = 0;
    rc = CLI_EXIT_RUNTIME;
    Q35Tokenizer *tok = q35_engine_tokenizer(e);
    if (prompt) {
        if (!tok) {
            cli_error("run", "--prompt needs tokenizer.json in the model directory (or give --ids)");
            goto done;
        }
        if (q35_tokenize(tok, prompt, strlen(prompt), &tids, &n, &err)) {
            cli_fail("run", &err);
            goto done;
        }
        if (n == 0) {
            cli_error("run", "the prompt encodes to no tokens");
            goto done;
        }
    } else {
        if (check_vocab("run", &ids, e)) goto done;
        tids = ids.v, n = ids.n, ids.v = NULL;
    }
    if (n > q35_context_size(e)) {
        cli_error("run", "the prompt (%d tokens) does not fit the context of %d tokens (--ctx)", n,
                  q35_context_size(e));
        goto done;
    }
    /* everything is checked: the notes now */
    cli_note("run", e);
    if (!print_ids && !tok) {
        fprintf(stderr, "qwen35: run: note: no tokenizer.json in the model directory: printing ids\n");
        print_ids = 1;
    }
    Q35Sampling s;
    cli_sampling_apply(&sf, e, &s);
    RunState st = {print_ids, 0, NULL};
    if (!print_ids && q35_detok_open(&st.detok, tok, 0, &err)) {
        cli_fail("run", &err);
        goto done;
    }
    Q35GenStats gs = {0};
    int grc = q35_generate(e, tids, n, n_new, &s, on_token, &st, &gs, &err);
    if (st.detok) {
        const char *text;
        size_t len;
        q35_detok_flush(st.detok, &text, &len);
        fwrite(text, 1, len, stdout);
        q35_detok_close(st.detok);
    }
    printf("\n");
    fflush(stdout); /* before the lines on stderr */
    if (grc) {
        cli_fail("run", &err);
        goto done;
    }
    if (gs.stop_reason == 3)
        fprintf(stderr,
                "qwen35: run: note: stopped at the end of the context (%d tokens, --ctx) after %d generated "
                "tokens\n",
                q35_context_size(e), gs.n_generated);
    if (!quiet)
        fprintf(stderr, "[%s] prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.2f tok/s)\n",
                q35_backend_name(e), gs.n_prompt, gs.prefill_s, gs.n_prompt / (gs.prefill_s + 1e-12), gs.n_generated,
                gs.decode_s, gs.n_generated > 1 ? (gs.n_generated - 1) / (gs.decode_s + 1e-12) : 0.0);
    rc = 0;
done:
    free(tids);
    cli_ids_free(&ids);
    q35_engine_close(e);
    return rc;
}

int cmd_logits(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    const char *out = NULL, *mode = "prefill";
    CliIds ids = {0};
    int last = 0; /* --last: only the last position's row (prefill: one forward with last-row logits) */
    const CliFlag own[] = {
        {"--ids", NULL, CLI_IDS, &ids, .lo = 0, .hi = 2147483647, .arg = "1,2,3", .help = "the token ids (required)"},
        {"--out", NULL, CLI_STR, &out, .arg = "FILE", .help = "where the float32 logits go (required)"},
        {"--mode", NULL, CLI_STR, &mode, .arg = "M",
         .help = "prefill (one forward over all ids, default) | decode (one id at a time)"},
        {"--last", NULL, CLI_BOOL, &last, .help = "only the last position's row"},
        {0}};
    const CliGroup groups[] = {{"logits flags", own}, {"model flags", m.flags}, {0}};
    const CliSpec spec = {"logits", "--model DIR | --dummy NAME  --ids 1,2,3 --out FILE [flags]",
                          "Writes the raw float32 logits [n x vocab] (n = 1 with --last) of the ids to FILE.", groups,
                          0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) {
        cli_ids_free(&ids);
        return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    }
    int rc = cli_model_check("logits", &m);
    if (!rc && (!ids.v || !out)) rc = cli_usage_error("logits", "needs --ids 1,2,3 and --out FILE");
    int decode = !strcmp(mode, "decode");
    if (!rc && !decode && strcmp(mode, "prefill"))
        rc = cli_usage_error("logits", "--mode must be prefill or decode (got '%s')", mode);
    if (rc) {
        cli_ids_free(&ids);
        return rc;
    }
    Q35Engine *e;
    if ((rc = cli_open("logits", &e, &m))) {
        cli_ids_free(&ids);
        return rc;
    }
    int V = q35_vocab_size(e), n = ids.n, rows = last ? 1 : n;
    rc = CLI_EXIT_RUNTIME;
    float *logits = NULL;
    Q35Err err = {0};
    FILE *f = NULL;
    if (check_vocab("logits", &ids, e)) goto done;
    if (n > q35_context_size(e)) {
        cli_error("logits", "%d ids do not fit the context of %d tokens (--ctx)", n, q35_context_size(e));
        goto done;
    }
    if (!(logits = malloc(sizeof(float) * (size_t)rows * (size_t)V))) {
        cli_error("logits", "out of memory");
        goto done;
    }
    cli_note("logits", e);
    if (decode) {
        for (int t = 0; t < n; t++)
            if (q35_forward(e, ids.v + t, 1, 1, logits + (last ? 0 : (size_t)t * V), &err)) {
                cli_fail("logits", &err);
                goto done;
            }
    } else if (q35_forward(e, ids.v, n, !last, logits, &err)) {
        cli_fail("logits", &err);
        goto done;
    }
    f = fopen(out, "wb");
    if (!f || fwrite(logits, sizeof(float) * (size_t)V, (size_t)rows, f) != (size_t)rows || fclose(f) != 0) {
        cli_error("logits", "cannot write %s", out);
        f = NULL;
        goto done;
    }
    f = NULL;
    rc = 0;
done:
    if (f) fclose(f);
    free(logits);
    cli_ids_free(&ids);
    q35_engine_close(e);
    return rc;
}

int cmd_info(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    m.o.backend = "cpu";
    const CliGroup groups[] = {{"model flags", m.flags}, {0}};
    const CliSpec spec = {"info", "--model DIR | --dummy NAME [flags]",
                          "Describes the model: architecture, layer kinds, parameters, dtypes, the model's own "
                          "maximum context\n(max_position_embeddings) and the context chosen (--ctx; default "
                          "min(4096, that maximum)).",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    int rc = cli_model_check("info", &m);
    if (rc) return rc;
    Q35Engine *e;
    if ((rc = cli_open("info", &e, &m))) return rc;
    cli_note("info", e);
    static char buf[8192];
    q35_engine_describe(e, buf, sizeof buf);
    fputs(buf, stdout);
    q35_engine_close(e);
    return 0;
}
