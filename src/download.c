/* download.c — Hugging Face hub download: list the repo, pick the files, fetch, verify, rename.
 * Listing: GET {endpoint}/api/models/{repo}/tree/{rev} -> [{type, path, size, oid, lfs:{oid, size}}],
 *          further pages through a "Link: <url>; rel=\"next\"" header.
 * Files:   GET {endpoint}/{repo}/resolve/{rev}/{path} (redirects followed) into <dir>/<path>.part,
 *          with "Range: bytes=k-" when k bytes are already there (a 200 reply restarts from 0).
 * Hashes:  LFS files: sha256(bytes) == lfs.oid; other files: git blob sha1("blob <size>\0" bytes)
 *          == oid. Computed while writing; on resume the existing part is hashed first. */
#define _POSIX_C_SOURCE 200809L
#include "download.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_ENDPOINT "https://huggingface.co"
#define LISTING_MAX_BYTES (64 << 20)

/* Files an inference run reads; all but config.json are optional (fetched when listed). */
static const char *const TEXT_FILES[] = {
    "config.json",  "generation_config.json", "tokenizer.json",      "tokenizer_config.json",
    "vocab.json",   "merges.txt",             "chat_template.jinja", NULL,
};
static const char *const VISION_FILES[] = {"preprocessor_config.json", "video_preprocessor_config.json", NULL};

typedef struct RepoFile {
    char *path;
    int64_t size;
    char oid[65];    /* git blob sha1, hex */
    char sha256[65]; /* lfs.oid (hex sha256); "" when the file is not in LFS */
} RepoFile;

typedef struct Listing {
    RepoFile *v;
    int n, cap;
} Listing;

/* Fields of the last response's headers (reset at each status line, so after a redirect
 * chain they describe the final response). */
typedef struct Headers {
    char error_code[64];  /* X-Error-Code: RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound */
    char error_msg[128];  /* X-Error-Message */
    char next[2048];      /* Link: <url>; rel="next" */
    int64_t range_start;  /* Content-Range: bytes <start>-<end>/<size>; -1 when absent */
} Headers;

typedef struct Hub { /* state of one download_model call */
    const DownloadOptions *o;
    char endpoint[512]; /* no trailing '/' */
    const char *revision;
    char *rev_esc; /* revision, URL-escaped ("refs/pr/1" -> "refs%2Fpr%2F1") */
    CURL *curl;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
    Headers h;
    DownloadProgress pr;
    int64_t bytes_before; /* sizes of the files finished before the current one */
    double t0;            /* when the current file's transfer started */
    DownloadStats *st;
} Hub;

void download_options_init(DownloadOptions *o) { memset(o, 0, sizeof *o); }

/* ---- names and paths ---- */

/* One part of a repo id: [A-Za-z0-9._-]{1,96}, no "--" or "..", no '-' or '.' at either end. */
static int repo_part_ok(const char *s, size_t n) {
    if (n == 0 || n > 96 || s[0] == '-' || s[0] == '.' || s[n - 1] == '-' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                 c == '_' || c == '.';
        if (!ok) return 0;
        if (i > 0 && (c == '-' || c == '.') && s[i - 1] == c) return 0;
    }
    return 1;
}

/* Checks "owner/name" or "name"; *name points at the name part. */
static int repo_ok(const char *repo, const char **name) {
    if (!repo) return 0;
    const char *slash = strchr(repo, '/');
    if (!slash) {
        *name = repo;
        return repo_part_ok(repo, strlen(repo));
    }
    *name = slash + 1;
    return repo_part_ok(repo, (size_t)(slash - repo)) && repo_part_ok(slash + 1, strlen(slash + 1));
}

int download_default_dir(const char *repo, char *out, size_t n, Err *err) {
    const char *name = NULL;
    if (!repo_ok(repo, &name))
        return err_set(err, Q35_ERR_ARG, "bad repo id '%s' (want owner/name, e.g. Qwen/Qwen3.5-0.8B)",
                       repo ? repo : "");
    int k = snprintf(out, n, "models/%s", name);
    if (k < 0 || (size_t)k >= n) return err_set(err, Q35_ERR_ARG, "models/%s: path too long", name);
    return 0;
}

