/* tok.c — the text subcommands of the qwen35 CLI: tokenize, detokenize and chat (their usage: qwen35 CMD --help).
 * chat is interactive and multi-turn: a user message per stdin line, the reply streamed; the engine keeps the
 * conversation, so each turn prefills only its new tokens. Errors are one line on stderr ("qwen35: CMD: ...")
 * and the exit codes of common.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../tokenizer.h" /* tokenizer_json_string: --jsonl lines may hold \u0000, which cJSON cannot */
#include "cli.h"
#include "common.h"
#include "qwen35.h"

static int load_tok(const char *cmd, const char *model, Q35Tokenizer **t) {
    Q35Err err = {0};
    if (q35_tokenizer_load(t, model, &err)) return cli_fail(cmd, &err);
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
            return cli_error("tokenize", "line %d: not a JSON string", line);
        }
        while (*end == ' ' || *end == '\t' || *end == '\r') end++;
        int *ids = NULL, nid = 0, rc = 0;
        Q35Err err = {0};
        if (*end)
            rc = err_set(&err, Q35_ERR_FORMAT, "text after the JSON string");
        else
            rc = q35_tokenize(t, str, slen, &ids, &nid, &err);
        free(str);
        if (rc) return cli_error("tokenize", "line %d: %s", line, err.msg);
        print_ids(stdout, ids, nid);
        free(ids);
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL;
    int jsonl = 0;
    const CliFlag own[] = {
        {"--model", NULL, CLI_STR, &model, .arg = "DIR", .help = "directory with tokenizer.json (required)"},
        {"--text", NULL, CLI_STR, &text, .arg = "TEXT", .help = "the text"},
        {"--text-file", NULL, CLI_STR, &file, .arg = "FILE", .help = "the text from a file"},
        {"--jsonl", NULL, CLI_BOOL, &jsonl,
         .help = "every input line is a JSON string, tokenized alone, one output line each"},
        {0}};
    const CliGroup groups[] = {{"tokenize flags", own}, {0}};
    const CliSpec spec = {"tokenize", "--model DIR (--text TEXT | --text-file FILE) [--jsonl]",
                          "Prints the token ids of the text, space-separated, on one line.", groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    if (!model) return cli_usage_error("tokenize", "--model DIR is required");
    if (!text == !file) return cli_usage_error("tokenize", "give exactly one of --text TEXT or --text-file FILE");
    Q35Tokenizer *t;
    if (load_tok("tokenize", model, &t)) return 1;
    char *data = NULL;
    size_t len;
    Q35Err err = {0};
    int rc = 0;
    if (file) {
        if (read_file(file, &data, &len, &err)) rc = cli_fail("tokenize", &err);
    } else {
        len = strlen(text);
        if (!(data = malloc(len + 1)))
            rc = cli_error("tokenize", "out of memory");
        else
            memcpy(data, text, len + 1);
    }
    if (!rc && jsonl) {
        rc = tokenize_jsonl(t, data, len);
    } else if (!rc) {
        int *ids, n;
        if (q35_tokenize(t, data, len, &ids, &n, &err))
            rc = cli_fail("tokenize", &err);
        else {
            print_ids(stdout, ids, n);
            free(ids);
        }
    }
    free(data);
    q35_tokenizer_free(t);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *model = NULL;
    CliIds ids = {0};
    int skip = 0;
    const CliFlag own[] = {
        {"--model", NULL, CLI_STR, &model, .arg = "DIR", .help = "directory with tokenizer.json (required)"},
        {"--ids", NULL, CLI_IDS, &ids, .lo = 0, .hi = 2147483647, .arg = "1,2,3", .help = "the ids (required)"},
        {"--skip-special", NULL, CLI_BOOL, &skip, .help = "leave special tokens out"},
        {0}};
    const CliGroup groups[] = {{"detokenize flags", own}, {0}};
    const CliSpec spec = {"detokenize", "--model DIR --ids 1,2,3 [--skip-special]", "Prints the text of the ids.",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) {
        cli_ids_free(&ids);
        return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    }
    int rc = !model   ? cli_usage_error("detokenize", "--model DIR is required")
             : !ids.v ? cli_usage_error("detokenize", "--ids 1,2,3 is required")
                      : 0;
    if (rc) {
        cli_ids_free(&ids);
        return rc;
    }
    int n = ids.n;
    Q35Tokenizer *t;
    if (load_tok("detokenize", model, &t)) {
        cli_ids_free(&ids);
        return CLI_EXIT_RUNTIME;
    }
    /* through the streaming decoder: exact bytes, even a U+0000 */
    Q35Detok *d;
    Q35Err err = {0};
    rc = q35_detok_open(&d, t, skip, &err);
    for (int i = 0; !rc && i <= n; i++) {
        const char *s;
        size_t len;
        if (i < n)
            rc = q35_detok_push(d, ids.v[i], &s, &len, &err);
        else
            q35_detok_flush(d, &s, &len);
        if (!rc) fwrite(s, 1, len, stdout);
    }
    if (rc)
        cli_fail("detokenize", &err);
    else
        fputc('\n', stdout);
    q35_detok_close(d);
    q35_tokenizer_free(t);
    cli_ids_free(&ids);
    return rc ? CLI_EXIT_RUNTIME : 0;
}

