/* test_tok_cli.c — the CLI contract of `qwen35 tokenize` / `qwen35 detokenize`, run as a subprocess:
 * ids on one line; --jsonl over the whole test corpus equals the HF golden ids line by line; --text-file;
 * detokenize; invalid UTF-8 -> one stderr line with the byte offset and a non-zero exit; bad ids and bad
 * JSON lines fail the same way; `chat` on dummy weights computes only what the prefix cache does not hold
 * (checked from its --stats lines). Binary: argv[1], else $BUILD/qwen35 (tests/run.sh sets BUILD). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"
#include "util.h"

static const char *BIN;
static const char *MODEL = ".cache/qwen3-tokenizer";
static char out_path[64] = "/tmp/q35cli_out_XXXXXX", err_path[64] = "/tmp/q35cli_err_XXXXXX";

/* Runs "BIN args" with stdout/stderr to files; returns the exit code and the two outputs (malloc'ed). */
static int run(const char *args, char **out, char **err) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", BIN, args, out_path, err_path);
    int st = system(cmd);
    size_t n;
    Err e;
    *out = *err = NULL;
    if (read_file(out_path, out, &n, &e)) *out = strdup("");
    if (read_file(err_path, err, &n, &e)) *err = strdup("");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

static char *temp_file(const void *data, size_t n) {
    char *path = strdup("/tmp/q35cli_in_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n) {
        free(path);
        return NULL;
    }
    close(fd);
    return path;
}

static int one_line(const char *s) { return s[0] && strchr(s, '\n') == s + strlen(s) - 1; }

/* ids of the chat render of one user message (+ generation prompt), after the prefix text */
static int turn_len(const Q35Tokenizer *t, const char *prefix, const char *user) {
    Q35ChatMessage m = {.role = "user", .content = user};
    char *r, buf[512];
    int *ids, n = -1;
    Q35Err err;
    if (q35_chat_render(t, &m, 1, 1, Q35_THINK_DEFAULT, &r, &err)) return -1;
    snprintf(buf, sizeof buf, "%s%s", prefix, r);
    if (q35_tokenize(t, buf, strlen(buf), &ids, &n, &err) == 0) free(ids);
    free(r);
    return n;
}

/* chat with dummy weights, through the serving engine's prefix cache: turn 2 resumes at the end of turn 1's prompt
 * (its generation prompt's last snapshot) and computes only the rest; after /reset the same first message is an
 * exact repeat that computes one id. */
static void check_chat(void) {
    const char *in = "Hi\nAgain\n/reset\nHi\n";
    char *f = (char *)in, args[512], *out, *err;
    char path[] = "/tmp/q35cli_chat_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, f, strlen(in)) == (ssize_t)strlen(in), "chat input file");
    close(fd);
    snprintf(args, sizeof args,
             "chat --dummy qwen3-0.6b --tokenizer %s --backend cpu --ctx 256 -n 2 --greedy --stats <%s", MODEL, path);
    int rc = run(args, &out, &err);
    unlink(path);
    CHECK(rc == 0, "chat exit %d: %s", rc, err);
    int a[3] = {0}, c[3] = {0}, g[3] = {0}, p[3] = {0}, k = 0;
    for (const char *q = err; k < 3 && (q = strstr(q, "[prefill ")); q++, k++)
        sscanf(q, "[prefill %d tokens %*f ms, %d cached, %d generated %*f tok/s, position %d]", &a[k], &c[k], &g[k],
               &p[k]);
    CHECK(k == 3, "chat printed %d stats lines: %s", k, err);
    Q35Tokenizer *t;
    Q35Err e;
    if (k == 3 && q35_tokenizer_load(&t, MODEL, &e) == 0) {
        const int first = turn_len(t, "", "Hi");
        CHECK(a[0] == first && c[0] == 0 && p[0] == first + g[0] - 1,
              "turn 1: prefill %d cached %d (want %d, 0), "
              "position %d",
              a[0], c[0], first, p[0]);
        CHECK(c[1] >= first - 1 && a[1] > 0 && p[1] == c[1] + a[1] + g[1] - 1,
              "turn 2 resumes from turn 1's prompt: cached %d (want >= %d), prefill %d, position %d", c[1], first - 1,
              a[1], p[1]);
        CHECK(a[2] == 1 && c[2] == first - 1 && p[2] == first + g[2] - 1,
              "after /reset, the same message: prefill %d cached %d (want 1, %d), position %d", a[2], c[2], first - 1,
              p[2]);
        q35_tokenizer_free(t);
    }
    free(out);
    free(err);
}

static void check_jsonl_corpus(void) {
    char *out, *err;
    int rc = run("tokenize --model .cache/qwen3-tokenizer --text-file tests/fixtures/tokenizer/corpus.jsonl --jsonl",
                 &out, &err);
    CHECK(rc == 0, "tokenize --jsonl corpus: exit %d: %s", rc, err);
    size_t n;
    char *gold;
    Err e;
    CHECK(read_file("tests/fixtures/tokenizer/golden_qwen3.jsonl", &gold, &n, &e) == 0, "golden missing");
    char *g = strchr(gold, '\n') + 1, *o = out;
    int lines = 0, bad = 0;
    while (*g) {
        char *ge = strchr(g, '\n'), *oe = strchr(o, '\n');
        if (!ge || !oe) {
            bad++;
            break;
        }
        *ge = *oe = 0;
        cJSON *want = cJSON_Parse(g);
        char buf[16];
        const char *p = o;
        int ok = 1, k = 0;
        const cJSON *id;
        cJSON_ArrayForEach(id, want) {
            snprintf(buf, sizeof buf, k++ ? " %d" : "%d", id->valueint);
            if (strncmp(p, buf, strlen(buf))) {
                ok = 0;
                break;
            }
            p += strlen(buf);
        }
        ok = ok && *p == 0;
        if (!ok && bad < 3) fprintf(stderr, "CLI jsonl line %d: got '%.200s'\n", lines + 1, o);
        bad += !ok;
        cJSON_Delete(want);
        lines++;
        g = ge + 1;
        o = oe + 1;
    }
    CHECK(lines >= 2000 && bad == 0 && *o == 0, "tokenize --jsonl: %d of %d lines differ from golden", bad, lines);
    printf("CLI tokenize --jsonl: %d lines, %d mismatches\n", lines, bad);
    free(gold);
    free(out);
    free(err);
}