/* A file name we are willing to write into dir: no directories, not hidden, not too long. */
static int file_name_ok(const char *s) {
    size_t n = strlen(s);
    return n > 0 && n < 200 && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\');
}

static int mkdir_p(const char *dir, Err *err) {
    char p[1024];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return err_set(err, Q35_ERR_ARG, "%s: path too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return err_set(err, Q35_ERR_IO, "mkdir %s: %s", p, strerror(errno));
        *s = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return err_set(err, Q35_ERR_IO, "%s: not a directory", dir);
    return 0;
}

/* ---- hashing (OpenSSL EVP) ---- */

typedef struct Hash {
    EVP_MD_CTX *md;
} Hash;

/* (Re)starts the hash a file is checked with: sha256 for LFS, git blob sha1 otherwise. */
static int hash_begin(Hash *h, const RepoFile *f) {
    if (!h->md && !(h->md = EVP_MD_CTX_new())) return -1;
    if (f->sha256[0]) return EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) ? 0 : -1;
    if (!EVP_DigestInit_ex(h->md, EVP_sha1(), NULL)) return -1;
    char pre[48];
    int k = snprintf(pre, sizeof pre, "blob %lld", (long long)f->size);
    return EVP_DigestUpdate(h->md, pre, (size_t)k + 1) ? 0 : -1; /* the NUL is part of the header */
}

static void hash_hex(Hash *h, char out[65]) {
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned n = 0;
    EVP_DigestFinal_ex(h->md, d, &n);
    for (unsigned i = 0; i < n && i < 32; i++) snprintf(out + 2 * i, 3, "%02x", d[i]);
    out[2 * (n < 32 ? n : 32)] = 0;
}

static const char *expected_hash(const RepoFile *f) { return f->sha256[0] ? f->sha256 : f->oid; }
static const char *hash_name(const RepoFile *f) { return f->sha256[0] ? "sha256" : "git sha1"; }

/* Feeds the first n bytes of fd into h. */
static int hash_fd(Hash *h, int fd, int64_t n, const char *path, Err *err) {
    size_t cap = 1 << 20;
    char *buf = malloc(cap);
    if (!buf) return err_set(err, Q35_ERR_OOM, "%s: out of memory hashing", path);
    int64_t off = 0;
    while (off < n) {
        size_t want = (size_t)(n - off) < cap ? (size_t)(n - off) : cap;
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got <= 0) {
            free(buf);
            return err_set(err, Q35_ERR_IO, "%s: read failed: %s", path, got < 0 ? strerror(errno) : "short file");
        }
        EVP_DigestUpdate(h->md, buf, (size_t)got);
        off += got;
    }
    free(buf);
    return 0;
}

/* ---- HTTP ---- */

static size_t on_header(char *p, size_t sz, size_t nm, void *user) {
    Headers *h = user;
    size_t n = sz * nm, k = n < 2047 ? n : 2047;
    char line[2048];
    memcpy(line, p, k);
    line[k] = 0;
    while (k > 0 && (line[k - 1] == '\r' || line[k - 1] == '\n')) line[--k] = 0;
    if (strncmp(line, "HTTP/", 5) == 0) { /* a new response (first, or after a redirect) */
        memset(h, 0, sizeof *h);
        h->range_start = -1;
        return n;
    }
    char *colon = strchr(line, ':');
    if (!colon) return n;
    *colon = 0;
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    if (!strcasecmp(line, "x-error-code")) {
        snprintf(h->error_code, sizeof h->error_code, "%s", v);
    } else if (!strcasecmp(line, "x-error-message")) {
        snprintf(h->error_msg, sizeof h->error_msg, "%s", v);
    } else if (!strcasecmp(line, "content-range")) {
        long long s;
        if (sscanf(v, "bytes %lld-", &s) == 1) h->range_start = s;
    } else if (!strcasecmp(line, "link")) { /* <url>; rel="next", <url>; rel="last" */
        for (char *lt = strchr(v, '<'); lt; lt = strchr(lt + 1, '<')) {
            char *gt = strchr(lt, '>');
            if (!gt) break;
            char *end = strchr(gt, ',');
            size_t plen = end ? (size_t)(end - gt) : strlen(gt);
            char params[256];
            snprintf(params, sizeof params, "%.*s", (int)(plen < 255 ? plen : 255), gt);
            if (strstr(params, "rel=\"next\"") || strstr(params, "rel=next")) {
                snprintf(h->next, sizeof h->next, "%.*s", (int)(gt - lt - 1), lt + 1);
                break;
            }
        }
    }
    return n;
}

