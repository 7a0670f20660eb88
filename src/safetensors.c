/* safetensors.c — read-only mmap of a .safetensors file and a checked header.
 * Layout: u64 LE header length n | n bytes of JSON {name: {dtype, shape, data_offsets [b, e]}, ...,
 * "__metadata__": {...}} | data section. Offsets are relative to the data section. Checks: file
 * length, n inside the file and <= 100 MB, valid JSON, known dtype, ndim <= ST_MAX_DIMS, shape
 * entries >= 0, b <= e <= data length, e - b == numel * dtype size, no two tensors overlap, no
 * duplicate names. Tensors are kept sorted by name so lookup is a binary search. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"

#define ST_MAX_HEADER (100u << 20) /* the format's own limit on the header length */

static const struct {
    const char *name;
    int size;
} DTYPES[] = {[DT_BF16] = {"BF16", 2}, [DT_F16] = {"F16", 2}, [DT_F32] = {"F32", 4},
              [DT_I32] = {"I32", 4},   [DT_I64] = {"I64", 8}, [DT_U8] = {"U8", 1},
              [DT_F8_E4M3] = {"F8_E4M3", 1}};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

int dtype_size(DType t) { return (t >= 0 && (int)t < N_DTYPES) ? DTYPES[t].size : 0; }
const char *dtype_name(DType t) { return (t >= 0 && (int)t < N_DTYPES) ? DTYPES[t].name : "?"; }

static int dtype_parse(const char *s, DType *out) {
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(s, DTYPES[i].name) == 0) {
            *out = (DType)i;
            return 0;
        }
    return -1;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const Tensor *)a)->name, ((const Tensor *)b)->name);
}

/* Sort key for the overlap check: (begin, end) of the byte range inside the data section. */
typedef struct Range {
    size_t begin, end;
    int idx;
} Range;
static int by_begin(const void *a, const void *b) {
    const Range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Parses one header entry into t (t->name already set). data/data_len: the data section. */
static int parse_entry(const char *path, const cJSON *e, const uint8_t *data, size_t data_len, Tensor *t,
                       size_t *begin, Err *err) {
    const char *name = t->name;
    JsonSrc s = {path, Q35_ERR_FORMAT};
    if (!cJSON_IsObject(e)) return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt))
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': 'dtype' missing or not a string", path, name);
    if (dtype_parse(dt->valuestring, &t->dtype))
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': unsupported dtype '%s'", path, name, dt->valuestring);
    if (!cJSON_IsArray(shape))
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': 'shape' missing or not an array", path, name);
    int n = cJSON_GetArraySize(shape);
    if (n > ST_MAX_DIMS)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': %d dims (max %d)", path, name, n, ST_MAX_DIMS);
    t->ndim = n;
    t->numel = 1;
    for (int i = 0; i < n; i++) {
        int64_t d;
        if (json_node_int64(&s, cJSON_GetArrayItem(shape, i), "shape", 0, INT64_MAX, &d, err))
            return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                           name, i);
        if (d && t->numel > INT64_MAX / 16 / d)
            return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape too large", path, name);
        t->shape[i] = d;
        t->numel *= d;
    }
    int64_t ob = -1, oe = -1;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        json_node_int64(&s, cJSON_GetArrayItem(offs, 0), "data_offsets", 0, INT64_MAX, &ob, err) ||
        json_node_int64(&s, cJSON_GetArrayItem(offs, 1), "data_offsets", 0, INT64_MAX, &oe, err))
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': 'data_offsets' must be two non-negative integers",
                       path, name);
    if (oe < ob)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': data_offsets end %lld < begin %lld", path, name,
                       (long long)oe, (long long)ob);
    if ((uint64_t)oe > data_len)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] outside the data section "
                       "(%zu bytes)", path, name, (long long)ob, (long long)oe, data_len);
    t->nbytes = (size_t)(oe - ob);
    int64_t want = t->numel * dtype_size(t->dtype);
    if ((int64_t)t->nbytes != want)
        return err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s': %zu bytes stored but shape x %s needs %lld", path, name,
                       t->nbytes, dtype_name(t->dtype), (long long)want);
    t->data = data + ob;
    *begin = (size_t)ob;
    return 0;
}

