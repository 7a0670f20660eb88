/* download.h — fetch the inference files of a Hugging Face model repo over HTTP(S) (libcurl).
 * Lists the repo with {endpoint}/api/models/{repo}/tree/{revision}, picks config / tokenizer /
 * generation files and the safetensors weights (single file, or index + every shard it names),
 * downloads each into <dir>/<file>.part (resuming with an HTTP Range request), checks the size
 * and hash against the listing (LFS: sha256 == lfs.oid; other files: git blob sha1 == oid) while
 * writing, and renames the part into place. Returns Q35_ERR_* codes; never prints. */
#ifndef Q35_DOWNLOAD_H
#define Q35_DOWNLOAD_H

#include <stdint.h>

#include "util.h"

enum {
    DL_EV_START, /* a file's transfer begins (resumed = bytes already in its .part) */
    DL_EV_DATA,  /* bytes arrived */
    DL_EV_DONE,  /* the file is verified and in place */
    DL_EV_SKIP,  /* the file was already complete in dir; nothing fetched */
};

typedef struct DownloadProgress {
    int event;                  /* DL_EV_* */
    const char *file;           /* path inside the repo */
    int index, count;           /* 0-based file number, number of files picked */
    int64_t done, size;         /* this file: bytes on disk (resumed + fetched), listed size */
    int64_t resumed;            /* bytes found in <file>.part at START */
    int64_t all_done, all_size; /* over all picked files (all_size grows once shards are known) */
    double seconds;             /* since this file's START */
} DownloadProgress;

typedef void (*DownloadProgressFn)(void *user, const DownloadProgress *p);

typedef struct DownloadOptions {
    const char *repo;         /* "Qwen/Qwen3.5-0.8B" (owner/name, or a bare name) */
    const char *dir;          /* destination; NULL = models/<name> */
    const char *endpoint;     /* NULL = https://huggingface.co */
    const char *revision;     /* NULL = "main"; branch, tag or commit */
    const char *token;        /* NULL, or a hub access token sent as "Authorization: Bearer" */
    int include_vision;       /* also fetch preprocessor_config.json, video_preprocessor_config.json */
    int verify_existing;      /* re-hash complete LFS files found in dir (default: trust their size) */
    long connect_timeout_s;   /* 0 = 30 */
    long stall_timeout_s;     /* abort a transfer that moves < 1 byte/s for this long; 0 = 60 */
    DownloadProgressFn progress; /* optional */
    void *progress_user;
} DownloadOptions;

typedef struct DownloadStats {
    int files;             /* files picked */
    int skipped;           /* of those, already complete before this run */
    int64_t bytes_fetched; /* body bytes received in this run (after any redirect) */
    int64_t bytes_total;   /* sum of the picked files' sizes */
    char dir[1024];        /* where the files went */
} DownloadStats;

void download_options_init(DownloadOptions *o);

/* Checks a repo id ("owner/name" or "name"; letters, digits, '-', '_', '.'; no "..") and
 * writes models/<name> into out. Q35_ERR_ARG on a bad id or too small a buffer. */
int download_default_dir(const char *repo, char *out, size_t n, Err *err);

/* Fetches the model's files into o->dir (created with parents). Files already complete are
 * kept; a <file>.part is resumed. On failure the error names the file (or the endpoint when it
 * cannot be reached); codes: Q35_ERR_NET (network, HTTP status, size or hash mismatch),
 * Q35_ERR_IO (local files), Q35_ERR_FORMAT (bad listing / index JSON), Q35_ERR_ARG.
 * libcurl: call curl_global_init() once at program start (curl_easy_init does it lazily). */
int download_model(const DownloadOptions *o, DownloadStats *stats, Err *err);

#endif
