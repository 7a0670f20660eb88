/* test_download.c — the hub downloader (src/download.c) against an HTTP/1.1 server that this test
 * starts on 127.0.0.1 (ephemeral port, one thread, stops by itself after 60 s at most). The server
 * serves repos from a temp dir: the tree API (paged, with Link headers), resolve URLs (optionally
 * through a 302 to /cdn/...), Range requests, and can cut one transfer short, flip a byte, lie
 * about a size or ignore Range. Cases: full sharded download, skip on re-run, resume after a cut
 * (second run fetches only the rest, counted at the server), a server ignoring Range, sha256 and
 * git-sha1 mismatches, oversize and short bodies, 404 / gated / bad revision, refused connection.
 * Random file contents from a printed seed; --seed N replays. --serve S only runs the server
 * for S seconds (repos test/sharded, test/single) to try the CLI against by hand. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "download.h"
#include "test.h"

/* ---- the server ---- */

typedef struct Server {
    int fd, port, stop;
    pthread_t th;
    pthread_mutex_t mu;
    char root[512]; /* <root>/<owner>/<name>/<file> */
    double deadline;
    /* knobs, set by the test between downloads */
    char cut_file[64];  /* once: end this file's body after cut_at bytes and close */
    int64_t cut_at;
    char bad_file[64];  /* flip the byte at bad_at whenever this file is served */
    int64_t bad_at;
    char lie_file[64];  /* the listing reports size + lie_delta for this file */
    int64_t lie_delta;
    int ignore_range;   /* answer Range requests with 200 and the whole file */
    int skew_range;     /* 206 replies name a start one byte after the one asked for */
    int redirect;       /* resolve -> 302 -> /cdn/<owner>/<name>/<file> */
    int page_size;      /* listing entries per page; 0 = all in one */
    /* counters */
    int64_t body_bytes; /* file body bytes sent */
    int file_requests, list_requests;
    char served[4096];  /* " <file>" per file request */
} Server;

static Server S;

static void lock(void) { pthread_mutex_lock(&S.mu); }
static void unlock(void) { pthread_mutex_unlock(&S.mu); }

static void reset_counters(void) {
    lock();
    S.body_bytes = 0;
    S.file_requests = S.list_requests = 0;
    S.served[0] = 0;
    unlock();
}

