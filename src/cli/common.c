/* common.c — the flag parser of the qwen35 commands (common.h) and the shared model / sampling flags. */
#include "common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void verror(const char *cmd, const char *fmt, va_list ap) {
    /* one line: the message is formatted whole, then printed with its prefix */
    char msg[768];
    vsnprintf(msg, sizeof msg, fmt, ap);
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "qwen35: %s%s%s\n", cmd ? cmd : "", cmd ? ": " : "", msg);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(cmd, fmt, ap);
    va_end(ap);
    return CLI_EXIT_USAGE;
}

int cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    verror(cmd, fmt, ap);
    va_end(ap);
    return CLI_EXIT_RUNTIME;
}

int cli_fail(const char *cmd, const Q35Err *err) {
    return cli_error(cmd, "%s", err->msg[0] ? err->msg : q35_strerror(err->code));
}

void cli_exit_codes_help(FILE *f) {
    fputs("exit codes: 0 success; 1 runtime error (files, model, engine); 2 usage error (unknown flag, bad or\n"
          "            missing value, value out of range)\n",
          f);
}

void cli_usage(const CliSpec *spec, FILE *f) {
    fprintf(f, "usage: qwen35 %s %s\n", spec->cmd, spec->synopsis);
    if (spec->about) fprintf(f, "%s\n", spec->about);
    for (const CliGroup *g = spec->groups; g && g->flags; g++) {
        fprintf(f, "%s:\n", g->title);
        for (const CliFlag *fl = g->flags; fl->name; fl++) {
            if (!fl->help) continue;
            char left[64];
            snprintf(left, sizeof left, "%s%s%s%s%s", fl->name, fl->alias ? ", " : "", fl->alias ? fl->alias : "",
                     fl->arg ? " " : "", fl->arg ? fl->arg : "");
            fprintf(f, "  %-26s %s\n", left, fl->help);
        }
    }
    fputs("  -h, --help                 this text\n", f);
    cli_exit_codes_help(f);
}

static const CliFlag *find_flag(const CliSpec *spec, const char *a) {
    for (const CliGroup *g = spec->groups; g && g->flags; g++)
        for (const CliFlag *fl = g->flags; fl->name; fl++)
            if (!strcmp(a, fl->name) || (fl->alias && !strcmp(a, fl->alias))) return fl;
    return NULL;
}

/* "[lo, hi]" with integers printed as integers */
static void range_str(char *buf, size_t n, const CliFlag *fl) {
    snprintf(buf, n, "%s%.17g, %.17g]", fl->lo_open ? "(" : "[", fl->lo, fl->hi);
}

static int parse_value(const char *cmd, const CliFlag *fl, const char *flag, const char *s) {
    char range[96];
    range_str(range, sizeof range, fl);
    switch (fl->type) {
    case CLI_STR: *(const char **)fl->dst = s; return 0;
    case CLI_INT:
    case CLI_U64: {
        /* strtoll accepts leading blanks and a sign: only digits (and a '-' where lo < 0) are taken here */
        const char *p = s + (*s == '-' && fl->lo < 0);
        char *end;
        errno = 0;
        long long v = (*p >= '0' && *p <= '9') ? strtoll(s, &end, 10) : 0;
        if (!(*p >= '0' && *p <= '9') || errno || *end || (double)v < fl->lo || (double)v > fl->hi)
            return cli_usage_error(cmd, "%s: '%s' is not an integer in %s", flag, s, range);
        if (fl->type == CLI_INT)
            *(int *)fl->dst = (int)v;
        else
            *(uint64_t *)fl->dst = (uint64_t)v;
        return 0;
    }
    case CLI_FLOAT: {
        char *end;
        errno = 0;
        double v = *s && *s != ' ' && *s != '\t' ? strtod(s, &end) : NAN;
        int bad = isnan(v) || *end || !isfinite(v) || (errno == ERANGE && fabs(v) > 1) || v > fl->hi ||
                  (fl->lo_open ? v <= fl->lo : v < fl->lo);
        if (bad) return cli_usage_error(cmd, "%s: '%s' is not a number in %s", flag, s, range);
        *(float *)fl->dst = (float)v;
        return 0;
    }
    case CLI_IDS: {
        CliIds *ids = fl->dst;
        cli_ids_free(ids);
        return cli_parse_ids(cmd, flag, s, (long)fl->lo, (long)fl->hi, ids) ? CLI_EXIT_USAGE : 0;
    }
    default: return cli_usage_error(cmd, "%s: internal error: bad flag type", flag);
    }
}