int main(int argc, char **argv) {
    char def[512];
    const char *b = getenv("BUILD");
    snprintf(def, sizeof def, "%s/qwen35", b ? b : "build");
    BIN = argc > 1 ? argv[1] : def;
    int fo = mkstemp(out_path), fe = mkstemp(err_path);
    CHECK(fo >= 0 && fe >= 0, "temp files");
    close(fo);
    close(fe);
    CHECK(access(BIN, X_OK) == 0, "no executable %s", BIN);
    char *out, *err;
    int rc = run("tokenize --model .cache/qwen3-tokenizer --text 'Hello, world! 你好 123'", &out, &err);
    CHECK(rc == 0 && !strcmp(out, "9707 11 1879 0 220 108386 220 16 17 18\n"), "tokenize --text: %d '%s' %s", rc, out,
          err);
    free(out), free(err);
    rc = run("tokenize --model .cache/qwen3-tokenizer --text ''", &out, &err);
    CHECK(rc == 0 && !strcmp(out, "\n"), "empty text gives an empty line");
    free(out), free(err);

    const char txt[] = "<|im_start|>user\nHi<|im_end|>\n";
    char *f = temp_file(txt, sizeof txt - 1), args[512];
    snprintf(args, sizeof args, "tokenize --model %s --text-file %s", MODEL, f);
    rc = run(args, &out, &err);
    CHECK(rc == 0 && !strcmp(out, "151644 872 198 13048 151645 198\n"), "tokenize --text-file: '%s'", out);
    free(out), free(err), unlink(f), free(f);

    f = temp_file("abc \xe4\xbd\xa0\xff xyz", 12);
    snprintf(args, sizeof args, "tokenize --model %s --text-file %s", MODEL, f);
    rc = run(args, &out, &err);
    CHECK(rc != 0 && one_line(err) && strstr(err, "byte offset 7"), "invalid UTF-8: exit %d, stderr '%s'", rc, err);
    CHECK(out[0] == 0, "nothing on stdout after an error");
    free(out), free(err), unlink(f), free(f);

    const char *jl = "\"ok\"\n\"a\\u0000b\"\n  \"\\ud83d\\ude00\"  \n";
    f = temp_file(jl, strlen(jl));
    snprintf(args, sizeof args, "tokenize --model %s --text-file %s --jsonl", MODEL, f);
    rc = run(args, &out, &err);
    CHECK(rc == 0 && !strcmp(out, "562\n64 188 65\n141334\n"), "jsonl small: %d '%s' %s", rc, out, err);
    free(out), free(err), unlink(f), free(f);
    f = temp_file("\"ok\"\nnot json\n", strlen("\"ok\"\nnot json\n"));
    snprintf(args, sizeof args, "tokenize --model %s --text-file %s --jsonl", MODEL, f);
    rc = run(args, &out, &err);
    CHECK(rc != 0 && one_line(err) && strstr(err, "line 2"), "jsonl bad line: %d '%s'", rc, err);
    free(out), free(err), unlink(f), free(f);
    check_jsonl_corpus();

    rc = run("detokenize --model .cache/qwen3-tokenizer --ids 9707,11,1879,0,220,108386", &out, &err);
    CHECK(rc == 0 && !strcmp(out, "Hello, world! 你好\n"), "detokenize: %d '%s' %s", rc, out, err);
    free(out), free(err);
    rc = run("detokenize --model .cache/qwen3-tokenizer --ids 151644,872,151645 --skip-special", &out, &err);
    CHECK(rc == 0 && !strcmp(out, "user\n"), "detokenize --skip-special: '%s'", out);
    free(out), free(err);
    rc = run("detokenize --model .cache/qwen3-tokenizer --ids 9707,99999999", &out, &err);
    CHECK(rc != 0 && one_line(err) && strstr(err, "99999999"), "detokenize bad id: %d '%s'", rc, err);
    free(out), free(err);
    rc = run("detokenize --model .cache/qwen3-tokenizer --ids 1,x", &out, &err);
    CHECK(rc != 0 && one_line(err), "detokenize unparsable id: %d '%s'", rc, err);
    free(out), free(err);
    rc = run("tokenize --model /nonexistent --text hi", &out, &err);
    CHECK(rc != 0 && one_line(err), "missing model dir: %d '%s'", rc, err);
    free(out), free(err);
    rc = run("tokenize --text hi", &out, &err);
    CHECK(rc != 0 && one_line(err), "missing --model: %d '%s'", rc, err);
    free(out), free(err);
    check_chat();
    unlink(out_path);
    unlink(err_path);
    return TEST_SUMMARY("tok_cli");
}