/* Resets the handle (keeping its connections) and sets what every request shares. */
static void request_setup(Hub *hub, const char *url) {
    CURL *c = hub->curl;
    long connect_s = hub->o->connect_timeout_s > 0 ? hub->o->connect_timeout_s : 30;
    long stall_s = hub->o->stall_timeout_s > 0 ? hub->o->stall_timeout_s : 60;
    curl_easy_reset(c);
    hub->errbuf[0] = 0;
    memset(&hub->h, 0, sizeof hub->h);
    hub->h.range_start = -1;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "qwen35-download/1");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, connect_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_s);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, hub->errbuf);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &hub->h);
    if (hub->hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hub->hdrs); /* not resent to other hosts */
}

static const char *curl_msg(Hub *hub, CURLcode rc) { return hub->errbuf[0] ? hub->errbuf : curl_easy_strerror(rc); }

static int unreachable(Hub *hub, CURLcode rc, Err *err) {
    return err_set(err, Q35_ERR_NET, "cannot reach %s: %s", hub->endpoint, curl_msg(hub, rc));
}

/* One line for an HTTP error status; file is NULL for the listing. */
static int http_error(Hub *hub, long code, const char *file, Err *err) {
    const char *ec = hub->h.error_code, *repo = hub->o->repo;
    const char *why = hub->o->token ? "the token has no access" : "no token was given";
    if (!strcmp(ec, "GatedRepo"))
        return err_set(err, Q35_ERR_NET, "%s is a gated repo: accept its terms on the model page and use a token "
                       "with access (HTTP %ld)", repo, code);
    if (!strcmp(ec, "RevisionNotFound"))
        return err_set(err, Q35_ERR_NET, "revision '%s' not found in %s (HTTP %ld)", hub->revision, repo, code);
    if (!strcmp(ec, "EntryNotFound") || (file && code == 404))
        return err_set(err, Q35_ERR_NET, "%s: %s not found at revision '%s' (HTTP %ld)", repo, file ? file : "file",
                       hub->revision, code);
    if (!strcmp(ec, "RepoNotFound") || code == 404 || code == 401)
        return err_set(err, Q35_ERR_NET, "repository %s not found at %s, or it is private and %s (HTTP %ld)", repo,
                       hub->endpoint, why, code);
    if (code == 403)
        return err_set(err, Q35_ERR_NET, "access to %s denied: gated or private repo, %s (HTTP 403)", repo, why);
    return err_set(err, Q35_ERR_NET, "%s: HTTP %ld fetching %s%s%s", hub->endpoint, code,
                   file ? file : "the file listing", hub->h.error_msg[0] ? ": " : "", hub->h.error_msg);
}

/* ---- listing ---- */

typedef struct Buf {
    char *p;
    size_t n, cap;
} Buf;

static size_t on_mem(char *p, size_t sz, size_t nm, void *user) {
    Buf *b = user;
    size_t n = sz * nm;
    if (b->n + n + 1 > LISTING_MAX_BYTES) return 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return 0;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

static void listing_free(Listing *ls) {
    for (int i = 0; i < ls->n; i++) free(ls->v[i].path);
    free(ls->v);
    memset(ls, 0, sizeof *ls);
}

static const RepoFile *listing_find(const Listing *ls, const char *path) {
    for (int i = 0; i < ls->n; i++)
        if (!strcmp(ls->v[i].path, path)) return &ls->v[i];
    return NULL;
}

static int json_size(const cJSON *j, int64_t *out) {
    if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0) return 0;
    *out = (int64_t)j->valuedouble;
    return (double)*out == j->valuedouble;
}