/* Parses the header JSON and fills st->tensors; on error st keeps what it owns for close(). */
static int parse_header(SafeTensors *st, const uint8_t *data, size_t data_len, Err *err) {
    const char *path = st->path;
    cJSON *root;
    int rc = json_parse(&root, st->header_json, strlen(st->header_json), path, err);
    if (rc) return rc; /* names the file and the line:column inside the header */
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return err_set(err, Q35_ERR_FORMAT, "%s: header is not a JSON object", path);
    }
    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
    st->tensors = calloc(n ? (size_t)n : 1, sizeof(Tensor));
    Range *ranges = calloc(n ? (size_t)n : 1, sizeof(Range));
    if (!st->tensors || !ranges) {
        free(ranges);
        cJSON_Delete(root);
        return err_set(err, Q35_ERR_OOM, "%s: out of memory for %d tensors", path, n);
    }
    for (const cJSON *e = root->child; e && !rc; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!st->metadata_json) st->metadata_json = cJSON_PrintUnformatted(e);
            continue;
        }
        Tensor *t = &st->tensors[st->n_tensors];
        if (!(t->name = strdup(e->string))) {
            rc = err_set(err, Q35_ERR_OOM, "%s: out of memory", path);
            break;
        }
        st->n_tensors++;
        ranges[st->n_tensors - 1].idx = st->n_tensors - 1;
        rc = parse_entry(path, e, data, data_len, t, &ranges[st->n_tensors - 1].begin, err);
        ranges[st->n_tensors - 1].end = ranges[st->n_tensors - 1].begin + t->nbytes;
    }
    cJSON_Delete(root);
    if (!rc) {
        /* Overlap: sorted by begin, each non-empty range must start at or after the furthest end
         * reached so far (empty tensors own no bytes and are ignored). */
        qsort(ranges, (size_t)n, sizeof *ranges, by_begin);
        int last = -1; /* non-empty range with the furthest end */
        for (int i = 0; i < n && !rc; i++) {
            if (ranges[i].end == ranges[i].begin) continue;
            if (last >= 0 && ranges[i].begin < ranges[last].end)
                rc = err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' [%zu, %zu) overlaps tensor '%s' [%zu, %zu)", path,
                             st->tensors[ranges[i].idx].name, ranges[i].begin, ranges[i].end,
                             st->tensors[ranges[last].idx].name, ranges[last].begin, ranges[last].end);
            if (last < 0 || ranges[i].end > ranges[last].end) last = i;
        }
    }
    free(ranges);
    if (!rc) {
        qsort(st->tensors, (size_t)st->n_tensors, sizeof(Tensor), by_name);
        for (int i = 1; i < st->n_tensors && !rc; i++)
            if (strcmp(st->tensors[i].name, st->tensors[i - 1].name) == 0)
                rc = err_set(err, Q35_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", path,
                             st->tensors[i].name);
    }
    return rc;
}

int safetensors_open(SafeTensors *st, const char *path, Err *err) {
    memset(st, 0, sizeof *st);
    if (!(st->path = strdup(path))) return err_set(err, Q35_ERR_OOM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        safetensors_close(st);
        return err_set(err, Q35_ERR_IO, "%s: %s", path, strerror(e));
    }
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = err_set(err, Q35_ERR_IO, "%s: not a regular file", path);
    } else if (sb.st_size < 8) {
        rc = err_set(err, Q35_ERR_FORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                     (long long)sb.st_size);
    } else {
        st->map_len = (size_t)sb.st_size;
        st->map = mmap(NULL, st->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (st->map == MAP_FAILED) {
            st->map = NULL;
            rc = err_set(err, Q35_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, st->map_len, strerror(errno));
        }
    }
    close(fd);
    if (rc) {
        safetensors_close(st);
        return rc;
    }

    const uint8_t *p = st->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | p[i]; /* little-endian u64 */
    if (n > st->map_len - 8) {
        rc = err_set(err, Q35_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)", path,
                     (unsigned long long)n, st->map_len);
    } else if (n > ST_MAX_HEADER || n < 2) {
        rc = err_set(err, Q35_ERR_FORMAT, "%s: header length %llu is not plausible", path, (unsigned long long)n);
    } else if (!(st->header_json = malloc((size_t)n + 1))) {
        rc = err_set(err, Q35_ERR_OOM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
    } else {
        memcpy(st->header_json, p + 8, (size_t)n);
        st->header_json[n] = 0;
        if (strlen(st->header_json) != (size_t)n)
            rc = err_set(err, Q35_ERR_FORMAT, "%s: header contains a NUL byte", path);
        else
            rc = parse_header(st, p + 8 + n, st->map_len - 8 - (size_t)n, err);
    }
    if (rc) safetensors_close(st);
    return rc;
}

void safetensors_close(SafeTensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->map_len);
    for (int i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    free(st->tensors);
    free(st->header_json);
    if (st->metadata_json) cJSON_free(st->metadata_json);
    free(st->path);
    memset(st, 0, sizeof *st);
}

const Tensor *safetensors_find(const SafeTensors *st, const char *name) {
    if (!st->tensors || !name) return NULL;
    Tensor key = {.name = name};
    return bsearch(&key, st->tensors, (size_t)st->n_tensors, sizeof(Tensor), by_name);
}