static int send_all(int c, const char *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(c, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static void reply(int c, int code, const char *status, const char *extra, const char *body) {
    char head[1024];
    int k = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\n%s\r\n",
                     code, status, strlen(body), extra ? extra : "");
    if (send_all(c, head, (size_t)k) == 0) send_all(c, body, strlen(body));
}

static void hex(const unsigned char *d, unsigned n, char *out) {
    for (unsigned i = 0; i < n; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void git_sha1(const char *p, size_t n, char out[41]) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    char pre[48];
    int k = snprintf(pre, sizeof pre, "blob %zu", n);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    EVP_DigestInit_ex(md, EVP_sha1(), NULL);
    EVP_DigestUpdate(md, pre, (size_t)k + 1);
    EVP_DigestUpdate(md, p, n);
    EVP_DigestFinal_ex(md, d, &dn);
    EVP_MD_CTX_free(md);
    hex(d, dn, out);
}

static void sha256(const char *p, size_t n, char out[65]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned dn = 0;
    EVP_Digest(p, n, d, &dn, EVP_sha256(), NULL);
    hex(d, dn, out);
}

static int name_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* GET /api/models/<repo>/tree/<rev>[?cursor=K] */
static void serve_tree(int c, const char *repo, const char *rev, int cursor) {
    char dir[1024], extra[1024] = "";
    snprintf(dir, sizeof dir, "%s/%s", S.root, repo);
    if (!strcmp(repo, "test/gated")) {
        reply(c, 403, "Forbidden", "X-Error-Code: GatedRepo\r\n", "{\"error\":\"gated\"}");
        return;
    }
    DIR *d = opendir(dir);
    if (!d) {
        reply(c, 404, "Not Found", "X-Error-Code: RepoNotFound\r\n", "{\"error\":\"Repository not found\"}");
        return;
    }
    if (strcmp(rev, "main") != 0) {
        closedir(d);
        reply(c, 404, "Not Found", "X-Error-Code: RevisionNotFound\r\n", "{\"error\":\"Invalid rev id\"}");
        return;
    }
    char *names[64];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 64;)
        if (e->d_name[0] != '.' || !strcmp(e->d_name, ".gitattributes")) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    int per = S.page_size > 0 ? S.page_size : n + 1, lo = cursor * per, hi = lo + per < n ? lo + per : n;
    cJSON *arr = cJSON_CreateArray();
    if (cursor == 0) { /* a directory entry, which the client must skip */
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "directory");
        cJSON_AddStringToObject(e, "oid", "0123456789012345678901234567890123456789");
        cJSON_AddNumberToObject(e, "size", 0);
        cJSON_AddStringToObject(e, "path", "assets");
        cJSON_AddItemToArray(arr, e);
    }
    for (int i = lo; i < hi; i++) {
        char path[1300], oid[41], sha[65], *data = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (read_file(path, &data, &len, NULL) != 0) continue;
        git_sha1(data, len, oid);
        sha256(data, len, sha);
        free(data);
        lock();
        int64_t size = (int64_t)len + (!strcmp(S.lie_file, names[i]) ? S.lie_delta : 0);
        unlock();
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "type", "file");
        cJSON_AddStringToObject(e, "oid", oid);
        cJSON_AddNumberToObject(e, "size", (double)size);
        if (strstr(names[i], ".safetensors") && !strstr(names[i], ".json")) {
            cJSON *l = cJSON_AddObjectToObject(e, "lfs");
            cJSON_AddStringToObject(l, "oid", sha);
            cJSON_AddNumberToObject(l, "size", (double)size);
            cJSON_AddNumberToObject(l, "pointerSize", 134);
        }
        cJSON_AddStringToObject(e, "path", names[i]);
        cJSON_AddItemToArray(arr, e);
    }
    if (hi < n)
        snprintf(extra, sizeof extra, "Link: <http://127.0.0.1:%d/api/models/%s/tree/main?cursor=%d>; rel=\"next\"\r\n",
                 S.port, repo, cursor + 1);
    for (int i = 0; i < n; i++) free(names[i]);
    char *body = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    lock();
    S.list_requests++;
    unlock();
    reply(c, 200, "OK", extra, body);
    free(body);
}

/* Serves <root>/<repo>/<file> with Range support and the cut / bad-byte knobs. */
static void serve_file(int c, const char *repo, const char *file, long long range) {
    char path[1300], head[512];
    char *data = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s/%s", S.root, repo, file);
    if (strstr(file, "..") || read_file(path, &data, &len, NULL) != 0) {
        reply(c, 404, "Not Found", "X-Error-Code: EntryNotFound\r\n", "{\"error\":\"Entry not found\"}");
        return;
    }
    lock();
    S.file_requests++;
    snprintf(S.served + strlen(S.served), sizeof S.served - strlen(S.served), " %s", file);
    int ignore = S.ignore_range, skew = S.skew_range, cut = !strcmp(S.cut_file, file), bad = !strcmp(S.bad_file, file);
    int64_t cut_at = S.cut_at, bad_at = S.bad_at;
    if (cut) S.cut_file[0] = 0; /* once */
    unlock();
    int64_t start = (range >= 0 && !ignore) ? range : 0, size = (int64_t)len, end = size;
    if (start >= size && size > 0) {
        reply(c, 416, "Range Not Satisfiable", NULL, "");
        free(data);
        return;
    }
    int k = start > 0 ? snprintf(head, sizeof head,
                                 "HTTP/1.1 206 Partial Content\r\nContent-Length: %lld\r\nContent-Range: bytes "
                                 "%lld-%lld/%lld\r\nConnection: close\r\n\r\n",
                                 (long long)(size - start), (long long)start + skew, (long long)size - 1, (long long)size)
                      : snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Length: %lld\r\nConnection: close\r\n\r\n",
                                 (long long)size);
    if (cut && cut_at > start && cut_at < size) end = cut_at;
    if (bad && bad_at >= 0 && bad_at < size) data[bad_at] ^= 0x5a;
    if (send_all(c, head, (size_t)k) == 0) {
        for (int64_t off = start; off < end;) {
            int64_t n = end - off < 8192 ? end - off : 8192;
            lock(); /* counted before sending, so the client cannot see bytes before the count */
            S.body_bytes += n;
            unlock();
            if (send_all(c, data + off, (size_t)n) != 0) break;
            off += n;
        }
    }
    free(data);
}