static int hex_ok(const char *s, size_t n) {
    if (strlen(s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* Appends the files of one listing page (a JSON array) to ls. */
static int listing_parse(Hub *hub, const Buf *b, Listing *ls, Err *err) {
    cJSON *root = cJSON_ParseWithLength(b->p ? b->p : "", b->n);
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return err_set(err, Q35_ERR_FORMAT, "%s: the file listing of %s is not a JSON array", hub->endpoint,
                       hub->o->repo);
    }
    int rc = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "type");
        const cJSON *path = cJSON_GetObjectItemCaseSensitive(e, "path");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "file") != 0) continue; /* directories */
        const cJSON *oid = cJSON_GetObjectItemCaseSensitive(e, "oid");
        const cJSON *lfs = cJSON_GetObjectItemCaseSensitive(e, "lfs");
        RepoFile f = {0};
        if (!cJSON_IsString(path) || !json_size(cJSON_GetObjectItemCaseSensitive(e, "size"), &f.size) ||
            !cJSON_IsString(oid) || !hex_ok(oid->valuestring, 40)) {
            rc = err_set(err, Q35_ERR_FORMAT, "%s: bad entry in the file listing of %s (%s)", hub->endpoint,
                         hub->o->repo, cJSON_IsString(path) ? path->valuestring : "no path");
            break;
        }
        snprintf(f.oid, sizeof f.oid, "%s", oid->valuestring);
        if (lfs && !cJSON_IsNull(lfs)) {
            const cJSON *sha = cJSON_GetObjectItemCaseSensitive(lfs, "oid");
            int64_t lsize = -1;
            if (!cJSON_IsString(sha) || !hex_ok(sha->valuestring, 64) ||
                !json_size(cJSON_GetObjectItemCaseSensitive(lfs, "size"), &lsize) || lsize != f.size) {
                rc = err_set(err, Q35_ERR_FORMAT, "%s: bad lfs record for %s in the file listing", hub->endpoint,
                             path->valuestring);
                break;
            }
            snprintf(f.sha256, sizeof f.sha256, "%s", sha->valuestring);
        }
        if (ls->n == ls->cap) {
            int cap = ls->cap ? 2 * ls->cap : 64;
            RepoFile *v = realloc(ls->v, (size_t)cap * sizeof *v);
            if (!v) {
                rc = err_set(err, Q35_ERR_OOM, "out of memory reading the file listing");
                break;
            }
            ls->v = v;
            ls->cap = cap;
        }
        if (!(f.path = strdup(path->valuestring))) {
            rc = err_set(err, Q35_ERR_OOM, "out of memory reading the file listing");
            break;
        }
        ls->v[ls->n++] = f;
    }
    cJSON_Delete(root);
    return rc;
}

static int hub_list(Hub *hub, Listing *ls, Err *err) {
    char url[2048];
    snprintf(url, sizeof url, "%s/api/models/%s/tree/%s", hub->endpoint, hub->o->repo, hub->rev_esc);
    for (int page = 0; page < 10000 && url[0]; page++) {
        Buf b = {0};
        request_setup(hub, url);
        curl_easy_setopt(hub->curl, CURLOPT_WRITEFUNCTION, on_mem);
        curl_easy_setopt(hub->curl, CURLOPT_WRITEDATA, &b);
        CURLcode rc = curl_easy_perform(hub->curl);
        long code = 0;
        curl_easy_getinfo(hub->curl, CURLINFO_RESPONSE_CODE, &code);
        int r = 0;
        if (rc != CURLE_OK) r = code >= 400 ? http_error(hub, code, NULL, err) : unreachable(hub, rc, err);
        else if (code != 200) r = http_error(hub, code, NULL, err);
        else r = listing_parse(hub, &b, ls, err);
        free(b.p);
        if (r) return r;
        int k = hub->h.next[0] == '/' /* a relative link */
                    ? snprintf(url, sizeof url, "%s%s", hub->endpoint, hub->h.next)
                    : snprintf(url, sizeof url, "%s", hub->h.next);
        if (k < 0 || (size_t)k >= sizeof url)
            return err_set(err, Q35_ERR_NET, "%s: next-page link of the file listing is too long", hub->endpoint);
    }
    return 0;
}