int cli_parse(const CliSpec *spec, int argc, char **argv, const char **pos, int *n_pos) {
    int np = 0, flags_done = 0;
    if (n_pos) *n_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!flags_done && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            cli_usage(spec, stdout);
            return CLI_HELP;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!flags_done && !strcmp(a, "--")) {
            flags_done = 1;
            continue;
        }
        if (flags_done || a[0] != '-' || !a[1]) {
            if (np >= spec->max_pos) {
                cli_usage_error(spec->cmd,
                                spec->max_pos ? "unexpected argument '%s' (one %s at a time)"
                                              : "unexpected argument '%s'%s (flags start with --)",
                                a, spec->max_pos ? "positional argument" : "");
                return CLI_ERROR;
            }
            pos[np++] = a;
            continue;
        }
        /* --flag=value is accepted too */
        char name[64];
        const char *eq = strncmp(a, "--", 2) ? NULL : strchr(a, '='), *val = NULL;
        if (eq && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
        const CliFlag *fl = find_flag(spec, name);
        if (!fl) {
            cli_usage_error(spec->cmd, "unknown flag '%s' (qwen35 %s --help lists them)", name, spec->cmd);
            return CLI_ERROR;
        }
        if (fl->seen) *fl->seen = 1;
        if (fl->type == CLI_BOOL) {
            if (val) {
                cli_usage_error(spec->cmd, "%s takes no value", name);
                return CLI_ERROR;
            }
            *(int *)fl->dst = fl->set ? fl->set : 1;
            continue;
        }
        if (!val) {
            if (i + 1 >= argc) {
                cli_usage_error(spec->cmd, "%s needs a value (%s)", name, fl->arg ? fl->arg : "VALUE");
                return CLI_ERROR;
            }
            val = argv[++i];
        }
        if (parse_value(spec->cmd, fl, name, val)) return CLI_ERROR;
    }
    if (n_pos) *n_pos = np;
    return CLI_OK;
}

int cli_parse_ids(const char *cmd, const char *flag, const char *s, long lo, long hi, CliIds *out) {
    out->v = NULL;
    out->n = 0;
    if (!*s) {
        cli_usage_error(cmd, "%s: empty id list (expected e.g. 5,17,9)", flag);
        return -1;
    }
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    int *a = malloc(cap * sizeof *a);
    if (!a) {
        cli_error(cmd, "out of memory");
        return -1;
    }
    int k = 0;
    const char *p = s;
    for (;;) {
        const char *q = p;
        while (*q >= '0' && *q <= '9') q++;
        long v = -1;
        if (q > p && q - p <= 10) {
            errno = 0;
            v = strtol(p, NULL, 10);
        }
        if (q == p || (*q && *q != ',') || q - p > 10 || v < lo || v > hi) {
            const char *why = q == p              ? (*p ? "not a number" : "empty item")
                              : (*q && *q != ',') ? "not a number"
                                                  : "out of range";
            cli_usage_error(cmd,
                            "%s: bad id list at '%.24s' (%s; expected integers in [%ld, %ld] separated by single "
                            "commas, e.g. 5,17,9)",
                            flag, p, why, lo, hi);
            free(a);
            return -1;
        }
        a[k++] = (int)v;
        if (!*q) break;
        p = q + 1;
    }
    out->v = a;
    out->n = k;
    return 0;
}

void cli_ids_free(CliIds *ids) {
    free(ids->v);
    ids->v = NULL;
    ids->n = 0;
}

