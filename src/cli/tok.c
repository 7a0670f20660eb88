/* tok.c — the text subcommands of the qwen35 CLI:
 *   qwen35 tokenize   --model DIR (--text TEXT | --text-file F) [--jsonl]   ids, space-separated, one line
 *                     (--jsonl: every input line is a JSON string, tokenized alone, one output line each)
 *   qwen35 detokenize --model DIR --ids 1,2,3 [--skip-special]               the text
 *   qwen35 chat       --model DIR [--system S] [--think | --no-think] [-n N] [--stats] [--tokenizer DIR]
 *                     [sampling: --temp --top-k --top-p --min-p --presence-penalty --repetition-penalty
 *                     --seed --greedy] [engine flags of common.h: --backend --ctx --dummy ...]
 *                     interactive multi-turn chat: a user message per stdin line, the reply streamed; the
 *                     engine keeps the conversation, so each turn prefills only its new tokens.
 * Errors are one line on stderr ("qwen35: ...") and a non-zero exit code. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../tokenizer.h" /* tokenizer_json_string: --jsonl lines may hold \u0000, which cJSON cannot */
#include "cli.h"
#include "common.h"
#include "qwen35.h"

static int fail(const char *cmd, const char *msg) {
    fprintf(stderr, "qwen35: %s: %s\n", cmd, msg);
    return 1;
}
static int fail_err(const char *cmd, const Q35Err *err) { return fail(cmd, err->msg); }

/* argv[*i] is a flag that needs a value: returns it (advancing *i) or NULL after printing an error. */
static const char *value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "qwen35: %s: %s needs a value\n", cmd, argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

static int load_tok(const char *cmd, const char *model, Q35Tokenizer **t) {
    Q35Err err = {0};
    if (!model) return fail(cmd, "--model DIR is required");
    if (q35_tokenizer_load(t, model, &err)) return fail_err(cmd, &err);
    return 0;
}

static void print_ids(FILE *f, const int *ids, int n) {
    for (int i = 0; i < n; i++) fprintf(f, i ? " %d" : "%d", ids[i]);
    fputc('\n', f);
}