/* ---- one file ---- */

enum { FAIL_NONE, FAIL_STATUS, FAIL_TOO_LONG, FAIL_RANGE, FAIL_IO };

typedef struct Fetch {
    Hub *hub;
    const RepoFile *f;
    int fd;
    int64_t off; /* bytes in the part file, all fed to hash */
    Hash hash;
    int started; /* first body byte seen */
    long code;
    int fail, io_errno;
} Fetch;

static void report(Hub *hub, int event, const RepoFile *f, int64_t done) {
    DownloadProgress *p = &hub->pr;
    p->event = event;
    p->file = f->path;
    p->done = done;
    p->size = f->size;
    p->all_done = hub->bytes_before + done;
    p->seconds = now_s() - hub->t0;
    if (hub->o->progress) hub->o->progress(hub->o->progress_user, p);
}

static size_t on_file_data(char *p, size_t sz, size_t nm, void *user) {
    Fetch *x = user;
    size_t n = sz * nm;
    if (!x->started) {
        x->started = 1;
        curl_easy_getinfo(x->hub->curl, CURLINFO_RESPONSE_CODE, &x->code);
        if (x->code == 206 && x->hub->h.range_start != x->off) {
            x->fail = FAIL_RANGE;
            return 0;
        }
        if (x->code == 200 && x->off > 0) { /* the server ignored the range: start over */
            if (ftruncate(x->fd, 0) != 0 || hash_begin(&x->hash, x->f) != 0) {
                x->fail = FAIL_IO;
                x->io_errno = errno;
                return 0;
            }
            x->off = 0;
            x->hub->pr.resumed = 0;
        } else if (x->code != 200 && x->code != 206) {
            x->fail = FAIL_STATUS;
            return 0;
        }
    }
    if (x->off + (int64_t)n > x->f->size) {
        x->fail = FAIL_TOO_LONG;
        return 0;
    }
    for (size_t w = 0; w < n;) {
        ssize_t k = pwrite(x->fd, p + w, n - w, (off_t)(x->off + (int64_t)w));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            x->fail = FAIL_IO;
            x->io_errno = k < 0 ? errno : EIO;
            return 0;
        }
        w += (size_t)k;
    }
    EVP_DigestUpdate(x->hash.md, p, n);
    x->off += (int64_t)n;
    x->hub->st->bytes_fetched += (int64_t)n;
    report(x->hub, DL_EV_DATA, x->f, x->off);
    return n;
}

static int is_connect_error(CURLcode rc) {
    return rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_COULDNT_CONNECT ||
           rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_PEER_FAILED_VERIFICATION ||
           rc == CURLE_OPERATION_TIMEDOUT;
}

