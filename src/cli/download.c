/* cli/download.c — `qwen35 download REPO [--dir DIR] [--endpoint URL] [--revision REV]
 * [--include-vision] [--token-file FILE] [--verify]`: fetches a Hugging Face model repo's inference
 * files with download_model(). Progress on stderr: a bar redrawn in place when stderr is a
 * terminal, otherwise one line per file plus one every 10 s. */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "download.h"

typedef struct Bar {
    int tty;
    int open;    /* a \r line is on screen */
    double last; /* time of the last draw or line */
} Bar;

static void human(char *out, size_t n, double b) {
    if (b >= 1e9)
        snprintf(out, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6)
        snprintf(out, n, "%.1f MB", b / 1e6);
    else if (b >= 1e3)
        snprintf(out, n, "%.1f kB", b / 1e3);
    else
        snprintf(out, n, "%.0f B", b);
}

static double rate_mb(const DownloadProgress *p) {
    return p->seconds > 0 ? (double)(p->done - p->resumed) / p->seconds / 1e6 : 0.0;
}

static double pct(int64_t a, int64_t b) { return b > 0 ? 100.0 * (double)a / (double)b : 100.0; }

/* "[3/10] model.safetensors [#####-----]  812.3 MB / 1.71 GB  47%  95.2 MB/s" */
static void draw(Bar *b, const DownloadProgress *p) {
    char done[32], size[32], bar[31];
    int fill = (int)(pct(p->done, p->size) * 30 / 100);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '-';
    bar[30] = 0;
    human(done, sizeof done, (double)p->done);
    human(size, sizeof size, (double)p->size);
    fprintf(stderr, "\r[%d/%d] %-.36s [%s] %s / %s %3.0f%% %6.1f MB/s\033[K", p->index + 1, p->count, p->file, bar,
            done, size, pct(p->done, p->size), rate_mb(p));
    b->open = 1;
}

/* "[3/10] model.safetensors: 812.3 MB / 1.71 GB (47%), 95.2 MB/s; all files 45%" */
static void line(const DownloadProgress *p) {
    char done[32], size[32];
    human(done, sizeof done, (double)p->done);
    human(size, sizeof size, (double)p->size);
    fprintf(stderr, "[%d/%d] %s: %s / %s (%.0f%%), %.1f MB/s; all files %.0f%%\n", p->index + 1, p->count, p->file,
            done, size, pct(p->done, p->size), rate_mb(p), pct(p->all_done, p->all_size));
}

static void on_progress(void *user, const DownloadProgress *p) {
    Bar *b = user;
    double t = now_s();
    char size[32];
    switch (p->event) {
    case DL_EV_SKIP:
        human(size, sizeof size, (double)p->size);
        fprintf(stderr, "[%d/%d] %s: already complete (%s)\n", p->index + 1, p->count, p->file, size);
        break;
    case DL_EV_START:
        b->last = t;
        if (b->tty) {
            draw(b, p);
        } else {
            human(size, sizeof size, (double)p->size);
            fprintf(stderr, "[%d/%d] %s: fetching %s", p->index + 1, p->count, p->file, size);
            if (p->resumed > 0) {
                char r[32];
                human(r, sizeof r, (double)p->resumed);
                fprintf(stderr, ", resuming after %s", r);
            }
            fprintf(stderr, "\n");
        }
        break;
    case DL_EV_DATA:
        if (b->tty && t - b->last >= 0.1) {
            draw(b, p);
            b->last = t;
        } else if (!b->tty && t - b->last >= 10) {
            line(p);
            b->last = t;
        }
        break;
    case DL_EV_DONE:
        if (b->tty) {
            draw(b, p);
            fprintf(stderr, "\n");
            b->open = 0;
        } else {
            human(size, sizeof size, (double)(p->size - p->resumed));
            fprintf(stderr, "[%d/%d] %s: done, fetched %s in %.1f s (%.1f MB/s)\n", p->index + 1, p->count, p->file,
                    size, p->seconds, rate_mb(p));
        }
        break;
    default: break;
    }
}

static int read_token(const char *path, char **token, Err *err) {
    char *t = NULL;
    size_t n = 0;
    int rc = read_file(path, &t, &n, err);
    if (rc) return rc;
    while (n > 0 && (t[n - 1] == '\n' || t[n - 1] == '\r' || t[n - 1] == ' ' || t[n - 1] == '\t')) t[--n] = 0;
    if (n == 0 || strpbrk(t, "\r\n")) {
        free(t);
        return err_set(err, Q35_ERR_ARG, "%s: want one line holding the token", path);
    }
    *token = t;
    return 0;
}

