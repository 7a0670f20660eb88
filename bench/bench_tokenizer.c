/* bench_tokenizer.c — single-threaded encode throughput (MB/s of UTF-8 input) and load time.
 *   build/bench/bench_tokenizer [--model DIR] [--jsonl FILE | --text FILE] [--mb N] [--runs R]
 * Input: the lines of a JSONL file of strings (default: the tokenizer test corpus, many scripts) or one
 * plain text file, each encoded by its own q35_tokenize call, repeated to about N MB per run (default 16).
 * Prints the median of R runs (default 5) plus min/max, as text and one CSV line. The same method is in
 * bench/bench_tokenizer_ref.js (HF tokenizers node binding, @lenml/tokenizers) and bench_tokenizer_hf.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *model = ".cache/qwen3-tokenizer", *jsonl = "tests/fixtures/tokenizer/corpus.jsonl", *text = NULL;
    double mb = 16;
    int runs = 5;
    for (int i = 1; i < argc; i++) {
        if (i + 1 < argc && !strcmp(argv[i], "--model")) model = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--jsonl")) jsonl = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--text")) text = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--mb")) mb = atof(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--runs")) runs = atoi(argv[++i]);
        else { fprintf(stderr, "usage: %s [--model DIR] [--jsonl F | --text F] [--mb N] [--runs R]\n", argv[0]); return 2; }
    }
    if (runs < 1 || runs > 100 || mb <= 0) { fprintf(stderr, "bad --runs / --mb\n"); return 2; }
    Err err;
    Tokenizer *t;
    double t0 = now_s();
    if (q35_tokenizer_load(&t, model, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    double load_s = now_s() - t0;

    char *data;
    size_t len;
    if (read_file(text ? text : jsonl, &data, &len, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
    int n = 0, cap = 1024;
    char **s = malloc((size_t)cap * sizeof *s);
    size_t *sl = malloc((size_t)cap * sizeof *sl), bytes = 0;
    if (text) {
        s[0] = data;
        sl[0] = len;
        n = 1;
        bytes = len;
    } else {
        for (char *p = data; *p;) {
            char *e = strchr(p, '\n'), *str;
            const char *end;
            size_t m;
            if (e) *e = 0;
            if (tokenizer_json_string(p, &str, &m, &end) == 0) {
                if (n == cap) { cap *= 2; s = realloc(s, (size_t)cap * sizeof *s); sl = realloc(sl, (size_t)cap * sizeof *sl); }
                s[n] = str;
                sl[n++] = m;
                bytes += m;
            }
            if (!e) break;
            p = e + 1;
        }
    }
    int reps = (int)(mb * 1e6 / (double)(bytes ? bytes : 1)) + 1;
    double *rate = malloc((size_t)runs * sizeof *rate);
    long long ids_total = 0;
    for (int r = 0; r <= runs; r++) { /* run 0 warms up */
        long long nid = 0;
        double a = now_s();
        for (int k = 0; k < reps; k++)
            for (int i = 0; i < n; i++) {
                int *ids, m;
                if (q35_tokenize(t, s[i], sl[i], &ids, &m, &err)) { fprintf(stderr, "%s\n", err.msg); return 1; }
                nid += m;
                free(ids);
            }
        double dt = now_s() - a;
        if (r) rate[r - 1] = (double)bytes * reps / dt / 1e6;
        ids_total = nid;
    }
    qsort(rate, (size_t)runs, sizeof *rate, cmp_d);
    printf("input: %s, %d strings, %.2f MB x %d per run\n", text ? text : jsonl, n, bytes / 1e6, reps);
    printf("load %.3f s; encode %.1f MB/s median (min %.1f, max %.1f) over %d runs; %.2f bytes/token\n", load_s,
           rate[runs / 2], rate[0], rate[runs - 1], runs, (double)bytes * reps / (double)(ids_total ? ids_total : 1));
    printf("csv,impl=qwen35-c,input=%s,mb_per_s=%.2f,load_s=%.3f\n", text ? text : jsonl, rate[runs / 2], load_s);
    if (!text) for (int i = 0; i < n; i++) free(s[i]);
    free(s);
    free(sl);
    free(rate);
    free(data);
    q35_tokenizer_free(t);
    return 0;
}