static void handle(int c) {
    char req[8192];
    size_t n = 0;
    while (n < sizeof req - 1) {
        struct pollfd p = {.fd = c, .events = POLLIN};
        if (poll(&p, 1, 2000) <= 0) return;
        ssize_t k = recv(c, req + n, sizeof req - 1 - n, 0);
        if (k <= 0) return;
        n += (size_t)k;
        req[n] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    char target[2048];
    if (sscanf(req, "GET %2047s HTTP/1.1", target) != 1) {
        reply(c, 400, "Bad Request", NULL, "");
        return;
    }
    long long range = -1;
    const char *r = strcasestr(req, "\r\nRange: bytes=");
    if (r) range = atoll(r + 15);
    char repo[256], rest[1024];
    int cursor = 0;
    if (!strncmp(target, "/api/models/", 12)) {
        char *tree = strstr(target, "/tree/"), *q = strchr(target, '?');
        if (!tree) { reply(c, 404, "Not Found", NULL, "{}"); return; }
        if (q) {
            *q = 0;
            if (!strncmp(q + 1, "cursor=", 7)) cursor = atoi(q + 8);
        }
        snprintf(repo, sizeof repo, "%.*s", (int)(tree - target - 12), target + 12);
        serve_tree(c, repo, tree + 6, cursor);
        return;
    }
    int cdn = !strncmp(target, "/cdn/", 5);
    const char *p = target + (cdn ? 5 : 1);
    const char *s1 = strchr(p, '/'), *s2 = s1 ? strchr(s1 + 1, '/') : NULL;
    if (!s2) { reply(c, 404, "Not Found", NULL, "{}"); return; }
    snprintf(repo, sizeof repo, "%.*s", (int)(s2 - p), p);
    if (cdn) { serve_file(c, repo, s2 + 1, range); return; }
    if (strncmp(s2, "/resolve/main/", 14) != 0) { reply(c, 404, "Not Found", NULL, "{}"); return; }
    snprintf(rest, sizeof rest, "%s", s2 + 14);
    lock();
    int redirect = S.redirect;
    unlock();
    if (redirect) {
        char loc[1400];
        snprintf(loc, sizeof loc, "Location: /cdn/%s/%s\r\n", repo, rest);
        reply(c, 302, "Found", loc, "redirecting");
        return;
    }
    serve_file(c, repo, rest, range);
}

static void *server_main(void *arg) {
    (void)arg;
    for (;;) {
        lock();
        int stop = S.stop || now_s() > S.deadline;
        unlock();
        if (stop) break;
        struct pollfd p = {.fd = S.fd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(S.fd, NULL, NULL);
        if (c < 0) continue;
        handle(c);
        shutdown(c, SHUT_WR);
        close(c);
    }
    close(S.fd);
    return NULL;
}

static int listen_local(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        return -1;
    *port = ntohs(a.sin_port);
    return fd;
}

/* ---- fixtures ---- */

static char TMP[256];
static Rng RNG;

static void put(const char *repo, const char *name, const char *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/hub/%s", TMP, repo);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s/hub", TMP);
    mkdir(cmd, 0755);
    snprintf(cmd, sizeof cmd, "%s/hub/%.*s", TMP, (int)(strchr(repo, '/') - repo), repo);
    mkdir(cmd, 0755);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/hub/%s/%s", TMP, repo, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) fprintf(stderr, "cannot write %s\n", path);
    if (f) fclose(f);
}

static void put_text(const char *repo, const char *name, const char *text) { put(repo, name, text, strlen(text)); }

static void put_random(const char *repo, const char *name, size_t n, int printable) {
    char *p = malloc(n);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_u64(&RNG);
        p[i] = printable ? (char)(' ' + r % 94) : (char)r;
    }
    put(repo, name, p, n);
    free(p);
}