/* The directories of path (each prefix ending at a '/', and path itself) that do not exist yet: a failed
 * download removes them again when they are still empty, so that it leaves nothing behind. */
typedef struct NewDirs {
    char path[4096];
    int cut[16], n; /* path[0..cut[i]) is a directory the download will create */
} NewDirs;

static void new_dirs(NewDirs *d, const char *path) {
    d->n = 0;
    if (snprintf(d->path, sizeof d->path, "%s", path) >= (int)sizeof d->path) return;
    size_t len = strlen(d->path);
    for (size_t i = 1; i <= len && d->n < 16; i++) {
        if (i < len && d->path[i] != '/') continue;
        char c = d->path[i];
        d->path[i] = 0;
        struct stat st;
        if (stat(d->path, &st) != 0) d->cut[d->n++] = (int)i;
        d->path[i] = c;
    }
}

static void remove_new_dirs(NewDirs *d) {
    for (int i = d->n - 1; i >= 0; i--) {
        char c = d->path[d->cut[i]];
        d->path[d->cut[i]] = 0;
        rmdir(d->path); /* fails, harmlessly, unless empty */
        d->path[d->cut[i]] = c;
    }
}

int cmd_download(int argc, char **argv) {
    DownloadOptions o;
    download_options_init(&o);
    const char *token_file = NULL, *pos[1];
    int n_pos = 0;
    const CliFlag own[] = {
        {"--dir", NULL, CLI_STR, &o.dir, .arg = "DIR", .help = "destination (default: models/<name>)"},
        {"--endpoint", NULL, CLI_STR, &o.endpoint, .arg = "URL",
         .help = "hub address (default: https://huggingface.co)"},
        {"--revision", NULL, CLI_STR, &o.revision, .arg = "REV", .help = "branch, tag or commit (default: main)"},
        {"--include-vision", NULL, CLI_BOOL, &o.include_vision,
         .help = "also fetch the image/video preprocessor configs"},
        {"--token-file", NULL, CLI_STR, &token_file, .arg = "FILE",
         .help = "read a hub access token from FILE (gated or private repos)"},
        {"--verify", NULL, CLI_BOOL, &o.verify_existing, .help = "re-hash weight files that are already complete"},
        {0}};
    const CliGroup groups[] = {{"download flags", own}, {0}};
    const CliSpec spec = {"download", "REPO [flags]   e.g. qwen35 download Qwen/Qwen3.5-0.8B",
                          "Fetches config, tokenizer and generation files and the safetensors weights; an interrupted "
                          "run\nresumes where it stopped. Every file is checked against the hub's size and sha256 / "
                          "git sha1.",
                          groups, 1};
    int pr = cli_parse(&spec, argc, argv, pos, &n_pos);
    if (pr != CLI_OK) return pr == CLI_HELP ? 0 : CLI_EXIT_USAGE;
    if (!n_pos) return cli_usage_error("download", "give the repo, e.g. qwen35 download Qwen/Qwen3.5-0.8B");
    o.repo = pos[0];
    Err err = {0};
    char *token = NULL;
    if (token_file && read_token(token_file, &token, &err)) return cli_error("download", "%s", err.msg);
    o.token = token;
    Bar bar = {.tty = isatty(STDERR_FILENO)};
    o.progress = on_progress;
    o.progress_user = &bar;
    DownloadStats st;
    NewDirs nd = {.n = 0};
    char dflt[4096];
    if (o.dir)
        new_dirs(&nd, o.dir);
    else if (download_default_dir(o.repo, dflt, sizeof dflt, &err) == 0)
        new_dirs(&nd, dflt);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int rc = download_model(&o, &st, &err);
    if (rc) remove_new_dirs(&nd);
    curl_global_cleanup();
    free(token);
    if (bar.open) fprintf(stderr, "\n");
    if (rc) return cli_error("download", "%s", err.msg);
    char fetched[32], total[32];
    human(fetched, sizeof fetched, (double)st.bytes_fetched);
    human(total, sizeof total, (double)st.bytes_total);
    fprintf(stderr, "%s: %d files (%s) in %s; fetched %s, %d already complete\n", o.repo, st.files, total, st.dir,
            fetched, st.skipped);
    return 0;
}