int cli_hw_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void cli_model_init(CliModel *m) {
    memset(m, 0, sizeof *m);
    q35_options_init(&m->o);
    const char *d = getenv("QWEN35_DETERMINISTIC");
    if (d && !strcmp(d, "1")) m->o.deterministic = 1;
    Q35Options *o = &m->o;
    const CliFlag t[] = {
        {"--model", NULL, CLI_STR, &o->model_dir, .arg = "DIR", .help = "Hugging Face model directory"},
        {"--dummy", NULL, CLI_STR, &o->dummy, .arg = "NAME",
         .help = "random weights at real shapes: qwen3.5-0.8b | qwen3-0.6b"},
        {"--backend", NULL, CLI_STR, &o->backend, .arg = "B", .help = "cpu | cuda | auto (default: auto)"},
        {"--ctx", NULL, CLI_INT, &o->max_seq, .lo = 1, .hi = 1 << 24, .arg = "N",
         .help = "context in tokens (default: min(4096, the model's max_position_embeddings))"},
        {"--threads", NULL, CLI_INT, &o->threads, .lo = 1, .hi = 4096, .arg = "N", .seen = &m->threads_seen,
         .help = "CPU threads (default: all cores; capped at the cores there are)"},
        {"--seed-weights", NULL, CLI_U64, &o->dummy_seed, .lo = 0, .hi = 9007199254740992.0, .arg = "S",
         .help = "seed of the --dummy weights"},
        {"--probe", NULL, CLI_STR, &o->probe_dir, .arg = "DIR", .help = "dump named activations into DIR (debugging)"},
        {"--deterministic", NULL, CLI_BOOL, &o->deterministic,
         .help = "CUDA: deterministic split-K reductions (also QWEN35_DETERMINISTIC=1)"},
        {"--no-graph", NULL, CLI_BOOL, &o->no_graph, .help = "CUDA: launch kernels one by one (no graph replay)"},
        {"--keep-f32-params", NULL, CLI_BOOL, &o->keep_f32_params,
         .help = "keep F32 A_log / gated-norm weights as F32 (default: round to bf16 like HF)"},
        {"--strict", NULL, CLI_BOOL, &o->strict, .help = "unknown tensor names are an error (default: a warning)"},
        {"--weights", NULL, CLI_STR, &o->weights, .arg = "FMT",
         .help = "auto (as stored) | fp8: quantize the projections to FP8 e4m3, 128 x 128 block scales, at load"},
        {0}};
    _Static_assert(sizeof t / sizeof t[0] <= sizeof m->flags / sizeof m->flags[0], "CliModel.flags is too small");
    memcpy(m->flags, t, sizeof t);
}

