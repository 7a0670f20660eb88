/* st_write.h — test helpers: a temp dir, text files, and a tiny safetensors writer (header JSON
 * built here, padded to 8 bytes, tensors laid out back to back). Header-only, static functions. */
#ifndef Q35_ST_WRITE_H
#define Q35_ST_WRITE_H

#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct StSpec {
    const char *name;
    const char *dtype; /* "BF16", "F32", ... written as given (may be bogus on purpose) */
    int ndim;
    int64_t shape[4];
    const void *data; /* nbytes bytes; NULL -> zeros */
    size_t nbytes;    /* 0 -> numel * size of dtype (unknown dtypes: 2) */
} StSpec;

static int st_dsize(const char *dt) {
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32")) return 4;
    if (!strcmp(dt, "I64")) return 8;
    if (!strcmp(dt, "U8")) return 1;
    return 2;
}

static size_t st_nbytes(const StSpec *t) {
    if (t->nbytes) return t->nbytes;
    size_t n = (size_t)st_dsize(t->dtype);
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

/* Raw file: 8-byte LE length hlen (which may lie), header bytes, then data. */
__attribute__((unused)) static int st_write_raw(const char *path, uint64_t hlen, const char *header,
                                                size_t header_len, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(hlen >> (8 * i));
    int ok = fwrite(len, 1, 8, f) == 8 && fwrite(header, 1, header_len, f) == header_len &&
             (!n || fwrite(data, 1, n, f) == n);
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* Builds the header for t[0..n) (optionally with a __metadata__ object text) and writes the file. */
__attribute__((unused)) static int st_write(const char *path, const StSpec *t, int n, const char *metadata) {
    size_t cap = 256 + (size_t)n * 256 + (metadata ? strlen(metadata) : 0), len = 0, off = 0, data_len = 0;
    for (int i = 0; i < n; i++) data_len += st_nbytes(&t[i]);
    char *h = malloc(cap + 8);
    uint8_t *data = calloc(data_len ? data_len : 1, 1);
    if (!h || !data) return -1;
    len += (size_t)snprintf(h + len, cap - len, "{");
    if (metadata) len += (size_t)snprintf(h + len, cap - len, "\"__metadata__\":%s%s", metadata, n ? "," : "");
    for (int i = 0; i < n; i++) {
        size_t nb = st_nbytes(&t[i]);
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "",
                                t[i].name, t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off, off + nb);
        if (t[i].data) memcpy(data + off, t[i].data, nb);
        off += nb;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' '; /* pad so the data section is 8-byte aligned */
    int rc = st_write_raw(path, len, h, len, data, data_len);
    free(h);
    free(data);
    return rc;
}

__attribute__((unused)) static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* dir/name into a static-free caller buffer. */
__attribute__((unused)) static const char *pj(char *buf, size_t n, const char *dir, const char *name) {
    snprintf(buf, n, "%s/%s", dir, name);
    return buf;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
__attribute__((unused)) static void rm_rf(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* Creates a fresh temp dir in tmpl (e.g. "/tmp/q35_test_XXXXXX"); returns tmpl or NULL. */
__attribute__((unused)) static char *make_tmpdir(char *tmpl) { return mkdtemp(tmpl); }

#endif