/* Requests bytes [x->off, size) of the file and appends them to the part; checks the outcome. */
static int fetch_rest(Fetch *x, const char *part, Err *err) {
    Hub *hub = x->hub;
    const RepoFile *f = x->f;
    char *path_esc = curl_easy_escape(hub->curl, f->path, 0);
    if (!path_esc) return err_set(err, Q35_ERR_OOM, "out of memory");
    char url[2048], range[48];
    snprintf(url, sizeof url, "%s/%s/resolve/%s/%s", hub->endpoint, hub->o->repo, hub->rev_esc, path_esc);
    curl_free(path_esc);
    request_setup(hub, url);
    curl_easy_setopt(hub->curl, CURLOPT_WRITEFUNCTION, on_file_data);
    curl_easy_setopt(hub->curl, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(hub->curl, CURLOPT_BUFFERSIZE, 256L << 10);
    if (x->off > 0) {
        snprintf(range, sizeof range, "%lld-", (long long)x->off);
        curl_easy_setopt(hub->curl, CURLOPT_RANGE, range);
    }
    int64_t off0 = x->off;
    CURLcode rc = curl_easy_perform(hub->curl);
    long code = x->code;
    if (!x->started) curl_easy_getinfo(hub->curl, CURLINFO_RESPONSE_CODE, &code);
    if (x->fail == FAIL_STATUS || (rc == CURLE_OK && code != 200 && code != 206))
        return http_error(hub, code, f->path, err);
    if (x->fail == FAIL_TOO_LONG) {
        unlink(part);
        return err_set(err, Q35_ERR_NET, "%s: the server sent more than the listed %lld bytes", f->path,
                       (long long)f->size);
    }
    if (x->fail == FAIL_RANGE) {
        unlink(part);
        return err_set(err, Q35_ERR_NET, "%s: asked for bytes from %lld, the server sent them from %lld", f->path,
                       (long long)off0, (long long)hub->h.range_start);
    }
    if (x->fail == FAIL_IO) return err_set(err, Q35_ERR_IO, "%s: write failed: %s", part, strerror(x->io_errno));
    if (rc != CURLE_OK) {
        if (!x->started && is_connect_error(rc)) return unreachable(hub, rc, err);
        return err_set(err, Q35_ERR_NET, "%s: transfer stopped at %lld of %lld bytes: %s (run again to resume)",
                       f->path, (long long)x->off, (long long)f->size, curl_msg(hub, rc));
    }
    if (x->off != f->size)
        return err_set(err, Q35_ERR_NET, "%s: got %lld of %lld bytes (run again to resume)", f->path,
                       (long long)x->off, (long long)f->size);
    return 0;
}

/* Checks a complete file in place: size, and hash unless it is LFS and verify_existing is off. */
static int existing_ok(Hub *hub, const RepoFile *f, const char *path, Err *err) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) || (int64_t)st.st_size != f->size) return 0;
    if (f->sha256[0] && !hub->o->verify_existing) return 1;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    Hash h = {0};
    char got[65] = "";
    int ok = hash_begin(&h, f) == 0 && hash_fd(&h, fd, f->size, path, err) == 0;
    if (ok) hash_hex(&h, got);
    EVP_MD_CTX_free(h.md);
    close(fd);
    err_clear(err);
    return ok && !strcmp(got, expected_hash(f));
}

/* Completes, verifies and syncs <part>: resumes from its current length, hashing what is
 * there first. *resumed: that length; *bad_hash: set when the result failed its hash (the part
 * is then removed). */