static int64_t file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* 1 when <out>/<name> exists and equals the repo's <name>. */
static int same_file(const char *repo, const char *out, const char *name) {
    char a[1024], b[1024], *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    snprintf(a, sizeof a, "%s/hub/%s/%s", TMP, repo, name);
    snprintf(b, sizeof b, "%s/%s/%s", TMP, out, name);
    int ok = read_file(a, &x, &nx, NULL) == 0 && read_file(b, &y, &ny, NULL) == 0 && nx == ny &&
             memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return ok;
}

static int exists_in(const char *out, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s/%s", TMP, out, name);
    return file_size(p) >= 0;
}

static int64_t repo_size(const char *repo, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/hub/%s/%s", TMP, repo, name);
    return file_size(p);
}

/* Progress events, checked for order and bounds. */
typedef struct Events {
    int starts, datas, dones, skips, bad;
    int64_t last, max_resumed; /* largest resumed offset seen at a START */
    char file[128];
} Events;

static void on_progress(void *user, const DownloadProgress *p) {
    Events *ev = user;
    if (p->index < 0 || p->index >= p->count || p->all_done > p->all_size || p->done > p->size) ev->bad++;
    switch (p->event) {
    case DL_EV_START:
        ev->starts++;
        if (p->resumed > ev->max_resumed) ev->max_resumed = p->resumed;
        snprintf(ev->file, sizeof ev->file, "%s", p->file);
        ev->last = p->done;
        if (p->done != p->resumed) ev->bad++;
        break;
    case DL_EV_DATA:
        ev->datas++;
        if (strcmp(ev->file, p->file) != 0 || p->done <= ev->last) ev->bad++;
        ev->last = p->done;
        break;
    case DL_EV_DONE:
        ev->dones++;
        if (strcmp(ev->file, p->file) != 0 || p->done != p->size) ev->bad++;
        break;
    case DL_EV_SKIP: ev->skips++; break;
    default: ev->bad++;
    }
}

static int fetch(const char *repo, const char *out, int vision, const char *rev, DownloadStats *st, Events *ev,
                 Err *err) {
    char endpoint[64], dir[512];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d/", S.port); /* trailing '/' is dropped */
    snprintf(dir, sizeof dir, "%s/%s", TMP, out);
    DownloadOptions o;
    download_options_init(&o);
    o.repo = repo;
    o.dir = dir;
    o.endpoint = endpoint;
    o.revision = rev;
    o.include_vision = vision;
    o.connect_timeout_s = 5;
    o.stall_timeout_s = 5;
    if (ev) memset(ev, 0, sizeof *ev);
    o.progress = ev ? on_progress : NULL;
    o.progress_user = ev;
    err_clear(err);
    reset_counters();
    return download_model(&o, st, err);
}

static void make_repos(void) {
    const char *sh = "test/sharded";
    put_text(sh, "config.json", "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"]}\n");
    put_text(sh, "generation_config.json", "{\"temperature\": 0.6}\n");
    put_random(sh, "tokenizer.json", 40000 + rng_u64(&RNG) % 5000, 1);
    put_text(sh, "tokenizer_config.json", "{}\n");
    put_random(sh, "vocab.json", 9000, 1);
    put_random(sh, "merges.txt", 7000, 1);
    put_text(sh, "chat_template.jinja", "{% for m in messages %}{{ m.content }}{% endfor %}");
    put_text(sh, "preprocessor_config.json", "{\"patch_size\": 16}\n");
    put_text(sh, "README.md", "# test\n");
    put_text(sh, ".gitattributes", "*.safetensors filter=lfs\n");
    put_random(sh, "logo.png", 3000, 0);
    put_random(sh, "pytorch_model.bin", 5000, 0);
    put_random(sh, "consolidated.safetensors", 4000, 0);
    put_random(sh, "model-00001-of-00002.safetensors", 300000 + rng_u64(&RNG) % 1000, 0);
    put_random(sh, "model-00002-of-00002.safetensors", 200000 + rng_u64(&RNG) % 1000, 0);
    put_text(sh, "model.safetensors.index.json",
             "{\"metadata\": {}, \"weight_map\": {\"a.weight\": \"model-00001-of-00002.safetensors\", "
             "\"b.weight\": \"model-00002-of-00002.safetensors\", \"c.weight\": \"model-00001-of-00002.safetensors\"}}");
    const char *si = "test/single";
    put_text(si, "config.json", "{\"model_type\": \"qwen3\"}\n");
    put_random(si, "tokenizer.json", 20000, 1);
    put(si, "merges.txt", "", 0); /* a zero-byte file */
    put_random(si, "model.safetensors", 400000 + rng_u64(&RNG) % 1000, 0);
    put_text(si, "README.md", "# single\n");
    put_text("test/noconfig", "model.safetensors", "x");
    put_text("test/noweights", "config.json", "{}");
    put_text("test/badindex", "config.json", "{}");
    put_text("test/badindex", "model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../evil.safetensors\"}}");
}

