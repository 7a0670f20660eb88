/* common.c — flag parsing shared by the subcommands. */
#include "common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cli_value(int argc, char **argv, int *i) {
    if (*i + 1 >= argc) {
        fprintf(stderr, "qwen35: %s needs a value\n", argv[*i]);
        return NULL;
    }
    return argv[++*i];
}

int cli_int(const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "qwen35: %s: '%s' is not an integer in [%ld, %ld]\n", flag, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_float(const char *flag, const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "qwen35: %s: '%s' is not a number\n", flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_model_flag(Q35Options *o, int argc, char **argv, int *i) {
    const char *f = argv[*i], *v;
    if (!strcmp(f, "--model") || !strcmp(f, "--dummy") || !strcmp(f, "--backend") || !strcmp(f, "--probe")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        if (!strcmp(f, "--model")) o->model_dir = v;
        else if (!strcmp(f, "--dummy")) o->dummy = v;
        else if (!strcmp(f, "--probe")) o->probe_dir = v;
        else o->backend = v;
        return 1;
    }
    if (!strcmp(f, "--ctx") || !strcmp(f, "--threads")) {
        if (!(v = cli_value(argc, argv, i))) return -1;
        return cli_int(f, v, 1, 1 << 24, !strcmp(f, "--ctx") ? &o->max_seq : &o->threads) ? -1 : 1;
    }
    if (!strcmp(f, "--seed-weights")) {
        int s;
        if (!(v = cli_value(argc, argv, i)) || cli_int(f, v, 0, 2147483647, &s)) return -1;
        o->dummy_seed = (uint64_t)s;
        return 1;
    }
    if (!strcmp(f, "--deterministic")) { o->deterministic = 1; return 1; }
    if (!strcmp(f, "--no-graph")) { o->no_graph = 1; return 1; }
    if (!strcmp(f, "--keep-f32-params")) { o->keep_f32_params = 1; return 1; }
    if (!strcmp(f, "--strict")) { o->strict = 1; return 1; }
    return 0;
}

int cli_parse_ids(const char *s, int **ids, int *n) {
    int cap = 16, k = 0;
    int *a = malloc(sizeof(int) * (size_t)cap);
    if (!a) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 2147483647L || (*end && *end != ',' && *end != ' ')) {
            fprintf(stderr, "qwen35: --ids: bad id list at '%s' (expected comma-separated non-negative integers)\n", p);
            free(a);
            return -1;
        }
        if (k == cap) {
            int *b = realloc(a, sizeof(int) * (size_t)(cap *= 2));
            if (!b) { free(a); return -1; }
            a = b;
        }
        a[k++] = (int)v;
        p = end;
        while (*p == ',' || *p == ' ') p++;
    }
    if (k == 0) {
        fprintf(stderr, "qwen35: --ids: empty id list\n");
        free(a);
        return -1;
    }
    *ids = a;
    *n = k;
    return 0;
}

void cli_sampling_init(SamplingFlags *f) {
    memset(f, 0, sizeof *f);
    f->temp = f->top_p = f->min_p = -1;
    f->top_k = f->seed = -1;
    f->rep = 1;
}

int cli_sampling_flag(SamplingFlags *f, int argc, char **argv, int *i) {
    const char *a = argv[*i], *x;
    if (!strcmp(a, "--greedy")) { f->temp = 0; return 1; }
    static const char *const names[] = {"--temp", "--top-k", "--top-p", "--min-p", "--presence-penalty",
                                        "--repetition-penalty", "--seed"};
    int k = 0;
    while (k < 7 && strcmp(a, names[k])) k++;
    if (k == 7) return 0;
    if (!(x = cli_value(argc, argv, i))) return -1;
    int bad;
    switch (k) {
    case 0: bad = cli_float(a, x, &f->temp); break;
    case 1: bad = cli_int(a, x, 0, 1 << 24, &f->top_k); break;
    case 2: bad = cli_float(a, x, &f->top_p); break;
    case 3: bad = cli_float(a, x, &f->min_p); break;
    case 4: bad = cli_float(a, x, &f->presence), f->have_presence = 1; break;
    case 5: bad = cli_float(a, x, &f->rep), f->have_rep = 1; break;
    default: bad = cli_int(a, x, 0, 2147483647, &f->seed); break;
    }
    return bad ? -1 : 1;
}

void cli_sampling_apply(const SamplingFlags *f, const Q35Engine *e, Q35Sampling *s) {
    q35_sampling_defaults(e, s);
    if (f->temp >= 0) s->temperature = f->temp;
    if (f->top_k >= 0) s->top_k = f->top_k;
    if (f->top_p >= 0) s->top_p = f->top_p;
    if (f->min_p >= 0) s->min_p = f->min_p;
    if (f->have_presence) s->presence_penalty = f->presence;
    if (f->have_rep) s->repetition_penalty = f->rep;
    if (f->seed >= 0) s->seed = (uint64_t)f->seed;
}

void cli_env_options(Q35Options *o) {
    const char *d = getenv("QWEN35_DETERMINISTIC");
    if (d && !strcmp(d, "1")) o->deterministic = 1;
}

int cli_fail(const Q35Err *err) {
    fprintf(stderr, "qwen35: %s\n", err->msg[0] ? err->msg : q35_strerror(err->code));
    return 1;
}

int cli_open(Q35Engine **e, Q35Options *o) {
    Q35Err err = {0};
    if (!o->model_dir && !o->dummy) {
        fprintf(stderr, "qwen35: give --model DIR or --dummy qwen3.5-0.8b|qwen3-0.6b\n");
        return 1;
    }
    if (q35_engine_open(e, o, &err)) return cli_fail(&err);
    if (q35_engine_note(*e)) fprintf(stderr, "qwen35: %s\n", q35_engine_note(*e));
    return 0;
}