/* --jsonl: each line of data is one JSON string literal (surrounding blanks allowed). */
static int tokenize_jsonl(const Q35Tokenizer *t, char *data, size_t len) {
    size_t pos = 0;
    int line = 0;
    while (pos < len) {
        char *s = data + pos, *e = memchr(s, '\n', len - pos);
        size_t n = e ? (size_t)(e - s) : len - pos;
        pos += n + 1;
        line++;
        s[n] = 0;
        while (*s == ' ' || *s == '\t') s++;
        char *str;
        size_t slen;
        const char *end;
        if (tokenizer_json_string(s, &str, &slen, &end)) {
            fprintf(stderr, "qwen35: tokenize: line %d: not a JSON string\n", line);
            return 1;
        }
        while (*end == ' ' || *end == '\t' || *end == '\r') end++;
        int *ids = NULL, nid = 0, rc = 0;
        Q35Err err = {0};
        if (*end) rc = err_set(&err, Q35_ERR_FORMAT, "text after the JSON string");
        else rc = q35_tokenize(t, str, slen, &ids, &nid, &err);
        free(str);
        if (rc) {
            fprintf(stderr, "qwen35: tokenize: line %d: %s\n", line, err.msg);
            return 1;
        }
        print_ids(stdout, ids, nid);
        free(ids);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int jsonl = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) { if (!(model = value("tokenize", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--text")) { if (!(text = value("tokenize", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--text-file")) { if (!(file = value("tokenize", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--jsonl")) jsonl = 1;
        else { fprintf(stderr, "qwen35: tokenize: unknown flag '%s'\n", a); return 2; }
    }
    if (!text == !file) return fail("tokenize", "give exactly one of --text TEXT or --text-file FILE");
    Q35Tokenizer *t;
    if (load_tok("tokenize", model, &t)) return 1;
    char *data = NULL;
    size_t len;
    Q35Err err = {0};
    int rc = 0;
    if (file) {
        if (read_file(file, &data, &len, &err)) rc = fail_err("tokenize", &err);
    } else {
        len = strlen(text);
        if (!(data = malloc(len + 1))) rc = fail("tokenize", "out of memory");
        else memcpy(data, text, len + 1);
    }
    if (!rc && jsonl) {
        rc = tokenize_jsonl(t, data, len);
    } else if (!rc) {
        int *ids, n;
        if (q35_tokenize(t, data, len, &ids, &n, &err)) rc = fail_err("tokenize", &err);
        else {
            print_ids(stdout, ids, n);
            free(ids);
        }
    }
    free(data);
    q35_tokenizer_free(t);
    return rc;
}

/* Parses "1,2,3" (commas and/or blanks) into a malloc'ed list. */
static int parse_ids(const char *s, int **ids, int *n) {
    size_t cap = strlen(s) / 2 + 2;
    *ids = malloc(cap * sizeof **ids);
    *n = 0;
    if (!*ids) return fail("detokenize", "out of memory");
    const char *p = s;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 0x7fffffff || (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
            fprintf(stderr, "qwen35: detokenize: bad id '%.20s' in --ids\n", p);
            free(*ids);
            return 1;
        }
        (*ids)[(*n)++] = (int)v;
        p = end;
    }
    return 0;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL, *list = NULL;
    int skip = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model")) { if (!(model = value("detokenize", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--ids")) { if (!(list = value("detokenize", argc, argv, &i))) return 2; }
        else if (!strcmp(a, "--skip-special")) skip = 1;
        else { fprintf(stderr, "qwen35: detokenize: unknown flag '%s'\n", a); return 2; }
    }
    if (!list) return fail("detokenize", "--ids 1,2,3 is required");
    int *ids, n;
    if (parse_ids(list, &ids, &n)) return 1;
    Q35Tokenizer *t;
    if (load_tok("detokenize", model, &t)) { free(ids); return 1; }
    /* through the streaming decoder: exact bytes, even a U+0000 */
    Q35Detok *d;
    Q35Err err = {0};
    int rc = q35_detok_open(&d, t, skip, &err);
    for (int i = 0; !rc && i <= n; i++) {
        const char *s;
        size_t len;
        if (i < n) rc = q35_detok_push(d, ids[i], &s, &len, &err);
        else q35_detok_flush(d, &s, &len);
        if (!rc) fwrite(s, 1, len, stdout);
    }
    if (rc) fail_err("detokenize", &err);
    else fputc('\n', stdout);
    q35_detok_close(d);
    q35_tokenizer_free(t);
    free(ids);
    return rc ? 1 : 0;
}

/* ---- chat ---- */

typedef struct ChatStream {
    Q35Detok *detok;
    int last;
    int failed;
    Q35Err err; /* why the stream failed */
} ChatStream;

static int on_token(void *user, int id) {
    ChatStream *cs = user;
    const char *s;
    size_t n;
    cs->last = id;
    if (q35_detok_push(cs->detok, id, &s, &n, &cs->err)) { cs->failed = 1; return 1; }
    fwrite(s, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* The ids of one turn. First turn: [system] + user + generation prompt. Later turns continue the
 * sequence: the previous reply's last id (sampled, not yet fed), the close of that reply if the model did
 * not end it, then this user turn and the generation prompt. */
static int turn_ids(const Q35Tokenizer *t, const char *sys, const char *user, int think, int first, int last_id,
                    int **ids, int *n, Q35Err *err) {
    Q35ChatMessage m[2];
    int k = 0;
    if (first && sys) m[k++] = (Q35ChatMessage){"system", sys, NULL};
    m[k++] = (Q35ChatMessage){"user", user, NULL};
    char *r;
    int rc = q35_chat_render(t, m, k, 1, think, &r, err);
    if (rc) return rc;
    int im_end = q35_token_id(t, "<|im_end|>");
    const char *close = first ? "" : last_id == im_end && im_end >= 0 ? "\n" : "<|im_end|>\n";
    size_t cl = strlen(close), rl = strlen(r);
    char *text = malloc(cl + rl + 1);
    if (!text) { free(r); return err_set(err, Q35_ERR_OOM, "out of memory"); }
    memcpy(text, close, cl);
    memcpy(text + cl, r, rl + 1);
    free(r);
    int *body, nb;
    rc = q35_tokenize(t, text, cl + rl, &body, &nb, err);
    free(text);
    if (rc) return rc;
    int lead = !first && last_id >= 0;
    *ids = malloc((size_t)(nb + 1) * sizeof **ids);
    if (!*ids) { free(body); return err_set(err, Q35_ERR_OOM, "out of memory"); }
    if (lead) (*ids)[0] = last_id;
    memcpy(*ids + lead, body, (size_t)nb * sizeof *body);
    *n = nb + lead;
    free(body);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    Q35Options o;
    q35_options_init(&o);
    cli_env_options(&o);
    const char *sys = NULL, *tok_dir = NULL;
    int think = Q35_THINK_DEFAULT, max_new = 2048, stats = 0;
    SamplingFlags sf;
    cli_sampling_init(&sf);
    for (int i = 0; i < argc; i++) {
        int k = cli_model_flag(&o, argc, argv, &i);
        if (!k) k = cli_sampling_flag(&sf, argc, argv, &i);
        if (k < 0) return 1;
        if (k) continue;
        const char *a = argv[i], *x = NULL;
        if (!strcmp(a, "--think")) { think = Q35_THINK_ON; continue; }
        if (!strcmp(a, "--no-think")) { think = Q35_THINK_OFF; continue; }
        if (!strcmp(a, "--stats")) { stats = 1; continue; }
        if (!(x = cli_value(argc, argv, &i))) return 1;
        int bad = 0;
        if (!strcmp(a, "--system")) sys = x;
        else if (!strcmp(a, "--tokenizer")) tok_dir = x;
        else if (!strcmp(a, "-n") || !strcmp(a, "--max-tokens")) bad = cli_int(a, x, 1, 1 << 24, &max_new);
        else { fprintf(stderr, "qwen35: chat: unknown flag '%s'\n", a); return 1; }
        if (bad) return 1;
    }
    if (!o.model_dir && !o.dummy) return fail("chat", "--model DIR is required");
    Q35Engine *e;
    Q35Err err = {0};
    if (cli_open(&e, &o)) return 1;
    /* the model's tokenizer; --tokenizer DIR supplies one (e.g. for --dummy weights) */
    Q35Tokenizer *own = NULL, *t = q35_engine_tokenizer(e);
    if (tok_dir) {
        if (q35_tokenizer_load(&own, tok_dir, &err)) { q35_engine_close(e); return fail_err("chat", &err); }
        t = own;
    }
    if (!t) { q35_engine_close(e); return fail("chat", "no tokenizer.json in the model directory (or give --tokenizer DIR)"); }
    Q35Sampling s;
    cli_sampling_apply(&sf, e, &s);
    ChatStream cs = {0};
    int rc = q35_detok_open(&cs.detok, t, 1, &err) ? fail_err("chat", &err) : 0;
    int first = 1, tty = isatty(0);
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while (!rc) {
        if (tty) fputs("> ", stderr);
        if ((got = getline(&line, &cap, stdin)) < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!got) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) { first = 1; continue; }
        int *ids, n;
        if (turn_ids(t, sys, line, think, first, cs.last, &ids, &n, &err)) {
            fprintf(stderr, "qwen35: chat: %s\n", err.msg); /* e.g. invalid UTF-8: skip the line */
            continue;
        }
        if (first && q35_reset(e, &err)) { free(ids); rc = fail_err("chat", &err); break; }
        Q35GenStats st;
        cs.last = -1;
        int g = q35_generate(e, ids, n, max_new, &s, on_token, &cs, &st, &err);
        free(ids);
        if (g == Q35_ERR_CONTEXT && !first) { /* the conversation is full: start over with this message */
            fprintf(stderr, "qwen35: chat: context full at %d tokens; starting a new conversation\n", q35_position(e));
            first = 1;
            if (turn_ids(t, sys, line, think, 1, -1, &ids, &n, &err) || q35_reset(e, &err)) { rc = fail_err("chat", &err); break; }
            g = q35_generate(e, ids, n, max_new, &s, on_token, &cs, &st, &err);
            free(ids);
        }
        if (g || cs.failed) { rc = fail_err("chat", g ? &err : &cs.err); break; }
        const char *tail;
        size_t tl;
        q35_detok_flush(cs.detok, &tail, &tl);
        fwrite(tail, 1, tl, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        if (stats)
            fprintf(stderr, "[prefill %d tokens %.1f ms, %d generated %.1f tok/s, position %d]\n", st.n_prompt,
                    st.prefill_s * 1e3, st.n_generated, st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0,
                    q35_position(e));
        first = 0;
    }
    free(line);
    q35_detok_close(cs.detok);
    q35_tokenizer_free(own);
    q35_engine_close(e);
    return rc;
}