/* ---- cases ---- */

static void test_download_args(void) {
    char dir[256];
    Err err = {0};
    CHECK(download_default_dir("Qwen/Qwen3.5-0.8B", dir, sizeof dir, &err) == 0 && !strcmp(dir, "models/Qwen3.5-0.8B"),
          "dir '%s' (%s)", dir, err.msg);
    CHECK(download_default_dir("gpt2", dir, sizeof dir, &err) == 0 && !strcmp(dir, "models/gpt2"), "dir '%s'", dir);
    const char *bad[] = {"", "/x", "a/", "a/b/c", "../x", "a/..", "a/.b", "a b/c", "a/b-", "a--b/c", NULL};
    for (int i = 0; bad[i]; i++)
        CHECK(download_default_dir(bad[i], dir, sizeof dir, &err) == Q35_ERR_ARG, "repo '%s' accepted", bad[i]);
    CHECK(download_default_dir("Qwen/Qwen3.5-0.8B", dir, 8, &err) == Q35_ERR_ARG, "tiny buffer accepted");
    DownloadOptions o;
    download_options_init(&o);
    o.repo = "a/b/c";
    CHECK(download_model(&o, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "a/b/c"), "bad repo: %s", err.msg);
    o.repo = "a/b";
    o.endpoint = "ftp://x";
    CHECK(download_model(&o, NULL, &err) == Q35_ERR_ARG && strstr(err.msg, "ftp://x"), "bad endpoint: %s", err.msg);
}

static const char *SHARDED_PICKED[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
    "chat_template.jinja", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors", NULL,
};