static int fetch_part(Hub *hub, const RepoFile *f, const char *part, int64_t *resumed, int *bad_hash, Err *err) {
    Fetch x = {.hub = hub, .f = f};
    hub->t0 = now_s();
    x.fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (x.fd < 0) return err_set(err, Q35_ERR_IO, "%s: %s", part, strerror(errno));
    int rc = 0;
    struct stat st;
    if (fstat(x.fd, &st) != 0) {
        rc = err_set(err, Q35_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    x.off = (int64_t)st.st_size;
    if (x.off > f->size) { /* not a prefix of this file: start over */
        if (ftruncate(x.fd, 0) != 0) {
            rc = err_set(err, Q35_ERR_IO, "%s: %s", part, strerror(errno));
            goto out;
        }
        x.off = 0;
    }
    if (hash_begin(&x.hash, f) != 0) {
        rc = err_set(err, Q35_ERR_OOM, "%s: cannot start %s", f->path, hash_name(f));
        goto out;
    }
    if ((rc = hash_fd(&x.hash, x.fd, x.off, part, err))) goto out;
    hub->pr.resumed = *resumed = x.off;
    report(hub, DL_EV_START, f, x.off);
    if (x.off < f->size && (rc = fetch_rest(&x, part, err))) goto out;

    char got[65];
    hash_hex(&x.hash, got);
    if (strcmp(got, expected_hash(f)) != 0) {
        unlink(part);
        *bad_hash = 1;
        rc = err_set(err, Q35_ERR_NET, "%s: %s mismatch (want %.16s..., got %.16s...); removed the download",
                     f->path, hash_name(f), expected_hash(f), got);
        goto out;
    }
    if (fsync(x.fd) != 0 || close(x.fd) != 0) {
        x.fd = -1;
        rc = err_set(err, Q35_ERR_IO, "%s: %s", part, strerror(errno));
        goto out;
    }
    x.fd = -1;
out:
    if (x.fd >= 0) close(x.fd);
    EVP_MD_CTX_free(x.hash.md);
    return rc;
}

static int fetch_file(Hub *hub, const RepoFile *f, const char *dir, Err *err) {
    char path[1280], part[1300];
    if (path_join(path, sizeof path, dir, f->path) || snprintf(part, sizeof part, "%s.part", path) >= (int)sizeof part)
        return err_set(err, Q35_ERR_ARG, "%s/%s: path too long", dir, f->path);
    hub->pr.resumed = 0;
    if (existing_ok(hub, f, path, err)) {
        hub->st->skipped++;
        hub->t0 = now_s();
        report(hub, DL_EV_SKIP, f, f->size);
        return 0;
    }
    for (int attempt = 0;; attempt++) {
        int64_t resumed = 0;
        int bad_hash = 0, rc = fetch_part(hub, f, part, &resumed, &bad_hash, err);
        if (rc && bad_hash && resumed > 0 && attempt == 0) continue; /* a stale part: once more from byte 0 */
        if (rc) return rc;
        break;
    }
    if (rename(part, path) != 0) return err_set(err, Q35_ERR_IO, "rename %s -> %s: %s", part, path, strerror(errno));
    report(hub, DL_EV_DONE, f, f->size);
    return 0;
}

/* ---- picking ---- */

/* Appends the shards named in model.safetensors.index.json (weight_map values, first-seen
 * order, no repeats) to picked; each must be a plain file name present in the listing. */
static int pick_shards(Hub *hub, const Listing *ls, const char *index_path, const RepoFile **picked, int *n,
                       Err *err) {
    char *text = NULL;
    int rc = read_file(index_path, &text, NULL, err);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(root);
        return err_set(err, Q35_ERR_FORMAT, "%s: no weight_map object", index_path);
    }
    int first = *n;
    const cJSON *e;
    cJSON_ArrayForEach(e, map) {
        if (!cJSON_IsString(e) || !file_name_ok(e->valuestring)) {
            rc = err_set(err, Q35_ERR_FORMAT, "%s: weight_map[\"%.60s\"] = \"%.80s\" is not a plain file name",
                         index_path, e->string, cJSON_IsString(e) ? e->valuestring : "(not a string)");
            break;
        }
        const RepoFile *f = listing_find(ls, e->valuestring);
        if (!f) {
            rc = err_set(err, Q35_ERR_FORMAT, "%s: shard %s is not in the repo at revision '%s'", index_path,
                         e->valuestring, hub->revision);
            break;
        }
        int seen = 0;
        for (int i = first; i < *n && !seen; i++) seen = picked[i] == f;
        if (!seen) picked[(*n)++] = f;
    }
    cJSON_Delete(root);
    if (!rc && *n == first) rc = err_set(err, Q35_ERR_FORMAT, "%s: weight_map is empty", index_path);
    return rc;
}

static int run(Hub *hub, const char *dir, Err *err) {
    const DownloadOptions *o = hub->o;
    Listing ls = {0};
    const RepoFile **picked = NULL;
    int rc = hub_list(hub, &ls, err);
    if (rc) goto out;
    if (!(picked = calloc((size_t)ls.n + 1, sizeof *picked))) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory");
        goto out;
    }
    if (!listing_find(&ls, "config.json")) {
        rc = err_set(err, Q35_ERR_FORMAT, "%s has no config.json at revision '%s'", o->repo, hub->revision);
        goto out;
    }
    const RepoFile *single = listing_find(&ls, "model.safetensors");
    const RepoFile *index = single ? NULL : listing_find(&ls, "model.safetensors.index.json");
    if (!single && !index) {
        rc = err_set(err, Q35_ERR_FORMAT, "%s has no model.safetensors or model.safetensors.index.json at revision "
                     "'%s' (only safetensors checkpoints are supported)", o->repo, hub->revision);
        goto out;
    }
    int n = 0;
    if (index) picked[n++] = index; /* first: it names the shards */
    for (int i = 0; TEXT_FILES[i]; i++)
        if (listing_find(&ls, TEXT_FILES[i])) picked[n++] = listing_find(&ls, TEXT_FILES[i]);
    for (int i = 0; o->include_vision && VISION_FILES[i]; i++)
        if (listing_find(&ls, VISION_FILES[i])) picked[n++] = listing_find(&ls, VISION_FILES[i]);
    if (single) picked[n++] = single;

    hub->pr.count = n;
    for (int i = 0; i < n; i++) hub->st->bytes_total += picked[i]->size;
    hub->pr.all_size = hub->st->bytes_total;
    for (int i = 0; i < n; i++) {
        hub->pr.index = i;
        if ((rc = fetch_file(hub, picked[i], dir, err))) goto out;
        hub->bytes_before += picked[i]->size;
        if (picked[i] == index) {
            char path[1280];
            int n0 = n;
            path_join(path, sizeof path, dir, index->path);
            if ((rc = pick_shards(hub, &ls, path, picked, &n, err))) goto out;
            for (int k = n0; k < n; k++) hub->st->bytes_total += picked[k]->size;
            hub->pr.count = n;
            hub->pr.all_size = hub->st->bytes_total;
        }
    }
    hub->st->files = n;
out:
    free(picked);
    listing_free(&ls);
    return rc;
}

