/* test_cli.c — the qwen35 command line as outside harnesses use it: the logits contract
 * (raw float32 [n x vocab], prefill == decode), generation, and bad input answered with exactly
 * one line on stderr and a non-zero exit (never a crash). Runs build/qwen35 (BUILD env var). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test.h"

static char bin[512], tmp[256];

/* Runs "bin args", stdout -> tmp/out, stderr -> tmp/err. Returns the exit status (128+sig on a signal). */
static int run(const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s >%s/out 2>%s/err", bin, args, tmp, tmp);
    int st = system(cmd);
    if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
    return WEXITSTATUS(st);
}

static char *slurp(const char *name, size_t *len) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) n = 0;
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

/* A bad input: non-zero exit below 128 (no signal) and one stderr line containing want. */
static void expect_error(const char *args, const char *want) {
    int rc = run(args);
    char *err = slurp("err", NULL);
    int lines = 0;
    for (char *p = err; p && *p; p++) lines += *p == '\n';
    CHECK(rc != 0 && rc < 128, "'%s': exit %d", args, rc);
    CHECK(lines == 1, "'%s': %d stderr lines: %s", args, lines, err ? err : "");
    CHECK(err && strcasestr(err, want), "'%s': stderr lacks '%s': %s", args, want, err ? err : "");
    free(err);
}

static void write_file(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
}

int main(void) {
    const char *b = getenv("BUILD");
    snprintf(bin, sizeof bin, "%s/qwen35", b && *b ? b : "build");
    snprintf(tmp, sizeof tmp, "/tmp/q35cli.XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    const char *fx = "tests/fixtures/qwen35_text";
    char args[2048];

    /* logits: prefill and decode agree and have the contract's size */
    float *lp = NULL, *ld = NULL;
    size_t np = 0, nd = 0;
    snprintf(args, sizeof args, "logits --model %s --ids 5,17,9,300 --backend cpu --out %s/p.f32", fx, tmp);
    CHECK(run(args) == 0, "logits prefill");
    snprintf(args, sizeof args, "logits --model %s --ids 5,17,9,300 --backend cpu --mode decode --out %s/d.f32", fx,
             tmp);
    CHECK(run(args) == 0, "logits decode");
    lp = (float *)slurp("p.f32", &np);
    ld = (float *)slurp("d.f32", &nd);
    CHECK(np == 4 * 512 * sizeof(float) && nd == np, "logits file sizes %zu %zu (want %zu)", np, nd,
          4 * 512 * sizeof(float));
    double num = 0, den = 0;
    for (size_t i = 0; lp && ld && i < np / sizeof(float); i++)
        num += (lp[i] - ld[i]) * (double)(lp[i] - ld[i]), den += (double)lp[i] * lp[i];
    CHECK(lp && ld && sqrt(num / den) < 1e-5, "prefill vs decode rel L2 %g", sqrt(num / (den + 1e-30)));
    /* --last: one row, the last one of the full output (both modes) */
    for (int m = 0; m < 2; m++) {
        snprintf(args, sizeof args, "logits --model %s --ids 5,17,9,300 --backend cpu --last%s --out %s/l.f32", fx,
                 m ? " --mode decode" : "", tmp);
        CHECK(run(args) == 0, "logits --last (%s)", m ? "decode" : "prefill");
        size_t nl = 0;
        float *ll = (float *)slurp("l.f32", &nl);
        double lnum = 0, lden = 0;
        for (size_t i = 0; ll && lp && nl == 512 * sizeof(float) && i < 512; i++)
            lnum += (ll[i] - lp[3 * 512 + i]) * (double)(ll[i] - lp[3 * 512 + i]), lden += (double)ll[i] * ll[i];
        CHECK(ll && nl == 512 * sizeof(float) && sqrt(lnum / (lden + 1e-30)) < 1e-5,
              "logits --last (%s): %zu bytes, rel L2 vs the last row %g", m ? "decode" : "prefill", nl,
              sqrt(lnum / (lden + 1e-30)));
        free(ll);
    }
    free(lp);
    free(ld);

    /* run: greedy ids, reproducible */
    snprintf(args, sizeof args, "run --model %s --ids 1,2,3 -n 5 --temp 0 --print-ids --backend cpu", fx);
    CHECK(run(args) == 0, "run greedy");
    char *o1 = slurp("out", NULL);
    CHECK(run(args) == 0, "run greedy again");
    char *o2 = slurp("out", NULL);
    int nids = 0;
    for (char *p = o1; p && *p; p++) nids += *p == ' ';
    CHECK(o1 && o2 && !strcmp(o1, o2) && nids == 4, "greedy output '%s' vs '%s'", o1, o2);
    free(o1);
    free(o2);
    snprintf(args, sizeof args, "run --model %s --ids 1,2,3 -n 6 --temp 0.9 --top-k 40 --seed 3 --print-ids", fx);
    CHECK(run(args) == 0, "run sampled");
    snprintf(args, sizeof args, "run --model %s --ids 1,2,3 -n 6 --temp 0 --frequency-penalty 2 --print-ids", fx);
    CHECK(run(args) == 0, "run with a frequency penalty");
    snprintf(args, sizeof args, "run --model %s --ids 1,2,3 -n 6 --frequency-penalty 2.5", fx);
    expect_error(args, "--frequency-penalty");

    /* bad input: one line, non-zero exit */
    snprintf(args, sizeof args, "logits --model %s --ids 1,512 --out %s/x.f32", fx, tmp);
    expect_error(args, "out of range");
    snprintf(args, sizeof args, "logits --model %s --ids 1,x --out %s/x.f32", fx, tmp);
    expect_error(args, "bad id list");
    snprintf(args, sizeof args, "logits --model %s --ids 1,2 --mode sideways --out %s/x.f32", fx, tmp);
    expect_error(args, "--mode");
    snprintf(args, sizeof args, "run --model %s --ids 1,2,3,4,5,6,7,8,9 --ctx 4 --print-ids", fx);
    expect_error(args, "context");
    snprintf(args, sizeof args, "logits --model %s/nonexistent --ids 1 --out %s/x.f32", tmp, tmp);
    expect_error(args, "config.json");
    write_file("config.json", "{\"model_type\": \"qwen3_5_text\", \"hidden_size\": 64,");
    snprintf(args, sizeof args, "info --model %s", tmp);
    expect_error(args, "config.json");
    write_file("config.json", "{\"model_type\": \"llama\", \"hidden_size\": 64}");
    expect_error(args, "llama");
    snprintf(args, sizeof args, "run --model %s --ids 1 --backend tpu", fx);
    expect_error(args, "backend");
    expect_error("frobnicate", "unknown command");
    snprintf(args, sizeof args, "run --model %s --ids 1 --bogus 3", fx);
    expect_error(args, "unknown flag");
    expect_error("run --dummy qwen9-7b --ids 1", "qwen9-7b");
    snprintf(args, sizeof args, "run --model %s --prompt hello", fx);
    expect_error(args, "tokenizer");
    /* a GPU request on a machine without one (or a CPU-only build) fails cleanly */
    if (system("nvidia-smi -L >/dev/null 2>&1") != 0) {
        snprintf(args, sizeof args, "run --model %s --ids 1 --backend cuda", fx);
        expect_error(args, "cuda");
    }
    snprintf(args, sizeof args, "rm -rf %s", tmp);
    if (system(args) != 0) fprintf(stderr, "could not remove %s\n", tmp);
    return TEST_SUMMARY("cli");
}