static void test_download_full(void) {
    const char *repo = "test/sharded";
    DownloadStats st;
    Events ev;
    Err err;
    lock();
    S.redirect = 1;
    S.page_size = 4;
    unlock();
    int rc = fetch(repo, "out_full", 0, NULL, &st, &ev, &err);
    CHECK(rc == 0, "full download: %s", err.msg);
    int64_t total = 0;
    for (int i = 0; SHARDED_PICKED[i]; i++) {
        CHECK(same_file(repo, "out_full", SHARDED_PICKED[i]), "%s missing or different", SHARDED_PICKED[i]);
        char part[300];
        snprintf(part, sizeof part, "%s.part", SHARDED_PICKED[i]);
        CHECK(!exists_in("out_full", part), "%s left behind", part);
        total += repo_size(repo, SHARDED_PICKED[i]);
    }
    const char *skipped[] = {"README.md", "logo.png", "pytorch_model.bin", "consolidated.safetensors",
                             "preprocessor_config.json", ".gitattributes", NULL};
    for (int i = 0; skipped[i]; i++) {
        CHECK(!exists_in("out_full", skipped[i]), "%s downloaded", skipped[i]);
        char word[80];
        snprintf(word, sizeof word, " %s", skipped[i]);
        lock();
        CHECK(!strstr(S.served, word), "%s requested: served%s", skipped[i], S.served);
        unlock();
    }
    lock();
    CHECK(S.list_requests == 4, "16 files at 4 per page: %d listing requests", S.list_requests);
    CHECK(S.file_requests == 10 && S.body_bytes == total, "%d file requests, %lld of %lld bytes", S.file_requests,
          (long long)S.body_bytes, (long long)total);
    unlock();
    CHECK(st.files == 10 && st.skipped == 0, "files %d skipped %d", st.files, st.skipped);
    CHECK(st.bytes_fetched == total && st.bytes_total == total, "stats fetched %lld total %lld, want %lld",
          (long long)st.bytes_fetched, (long long)st.bytes_total, (long long)total);
    CHECK(ev.starts == 10 && ev.dones == 10 && ev.skips == 0 && ev.bad == 0 && ev.datas >= 10,
          "progress: %d starts %d dones %d skips %d data %d bad", ev.starts, ev.dones, ev.skips, ev.datas, ev.bad);

    /* Again: everything is in place, nothing is fetched. */
    rc = fetch(repo, "out_full", 0, NULL, &st, &ev, &err);
    lock();
    CHECK(rc == 0 && S.file_requests == 0 && S.body_bytes == 0, "re-run: rc %d, %d requests, %lld bytes (%s)", rc,
          S.file_requests, (long long)S.body_bytes, err.msg);
    unlock();
    CHECK(st.skipped == 10 && st.bytes_fetched == 0 && ev.skips == 10, "re-run skipped %d fetched %lld", st.skipped,
          (long long)st.bytes_fetched);

    /* With vision files: only preprocessor_config.json is new. */
    rc = fetch(repo, "out_full", 1, NULL, &st, &ev, &err);
    lock();
    CHECK(rc == 0 && S.file_requests == 1 && S.body_bytes == repo_size(repo, "preprocessor_config.json"),
          "vision: rc %d, served%s (%s)", rc, S.served, err.msg);
    unlock();
    CHECK(same_file(repo, "out_full", "preprocessor_config.json"), "preprocessor_config.json differs");

    /* A complete small file with the wrong content (same size) fails its git sha1 and is fetched again. */
    char path[1024];
    snprintf(path, sizeof path, "%s/out_full/vocab.json", TMP);
    FILE *f = fopen(path, "r+b");
    if (f) {
        fseek(f, 100, SEEK_SET);
        fputc('\x01', f);
        fclose(f);
    }
    rc = fetch(repo, "out_full", 0, NULL, &st, &ev, &err);
    lock();
    CHECK(rc == 0 && S.file_requests == 1 && strstr(S.served, "vocab.json"), "stale vocab.json: served%s (%s)",
          S.served, err.msg);
    unlock();
    CHECK(same_file(repo, "out_full", "vocab.json"), "vocab.json not repaired");
    lock();
    S.redirect = 0;
    S.page_size = 0;
    unlock();
}

/* Cut model.safetensors short; the second run must ask for and get only the missing bytes. */
static void test_download_resume(int ignore_range) {
    const char *repo = "test/single", *out = ignore_range ? "out_norange" : "out_resume";
    int64_t size = repo_size(repo, "model.safetensors");
    int64_t cut = 1000 + (int64_t)(rng_u64(&RNG) % (uint64_t)(size - 2000));
    DownloadStats st;
    Events ev;
    Err err;
    lock();
    snprintf(S.cut_file, sizeof S.cut_file, "model.safetensors");
    S.cut_at = cut;
    S.redirect = 1;
    unlock();
    int rc = fetch(repo, out, 0, NULL, &st, &ev, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "model.safetensors") && strstr(err.msg, "resume"),
          "cut at %lld: rc %d: %s", (long long)cut, rc, err.msg);
    char part[1024];
    snprintf(part, sizeof part, "%s/%s/model.safetensors.part", TMP, out);
    CHECK(!exists_in(out, "model.safetensors") && file_size(part) == cut, "after cut: part %lld bytes, want %lld",
          (long long)file_size(part), (long long)cut);
    CHECK(same_file(repo, out, "config.json") && same_file(repo, out, "merges.txt"), "small files missing");

    lock();
    S.ignore_range = ignore_range;
    unlock();
    rc = fetch(repo, out, 0, NULL, &st, &ev, &err);
    CHECK(rc == 0 && same_file(repo, out, "model.safetensors"), "resume: rc %d: %s", rc, err.msg);
    CHECK(file_size(part) < 0, "part left behind");
    int64_t want = ignore_range ? size : size - cut;
    lock();
    CHECK(S.body_bytes == want && S.file_requests == 1, "resume served %lld bytes in %d requests, want %lld",
          (long long)S.body_bytes, S.file_requests, (long long)want);
    S.ignore_range = 0;
    S.redirect = 0;
    unlock();
    CHECK(st.bytes_fetched == want && ev.max_resumed == cut, "fetched %lld, resumed from %lld",
          (long long)st.bytes_fetched, (long long)ev.max_resumed);
    if (!ignore_range) CHECK(ev.bad == 0, "progress events out of order: %d", ev.bad);
}

