/* tok.c — the text subcommands of the qwen35 CLI: tokenize, detokenize and chat (their usage: qwen35 CMD --help).
 * chat is interactive and multi-turn: a user message per stdin line, the reply streamed; the engine keeps the
 * conversation, so each turn prefills only its new tokens. Errors are one line on stderr ("qwen35: CMD: ...")
 * and the exit codes of common.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    int last;
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
    cs->last = id;
    if (q35_detok_push(cs->detok, id, &s, &n, &cs->err) ||
        (cs->parser && q35_chat_parser_push(cs->parser, s, n, on_chat_event, cs, &cs->err))) {
        cs->failed = 1;
        return 1;
    }
    if (!cs->parser) fwrite(s, 1, n, stdout);
    fflush(stdout);
    return 0;
}

/* The ids of one turn. First turn: [system and tools] + user + generation prompt. Later turns continue the
 * sequence: the previous reply's last id (sampled, not yet fed), the close of that reply if the model did
 * not end it, then this user turn and the generation prompt. */
static int turn_ids(const Q35Tokenizer *t, const char *sys, const char *tools, const char *user, int think, int first,
                    int last_id, int **ids, int *n, Q35Err *err) {
    Q35ChatMessage m[2];
    int k = 0;
    if (first && sys) m[k++] = (Q35ChatMessage){.role = "system", .content = sys};
    m[k++] = (Q35ChatMessage){.role = "user", .content = user};
    char *r;
    Q35ChatRequest rq = {
        .messages = m, .n_messages = k, .tools = first ? tools : NULL, .add_generation_prompt = 1, .thinking = think};
    int rc = q35_chat_render_request(t, &rq, &r, err);
    if (rc) return rc;
    int im_end = q35_token_id(t, "<|im_end|>");
    const char *close = first ? "" : last_id == im_end && im_end >= 0 ? "\n" : "<|im_end|>\n";
    size_t cl = strlen(close), rl = strlen(r);
    char *text = malloc(cl + rl + 1);
    if (!text) {
        free(r);
        return err_set(err, Q35_ERR_OOM, "out of memory");
    }
    memcpy(text, close, cl);
    memcpy(text + cl, r, rl + 1);
    free(r);
    int *body, nb;
    rc = q35_tokenize(t, text, cl + rl, &body, &nb, err);
    free(text);
    if (rc) return rc;
    int lead = !first && last_id >= 0;
    *ids = malloc((size_t)(nb + 1) * sizeof **ids);
    if (!*ids) {
        free(body);
        return err_set(err, Q35_ERR_OOM, "out of memory");
    }
    if (lead) (*ids)[0] = last_id;
    memcpy(*ids + lead, body, (size_t)nb * sizeof *body);
    *n = nb + lead;
    free(body);
    return 0;
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
    Q35Sampling s;
    cli_sampling_apply(&sf, e, &s);
    ChatStream cs = {0};
    rc = q35_detok_open(&cs.detok, t, 1, &err) ? cli_fail("chat", &err) : 0;
    Q35ChatParseOptions po = {.thinking = think, .tools = tools};
    char *probe = NULL; /* a bad tools file fails here, before the first line */
    Q35ChatMessage pm = {.role = "user", .content = "x"};
    Q35ChatRequest prq = {.messages = &pm, .n_messages = 1, .tools = tools};
    if (!rc && tools && q35_chat_render_request(t, &prq, &probe, &err)) rc = cli_fail("chat", &err);
    free(probe);
    int first = 1, tty = isatty(0), lineno = 0, bad_lines = 0;
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
            first = 1;
            continue;
        }
        int *ids, n;
        if (turn_ids(t, sys, tools, line, think, first, cs.last, &ids, &n, &err)) {
            cli_error("chat", "line %d skipped: %s", lineno, err.msg); /* e.g. invalid UTF-8 */
            bad_lines++;
            continue;
        }
        if (first && q35_reset(e, &err)) {
            free(ids);
            rc = cli_fail("chat", &err);
            break;
        }
        Q35GenStats st;
        cs.last = -1;
        if (tools && q35_chat_parser_open(&cs.parser, t, &po, &err)) {
            free(ids);
            rc = cli_fail("chat", &err);
            break;
        }
        int g = q35_generate(e, ids, n, max_new, &s, on_token, &cs, &st, &err);
        free(ids);
        if (g == Q35_ERR_CONTEXT && !first) { /* the conversation is full: start over with this message */
            fprintf(stderr, "qwen35: chat: note: context full at %d tokens; starting a new conversation\n",
                    q35_position(e));
            first = 1;
            if (turn_ids(t, sys, tools, line, think, 1, -1, &ids, &n, &err) || q35_reset(e, &err)) {
                rc = cli_fail("chat", &err);
                break;
            }
            g = q35_generate(e, ids, n, max_new, &s, on_token, &cs, &st, &err);
            free(ids);
        }
        if (g || cs.failed) {
            q35_chat_parser_close(cs.parser);
            cs.parser = NULL;
            rc = cli_fail("chat", g ? &err : &cs.err);
            break;
        }
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
        if (st.stop_reason == 3)
            fprintf(stderr, "qwen35: chat: note: the reply stopped at the end of the context (%d tokens, --ctx)\n",
                    q35_context_size(e));
        if (stats)
            fprintf(stderr, "[prefill %d tokens %.1f ms, %d generated %.1f tok/s, position %d]\n", st.n_prompt,
                    st.prefill_s * 1e3, st.n_generated, st.decode_s > 0 ? st.n_generated / st.decode_s : 0.0,
                    q35_position(e));
        first = 0;
    }
    free(line);
    free(tools);
    q35_detok_close(cs.detok);
    q35_tokenizer_free(own_tok);
    q35_engine_close(e);
    return rc ? rc : bad_lines ? CLI_EXIT_RUNTIME : 0;
}