/* ---- chat ---- */

typedef struct ChatStream {
    Q35Detok *detok;
    Q35ChatParser *parser; /* --tools: the reply parsed into content and calls */
    int in_call;           /* the last event printed was a call's arguments */
    int failed;
    Q35Err err; /* why the stream failed */
} ChatStream;

/* --tools: reasoning and content as they come, each call on its own line "[tool_call N id] name {args}". */
static int on_chat_event(void *user, const Q35ChatEvent *ev) {
    ChatStream *cs = user;
    if (cs->in_call && ev->type != Q35_CHAT_EV_TOOL_ARGS) fputc('\n', stdout);
    cs->in_call = ev->type == Q35_CHAT_EV_TOOL_START || ev->type == Q35_CHAT_EV_TOOL_ARGS;
    if (ev->type == Q35_CHAT_EV_TOOL_START)
        printf("\n[tool_call %d %s] %s ", ev->index, ev->id, ev->name);
    else
        fwrite(ev->text, 1, ev->len, stdout);
    fflush(stdout);
    return 0;
}

static int on_token(void *user, int id) {
    ChatStream *cs = user;
    const char *s;
    size_t n;
    if (q35_detok_push(cs->detok, id, &s, &n, &cs->err) ||
        (cs->parser && q35_chat_parser_push(cs->parser, s, n, on_chat_event, cs, &cs->err))) {
        cs->failed = 1;
        return 1;
    }
    if (!cs->parser) fwrite(s, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* The conversation so far, re-rendered through the template every turn; the serving engine's prefix cache resumes
 * it, so a turn computes only what differs from the cached tokens (docs/SERVE_ENGINE.md "Prefix cache"). */
typedef struct ChatConv {
    Q35ChatMessage *m;
    int n, cap;
} ChatConv;

static int conv_add(ChatConv *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 8;
        Q35ChatMessage *m = realloc(c->m, sizeof *m * (size_t)cap);
        if (!m) return Q35_ERR_OOM;
        c->m = m;
        c->cap = cap;
    }
    char *own = strdup(content);
    if (!own) return Q35_ERR_OOM;
    c->m[c->n++] = (Q35ChatMessage){.role = role, .content = own};
    return 0;
}

/* Drops the messages after the first keep. */
static void conv_cut(ChatConv *c, int keep) {
    while (c->n > keep) free((char *)c->m[--c->n].content);
}

typedef struct ChatTurn {
    int n_prompt, n_cached, n_generated, position;
    int length_stop, context_stop;
    double prefill_s, decode_s;
} ChatTurn;

static int is_stop(const int *stop, int n_stop, int id) {
    for (int i = 0; i < n_stop; i++)
        if (stop[i] == id) return 1;
    return 0;
}

/* One turn: the conversation rendered with the generation prompt, a sequence opened from the prefix cache, the
 * rest of the prompt fed in chunks that end at the snapshot points (recorded there for the next turns), then the
 * reply sampled until a stop id, max_new ids or the context's end. The reply's ids (stop id excluded) go to
 * *reply. Q35_ERR_CONTEXT when the prompt leaves no room for a reply (nothing printed). */
static int chat_turn(Q35Engine *e, const Q35Tokenizer *t, const Q35ChatMarks *mk, const ChatConv *cv, const char *tools,
                     int think, const Q35SeqParams *sp, int max_new, ChatStream *cs, ChatTurn *st, int **reply,
                     int *n_reply, Q35Err *err) {
    Q35ChatRequest rq = {
        .messages = cv->m, .n_messages = cv->n, .tools = tools, .add_generation_prompt = 1, .thinking = think};
    char *text = NULL;
    int *ids = NULL, n = 0, seq = -1, rc = q35_chat_render_request(t, &rq, &text, err);
    if (!rc) rc = q35_tokenize(t, text, strlen(text), &ids, &n, err);
    free(text);
    const int ctx = q35_context_size(e);
    if (!rc && n + 1 > ctx) rc = err_set(err, Q35_ERR_CONTEXT, "the conversation (%d tokens) fills the context", n);
    Q35PrefixHit hit = {0};
    if (!rc) rc = q35_seq_open_cached(e, sp, ids, n, &seq, &hit, err);
    if (rc) {
        free(ids);
        return rc;
    }
    memset(st, 0, sizeof *st);
    st->n_prompt = n;
    st->n_cached = hit.cached;
    int pts[8], np = q35_chat_prefix_points(mk, ids, n, hit.cached, hit.matched, pts, 8), ip = 0, fed = hit.cached;
    const int *stop = NULL, n_stop = q35_tokenizer_stop_ids(t, &stop);
    *reply = malloc(sizeof(int) * (size_t)(max_new > 0 ? max_new : 1));
    *n_reply = 0;
    if (!*reply) rc = err_set(err, Q35_ERR_OOM, "out of memory");
    Q35StepOut out;
    const double t0 = now_s();
    while (!rc && fed < n) { /* chunks of 2048 ids; the snapshot points inside a chunk are taken by its step */
        const int end = n - fed > 2048 ? fed + 2048 : n;
        while (ip < np && pts[ip] <= fed) ip++;
        int k = ip;
        while (k < np && pts[k] < end) k++;
        Q35StepItem it = {
            .seq = seq, .ids = ids + fed, .n = end - fed, .sample = end == n, .snap_at = pts + ip, .n_snap_at = k - ip};
        if ((rc = q35_step(e, &it, 1, &out, err))) break;
        fed = end;
        ip = k;
        if (ip < np && pts[ip] == fed) rc = q35_seq_snapshot(e, seq, err);
    }
    const double t1 = now_s();
    st->prefill_s = t1 - t0;
    for (int id = out.id; !rc && !is_stop(stop, n_stop, id);) {
        (*reply)[(*n_reply)++] = id;
        if (on_token(cs, id)) {
            rc = cs->err.code ? cs->err.code : Q35_ERR_ARG;
            break;
        }
        if (*n_reply >= max_new) {
            st->length_stop = 1;
            break;
        }
        if (q35_seq_length(e, seq) + 1 >= ctx) {
            st->context_stop = 1;
            break;
        }
        Q35StepItem it = {.seq = seq, .ids = &id, .n = 1, .sample = 1};
        if ((rc = q35_step(e, &it, 1, &out, err))) break;
        id = out.id;
    }
    st->decode_s = now_s() - t1;
    st->n_generated = *n_reply;
    st->position = q35_seq_length(e, seq);
    q35_seq_close(e, seq);
    free(ids);
    return rc;
}

/* The serving engine with one sequence and the prefix cache: KV blocks for two full contexts (the running turn and
 * the cached blocks it does not share), 16 snapshots (a first open reports the sizes), no host tier (a turn resumes
 * from the previous turn's snapshots, which the 16 keep). */
static int chat_serve_open(Q35Engine *e, Q35Err *err) {
    Q35ServeOptions so;
    memset(&so, 0, sizeof so);
    so.max_seqs = 1;
    so.no_prefix_host = 1;
    int rc = q35_serve_open(e, &so, err);
    if (rc) return rc;
    Q35ServeInfo in;
    q35_serve_info(e, &in);
    q35_serve_close(e);
    const size_t ctx_blocks = (size_t)(in.max_context + in.kv_block - 1) / (size_t)in.kv_block;
    so.kv_bytes = in.slot_bytes + 2 * ctx_blocks * in.block_bytes;
    so.prefix_bytes = 16 * in.slot_bytes + ctx_blocks * in.block_bytes;
    return q35_serve_open(e, &so, err);
}

int cmd_chat(int argc, char **argv) {
    CliModel m;
    cli_model_init(&m);
    SamplingFlags sf;
    cli_sampling_init(&sf);
    const char *sys = NULL, *tok_dir = NULL, *tools_path = NULL;
    int think = Q35_THINK_DEFAULT, max_new = 2048, stats = 0;
    const CliFlag own[] = {
        {"--system", NULL, CLI_STR, &sys, .arg = "TEXT", .help = "the system message"},
        {"--think", NULL, CLI_BOOL, &think, .set = Q35_THINK_ON, .help = "let the model think first"},
        {"--no-think", NULL, CLI_BOOL, &think, .set = Q35_THINK_OFF, .help = "no thinking block"},
        {"-n", "--max-tokens", CLI_INT, &max_new, .lo = 1, .hi = 1 << 24, .arg = "N",
         .help = "tokens per reply at most (default 2048)"},
        {"--stats", NULL, CLI_BOOL, &stats, .help = "a timing line on stderr after each reply"},
        {"--tokenizer", NULL, CLI_STR, &tok_dir, .arg = "DIR",
         .help = "tokenizer.json from DIR (e.g. with --dummy weights)"},
        {"--tools", NULL, CLI_STR, &tools_path, .arg = "FILE",
         .help = "OpenAI tools JSON array: rendered into the prompt; the calls in replies are printed parsed"},
        {0}};
    const CliGroup groups[] = {{"chat flags", own}, {"sampling flags", sf.flags}, {"model flags", m.flags}, {0}};
    const CliSpec spec = {"chat", "--model DIR | --dummy NAME --tokenizer DIR [flags]",
                          "Interactive multi-turn chat: one user message per stdin line, the reply streamed to stdout."
                          "\nCommands: /reset (new conversation), /exit. A line that is not valid UTF-8 is skipped "
                          "with an error\nand makes the exit code 1.",
                          groups, 0};
    int pr = cli_parse(&spec, argc, argv, NULL, NULL);
    if (pr != CLI_OK) return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    int rc = cli_model_check("chat", &m);
    if (rc) return rc;
    Q35Err err = {0};
    char *tools = NULL;
    size_t tools_len;
    if (tools_path && read_file(tools_path, &tools, &tools_len, &err)) return cli_fail("chat", &err);
    /* the model's tokenizer; --tokenizer DIR supplies one (e.g. for --dummy weights), loaded first: it is quick */
    Q35Tokenizer *own_tok = NULL;
    if (tok_dir && q35_tokenizer_load(&own_tok, tok_dir, &err)) {
        free(tools);
        return cli_fail("chat", &err);
    }
    Q35Engine *e;
    if ((rc = cli_open("chat", &e, &m))) {
        q35_tokenizer_free(own_tok);
        return rc;
    }
    Q35Tokenizer *t = own_tok ? own_tok : q35_engine_tokenizer(e);
    if (!t) {
        q35_engine_close(e);
        return cli_error("chat", "no tokenizer.json in the model directory (give --tokenizer DIR)");
    }
    cli_note("chat", e);
    Q35SeqParams sp;
    memset(&sp, 0, sizeof sp);
    cli_sampling_apply(&sf, e, &sp.sampling);
    sp.top_logprobs = -1;
    if (chat_serve_open(e, &err)) {
        q35_engine_close(e);
        q35_tokenizer_free(own_tok);
        free(tools);
        return cli_fail("chat", &err);
    }
    Q35ChatMarks marks;
    q35_chat_marks(t, &marks);
    ChatStream cs = {0};
    rc = q35_detok_open(&cs.detok, t, 1, &err) ? cli_fail("chat", &err) : 0;
    Q35ChatParseOptions po = {.thinking = think, .tools = tools};
    char *probe = NULL; /* a bad tools file fails here, before the first line */
    Q35ChatMessage pm = {.role = "user", .content = "x"};
    Q35ChatRequest prq = {.messages = &pm, .n_messages = 1, .tools = tools};
    if (!rc && tools && q35_chat_render_request(t, &prq, &probe, &err)) rc = cli_fail("chat", &err);
    free(probe);
    ChatConv cv = {0};
    const int keep = sys ? 1 : 0; /* messages a new conversation starts with */
    if (!rc && sys && conv_add(&cv, "system", sys)) rc = cli_error("chat", "out of memory");
    int tty = isatty(0), lineno = 0, bad_lines = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while (!rc) {
        if (tty) fputs("> ", stderr);
        if ((got = getline(&line, &cap, stdin)) < 0) break;
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!got) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            conv_cut(&cv, keep);
            continue;
        }
        int *probe_ids = NULL, n_probe = 0; /* a line the tokenizer refuses (e.g. invalid UTF-8) is skipped */
        if (q35_tokenize(t, line, (size_t)got, &probe_ids, &n_probe, &err)) {
            cli_error("chat", "line %d skipped: %s", lineno, err.msg);
            bad_lines++;
            continue;
        }
        free(probe_ids);
        if (conv_add(&cv, "user", line)) {
            rc = cli_error("chat", "out of memory");
            break;
        }
        ChatTurn st;
        int *reply = NULL, n_reply = 0;
        if (tools && q35_chat_parser_open(&cs.parser, t, &po, &err)) {
            rc = cli_fail("chat", &err);
            break;
        }
        int g = chat_turn(e, t, &marks, &cv, tools, think, &sp, max_new, &cs, &st, &reply, &n_reply, &err);
        if (g == Q35_ERR_CONTEXT && cv.n > keep + 1) { /* the conversation is full: start over with this message */
            fprintf(stderr, "qwen35: chat: note: context full; starting a new conversation\n");
            char *msg = strdup(line);
            conv_cut(&cv, keep);
            if (!msg || conv_add(&cv, "user", msg)) {
                free(msg);
                rc = cli_error("chat", "out of memory");
                break;
            }
            free(msg);
            free(reply);
            g = chat_turn(e, t, &marks, &cv, tools, think, &sp, max_new, &cs, &st, &reply, &n_reply, &err);
        }
        if (g || cs.failed) {
            free(reply);
            q35_chat_parser_close(cs.parser);
            cs.parser = NULL;
            rc = cli_fail("chat", g ? &err : &cs.err);
            break;
        }
        /* the reply as the model wrote it (thinking and tool-call markup included) joins the conversation; the
         * template re-renders it as HF does (earlier turns without their thinking) */
        char *rtext = NULL;
        if (q35_detokenize(t, reply, n_reply, 0, &rtext, &err) || conv_add(&cv, "assistant", rtext)) {
            free(rtext);
            free(reply);
            rc = cli_fail("chat", &err);
            break;
        }
        free(rtext);
        free(reply);
        const char *tail;
        size_t tl;
        q35_detok_flush(cs.detok, &tail, &tl);
        if (cs.parser) {
            int calls = 0;
            if (q35_chat_parser_push(cs.parser, tail, tl, on_chat_event, &cs, &err) ||
                q35_chat_parser_finish(cs.parser, on_chat_event, &cs, &calls, &err))
                rc = cli_fail("chat", &err);
            if (cs.in_call) fputc('\n', stdout);
            cs.in_call = 0;
            if (calls) printf("[finish_reason tool_calls: %d call%s]", calls, calls > 1 ? "s" : "");
            q35_chat_parser_close(cs.parser);
            cs.parser = NULL;
        } else {
            fwrite(tail, 1, tl, stdout);
        }
        fputc('\n', stdout);
        fflush(stdout);
        if (st.context_stop)
            fprintf(stderr, "qwen35: chat: note: the reply stopped at the end of the context (%d tokens, --ctx)\n",
                    q35_context_size(e));
        if (stats)
            fprintf(stderr, "[prefill %d tokens %.1f ms, %d cached, %d generated %.1f tok/s, position %d]\n",
                    st.n_prompt - st.n_cached, st.prefill_s * 1e3, st.n_cached, st.n_generated,
                    st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0, st.position);
    }
    conv_cut(&cv, 0);
    free(cv.m);
    free(line);
    free(tools);
    q35_detok_close(cs.detok);
    q35_tokenizer_free(own_tok);
    q35_engine_close(e);
    return rc ? rc : bad_lines ? CLI_EXIT_RUNTIME : 0;
}