/* A 206 reply starting elsewhere than asked: refused, the part removed. */
static void test_download_range_skew(void) {
    const char *repo = "test/single";
    int64_t size = repo_size(repo, "model.safetensors");
    Err err;
    lock();
    snprintf(S.cut_file, sizeof S.cut_file, "model.safetensors");
    S.cut_at = size / 2;
    unlock();
    int rc = fetch(repo, "out_skew", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET, "cut: rc %d: %s", rc, err.msg);
    lock();
    S.skew_range = 1;
    unlock();
    rc = fetch(repo, "out_skew", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "model.safetensors") && !exists_in("out_skew", "model.safetensors.part"),
          "skewed range: rc %d: %s", rc, err.msg);
    lock();
    S.skew_range = 0;
    unlock();
    rc = fetch(repo, "out_skew", 0, NULL, NULL, NULL, &err);
    CHECK(rc == 0 && same_file(repo, "out_skew", "model.safetensors"), "after skew: rc %d: %s", rc, err.msg);
}

static void test_download_bad_hash(const char *file, const char *hash_word) {
    const char *repo = !strcmp(file, "model.safetensors") ? "test/single" : "test/sharded";
    char out[64];
    snprintf(out, sizeof out, "out_bad_%s", hash_word);
    int64_t size = repo_size(repo, file);
    DownloadStats st;
    Err err;
    lock();
    snprintf(S.bad_file, sizeof S.bad_file, "%s", file);
    S.bad_at = (int64_t)(rng_u64(&RNG) % (uint64_t)size);
    unlock();
    int rc = fetch(repo, out, 0, NULL, &st, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, file) && strstr(err.msg, hash_word), "bad byte in %s: rc %d: %s", file,
          rc, err.msg);
    char part[300];
    snprintf(part, sizeof part, "%s.part", file);
    CHECK(!exists_in(out, file) && !exists_in(out, part), "%s: bad download kept", file);
    lock();
    S.bad_file[0] = 0;
    unlock();
    rc = fetch(repo, out, 0, NULL, &st, NULL, &err);
    CHECK(rc == 0 && same_file(repo, out, file), "after a bad byte, a clean run: rc %d: %s", rc, err.msg);
}

/* A .part whose bytes are not a prefix of the file: resumed, fails the hash, fetched again
 * from byte 0 in the same run. */
static void test_download_corrupt_part(void) {
    const char *repo = "test/single";
    char dir[512], part[600];
    snprintf(dir, sizeof dir, "%s/out_corrupt", TMP);
    mkdir(dir, 0755);
    snprintf(part, sizeof part, "%s/model.safetensors.part", dir);
    FILE *f = fopen(part, "wb");
    for (int i = 0; f && i < 5000; i++) fputc((int)(rng_u64(&RNG) & 0xff), f);
    if (f) fclose(f);
    Err err;
    Events ev;
    int64_t size = repo_size(repo, "model.safetensors");
    int rc = fetch(repo, "out_corrupt", 0, NULL, NULL, &ev, &err);
    CHECK(rc == 0 && same_file(repo, "out_corrupt", "model.safetensors") && file_size(part) < 0,
          "corrupt part: rc %d: %s", rc, err.msg);
    lock();
    int64_t small = repo_size(repo, "config.json") + repo_size(repo, "tokenizer.json");
    CHECK(S.body_bytes == small + size - 5000 + size && S.file_requests == 4, "corrupt part: served %lld bytes in %d requests",
          (long long)S.body_bytes, S.file_requests);
    unlock();
    CHECK(ev.max_resumed == 5000, "resumed from %lld", (long long)ev.max_resumed);
}