int download_model(const DownloadOptions *o, DownloadStats *stats, Err *err) {
    DownloadStats local;
    DownloadStats *st = stats ? stats : &local;
    memset(st, 0, sizeof *st);
    const char *name = NULL;
    if (!repo_ok(o->repo, &name))
        return err_set(err, Q35_ERR_ARG, "bad repo id '%s' (want owner/name, e.g. Qwen/Qwen3.5-0.8B)",
                       o->repo ? o->repo : "");
    const char *ep = o->endpoint ? o->endpoint : DEFAULT_ENDPOINT;
    size_t ep_len = strlen(ep);
    while (ep_len > 0 && ep[ep_len - 1] == '/') ep_len--;
    if ((strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0) || ep_len >= 512)
        return err_set(err, Q35_ERR_ARG, "bad endpoint '%s' (want http:// or https:// URL)", ep);
    const char *rev = o->revision && o->revision[0] ? o->revision : "main";
    int rc;
    if (o->dir) {
        if (snprintf(st->dir, sizeof st->dir, "%s", o->dir) >= (int)sizeof st->dir)
            return err_set(err, Q35_ERR_ARG, "%s: path too long", o->dir);
    } else if ((rc = download_default_dir(o->repo, st->dir, sizeof st->dir, err))) {
        return rc;
    }
    if ((rc = mkdir_p(st->dir, err))) return rc;

    Hub hub = {.o = o, .revision = rev, .st = st};
    snprintf(hub.endpoint, sizeof hub.endpoint, "%.*s", (int)ep_len, ep);
    if (!(hub.curl = curl_easy_init())) return err_set(err, Q35_ERR_NET, "libcurl failed to start");
    if (!(hub.rev_esc = curl_easy_escape(hub.curl, rev, 0))) {
        curl_easy_cleanup(hub.curl);
        return err_set(err, Q35_ERR_OOM, "out of memory");
    }
    if (o->token) {
        char auth[1024];
        if (snprintf(auth, sizeof auth, "Authorization: Bearer %s", o->token) >= (int)sizeof auth || strchr(o->token, '\n'))
            rc = err_set(err, Q35_ERR_ARG, "bad token");
        else if (!(hub.hdrs = curl_slist_append(NULL, auth)))
            rc = err_set(err, Q35_ERR_OOM, "out of memory");
    }
    if (!rc) rc = run(&hub, st->dir, err);
    curl_slist_free_all(hub.hdrs);
    curl_free(hub.rev_esc);
    curl_easy_cleanup(hub.curl);
    return rc;
}