int cli_model_check(const char *cmd, CliModel *m) {
    Q35Options *o = &m->o;
    if (o->backend && strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda") && strcmp(o->backend, "auto"))
        return cli_usage_error(cmd, "--backend: unknown backend '%s' (expected cpu, cuda or auto)", o->backend);
    if (o->weights && strcmp(o->weights, "auto") && strcmp(o->weights, "fp8"))
        return cli_usage_error(cmd, "--weights: unknown weight format '%s' (expected auto or fp8)", o->weights);
    if (!o->model_dir && !o->dummy) return cli_usage_error(cmd, "give --model DIR or --dummy qwen3.5-0.8b|qwen3-0.6b");
    if (o->model_dir && o->dummy) return cli_usage_error(cmd, "give --model DIR or --dummy NAME, not both");
    int hw = cli_hw_threads();
    if (o->threads > hw) o->threads = hw; /* more threads than cores only adds contention */
    return 0;
}

/* "qwen35: CMD: random weights 45%" redrawn in place on a terminal; erased when the load is done, so that
 * what follows (an error, a note, the output) starts on a clean line. */
static void load_progress(void *user, const char *what, double done, double total) {
    static int last = -1;
    int pct = total > 0 ? (int)(100 * done / total) : 100;
    if (pct == last) return;
    last = pct;
    if (pct >= 100) {
        fputs("\r\033[K", stderr);
        last = -1;
    } else {
        fprintf(stderr, "\rqwen35: %s: %s %3d%%\033[K", (const char *)user, what, pct);
    }
    fflush(stderr);
}

int cli_open(const char *cmd, Q35Engine **e, const CliModel *m) {
    Q35Err err = {0};
    *e = NULL;
    Q35Options o = m->o;
    if (isatty(STDERR_FILENO)) o.progress = load_progress, o.progress_user = (void *)cmd;
    int rc = q35_engine_open(e, &o, &err);
    if (o.progress) fputs("\r\033[K", stderr); /* a failed load leaves no partial line */
    if (rc) return cli_fail(cmd, &err);
    return 0;
}

void cli_note(const char *cmd, const Q35Engine *e) {
    const char *note = q35_engine_note(e);
    if (note) fprintf(stderr, "qwen35: %s: note: %s\n", cmd, note);
}

void cli_sampling_init(SamplingFlags *f) {
    memset(f, 0, sizeof *f);
    f->rep = 1;
    const CliFlag t[] = {
        {"--temp", NULL, CLI_FLOAT, &f->temp, .lo = 0, .hi = 100, .seen = &f->have_temp, .arg = "T",
         .help = "temperature, 0 = greedy (default: the model's generation_config.json)"},
        {"--top-k", NULL, CLI_INT, &f->top_k, .lo = 0, .hi = 1 << 24, .seen = &f->have_top_k, .arg = "K",
         .help = "keep the K most likely ids, 0 = off"},
        {"--top-p", NULL, CLI_FLOAT, &f->top_p, .lo = 0, .hi = 1, .lo_open = 1, .seen = &f->have_top_p, .arg = "P",
         .help = "nucleus: the smallest set with probability >= P, 1 = off"},
        {"--min-p", NULL, CLI_FLOAT, &f->min_p, .lo = 0, .hi = 1, .seen = &f->have_min_p, .arg = "P",
         .help = "drop ids below P x the top probability, 0 = off"},
        {"--presence-penalty", NULL, CLI_FLOAT, &f->presence, .lo = -2, .hi = 2, .seen = &f->have_presence, .arg = "X",
         .help = "subtracted from the logits of ids already generated, 0 = off"},
        {"--frequency-penalty", NULL, CLI_FLOAT, &f->frequency, .lo = -2, .hi = 2, .seen = &f->have_frequency,
         .arg = "X", .help = "X times an id's count in the generated ids is subtracted from its logit, 0 = off"},
        {"--repetition-penalty", NULL, CLI_FLOAT, &f->rep, .lo = 0, .hi = 10, .lo_open = 1, .seen = &f->have_rep,
         .arg = "X", .help = "HF-style penalty of ids already seen, 1 = off"},
        {"--seed", NULL, CLI_INT, &f->seed, .lo = 0, .hi = 2147483647, .seen = &f->have_seed, .arg = "S",
         .help = "sampling seed"},
        {"--greedy", NULL, CLI_BOOL, &f->greedy, .help = "same as --temp 0"},
        {0}};
    _Static_assert(sizeof t / sizeof t[0] <= sizeof f->flags / sizeof f->flags[0], "SamplingFlags.flags is too small");
    memcpy(f->flags, t, sizeof t);
}

void cli_sampling_apply(const SamplingFlags *f, const Q35Engine *e, Q35Sampling *s) {
    q35_sampling_defaults(e, s);
    if (f->have_temp) s->temperature = f->temp;
    if (f->greedy) s->temperature = 0;
    if (f->have_top_k) s->top_k = f->top_k;
    if (f->have_top_p) s->top_p = f->top_p;
    if (f->have_min_p) s->min_p = f->min_p;
    if (f->have_presence) s->presence_penalty = f->presence;
    if (f->have_frequency) s->frequency_penalty = f->frequency;
    if (f->have_rep) s->repetition_penalty = f->rep;
    if (f->have_seed) s->seed = (uint64_t)f->seed;
}