static void test_download_size_lie(int64_t delta, const char *word) {
    Err err;
    lock();
    snprintf(S.lie_file, sizeof S.lie_file, "model.safetensors");
    S.lie_delta = delta;
    unlock();
    int rc = fetch("test/single", delta < 0 ? "out_lie_small" : "out_lie_big", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "model.safetensors") && strstr(err.msg, word),
          "listed size %+lld: rc %d: %s", (long long)delta, rc, err.msg);
    lock();
    S.lie_file[0] = 0;
    unlock();
}

static void test_download_http_errors(void) {
    Err err;
    int rc = fetch("test/missing", "out_missing", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "test/missing") && strstr(err.msg, "not found") &&
              strstr(err.msg, "404"), "missing repo: rc %d: %s", rc, err.msg);
    rc = fetch("test/gated", "out_gated", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "gated") && strstr(err.msg, "403"), "gated: rc %d: %s", rc, err.msg);
    rc = fetch("test/single", "out_rev", 0, "v9", NULL, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strstr(err.msg, "revision 'v9' not found"), "bad revision: rc %d: %s", rc, err.msg);
    rc = fetch("test/noconfig", "out_noconfig", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "config.json"), "no config: rc %d: %s", rc, err.msg);
    rc = fetch("test/noweights", "out_noweights", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "model.safetensors"), "no weights: rc %d: %s", rc, err.msg);
    rc = fetch("test/badindex", "out_badindex", 0, NULL, NULL, NULL, &err);
    CHECK(rc == Q35_ERR_FORMAT && strstr(err.msg, "evil"), "shard outside dir: rc %d: %s", rc, err.msg);
}

static void test_download_refused(void) {
    int port = 0, fd = listen_local(&port);
    close(fd); /* nothing listens there now */
    char endpoint[64], dir[512], want[80];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", port);
    snprintf(dir, sizeof dir, "%s/out_refused", TMP);
    snprintf(want, sizeof want, "cannot reach %s: ", endpoint);
    DownloadOptions o;
    download_options_init(&o);
    o.repo = "test/single";
    o.dir = dir;
    o.endpoint = endpoint;
    o.connect_timeout_s = 5;
    Err err = {0};
    double t0 = now_s();
    int rc = download_model(&o, NULL, &err);
    CHECK(rc == Q35_ERR_NET && strncmp(err.msg, want, strlen(want)) == 0, "refused: rc %d: %s", rc, err.msg);
    CHECK(now_s() - t0 < 5, "refused took %.1f s", now_s() - t0);
}

static int rm_entry(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb, (void)type, (void)ftw;
    return remove(p);
}

int main(int argc, char **argv) {
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    double serve_s = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--serve")) serve_s = atof(argv[i + 1]);
    }
    printf("test_download: seed %llu\n", (unsigned long long)seed);
    rng_seed(&RNG, seed);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    snprintf(TMP, sizeof TMP, "/tmp/q35dl.XXXXXX");
    if (!mkdtemp(TMP)) {
        perror("mkdtemp");
        return 1;
    }
    make_repos();
    pthread_mutex_init(&S.mu, NULL);
    snprintf(S.root, sizeof S.root, "%s/hub", TMP);
    S.deadline = now_s() + (serve_s > 0 ? serve_s : 60);
    S.fd = listen_local(&S.port);
    CHECK(S.fd >= 0, "cannot listen on 127.0.0.1");
    if (serve_s > 0 && S.fd >= 0) {
        printf("serving %s/hub at http://127.0.0.1:%d for %.0f s\n", TMP, S.port, serve_s);
        fflush(stdout);
        S.redirect = 1;
        server_main(NULL);
    } else if (S.fd >= 0 && pthread_create(&S.th, NULL, server_main, NULL) == 0) {
        test_download_args();
        test_download_full();
        test_download_resume(0);
        test_download_resume(1);
        test_download_range_skew();
        test_download_bad_hash("model.safetensors", "sha256");
        test_download_bad_hash("tokenizer.json", "sha1");
        test_download_corrupt_part();
        test_download_size_lie(-7, "more than");
        test_download_size_lie(5, "got");
        test_download_http_errors();
        test_download_refused();
        lock();
        S.stop = 1;
        unlock();
        pthread_join(S.th, NULL);
    }
    nftw(TMP, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    curl_global_cleanup();
    return TEST_SUMMARY("download");
}
