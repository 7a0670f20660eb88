/* json.c — typed getters over cJSON with one-line errors naming file and key path.
 * Numbers: cJSON keeps a double, so integers are accepted only when integral and in range
 * (exact up to 2^53). Lookups are case-sensitive (cJSON_GetObjectItemCaseSensitive). */
#include "json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int json_parse(cJSON **out, const char *text, size_t len, const char *file, Err *err) {
    const char *end = NULL;
    *out = NULL;
    /* text[len] is the NUL; passing it lets cJSON reject trailing garbage after the value. */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!root) {
        /* Report line:column of the failure point. */
        size_t off = (end && end >= text && end <= text + len) ? (size_t)(end - text) : 0;
        int line = 1, col = 1;
        for (size_t i = 0; i < off; i++) {
            if (text[i] == '\n') line++, col = 1;
            else col++;
        }
        return err_set(err, Q35_ERR_FORMAT, "%s: malformed JSON near line %d, column %d (byte %zu)", file, line,
                       col, off);
    }
    *out = root;
    return 0;
}

int json_load(cJSON **out, const char *path, Err *err) {
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(path, &text, &len, err);
    if (rc) return rc;
    rc = json_parse(out, text, len, path, err);
    free(text);
    return rc;
}

const cJSON *json_at(const cJSON *obj, const char *path) {
    char key[256];
    const char *p = path;
    while (obj && *p) {
        if (!cJSON_IsObject(obj)) return NULL;
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key) return NULL;
        memcpy(key, p, n);
        key[n] = 0;
        obj = cJSON_GetObjectItemCaseSensitive(obj, key);
        p += n + (dot ? 1 : 0);
    }
    return obj;
}

int json_has(const cJSON *obj, const char *path) {
    const cJSON *n = json_at(obj, path);
    return n && !cJSON_IsNull(n);
}

/* Finds a required node; absent or null -> error. */
static int need(const JsonSrc *s, const cJSON *obj, const char *path, const cJSON **out, Err *err) {
    const cJSON *n = json_at(obj, path);
    if (!n) return err_set(err, s->code, "%s: key '%s' missing", s->file, path);
    if (cJSON_IsNull(n)) return err_set(err, s->code, "%s: key '%s' is null", s->file, path);
    *out = n;
    return 0;
}

static int wrong_type(const JsonSrc *s, const char *path, const char *want, Err *err) {
    return err_set(err, s->code, "%s: key '%s' must be %s", s->file, path, want);
}

int json_node_int64(const JsonSrc *s, const cJSON *node, const char *what, int64_t lo, int64_t hi, int64_t *out,
                    Err *err) {
    if (!cJSON_IsNumber(node)) return wrong_type(s, what, "an integer", err);
    double v = node->valuedouble;
    if (!isfinite(v) || v != floor(v) || fabs(v) > 9007199254740992.0)
        return err_set(err, s->code, "%s: key '%s' must be an integer (got %g)", s->file, what, v);
    int64_t i = (int64_t)v;
    if (i < lo || i > hi)
        return err_set(err, s->code, "%s: key '%s' = %lld out of range [%lld, %lld]", s->file, what, (long long)i,
                       (long long)lo, (long long)hi);
    *out = i;
    return 0;
}

int json_int64(const JsonSrc *s, const cJSON *obj, const char *path, int64_t *out, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    return json_node_int64(s, n, path, -9007199254740992LL, 9007199254740992LL, out, err);
}

int json_int(const JsonSrc *s, const cJSON *obj, const char *path, int *out, Err *err) {
    const cJSON *n;
    int64_t v;
    int rc = need(s, obj, path, &n, err);
    if (!rc) rc = json_node_int64(s, n, path, -2147483647LL - 1, 2147483647LL, &v, err);
    if (!rc) *out = (int)v;
    return rc;
}

int json_float(const JsonSrc *s, const cJSON *obj, const char *path, float *out, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    if (!cJSON_IsNumber(n) || !isfinite(n->valuedouble)) return wrong_type(s, path, "a finite number", err);
    *out = (float)n->valuedouble;
    return 0;
}

int json_bool(const JsonSrc *s, const cJSON *obj, const char *path, int *out, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    if (!cJSON_IsBool(n)) return wrong_type(s, path, "true or false", err);
    *out = cJSON_IsTrue(n) ? 1 : 0;
    return 0;
}

int json_string(const JsonSrc *s, const cJSON *obj, const char *path, const char **out, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    if (!cJSON_IsString(n) || !n->valuestring) return wrong_type(s, path, "a string", err);
    *out = n->valuestring;
    return 0;
}

int json_array(const JsonSrc *s, const cJSON *obj, const char *path, const cJSON **out, int *len, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    if (!cJSON_IsArray(n)) return wrong_type(s, path, "an array", err);
    *out = n;
    *len = cJSON_GetArraySize(n);
    return 0;
}

int json_object(const JsonSrc *s, const cJSON *obj, const char *path, const cJSON **out, Err *err) {
    const cJSON *n;
    int rc = need(s, obj, path, &n, err);
    if (rc) return rc;
    if (!cJSON_IsObject(n)) return wrong_type(s, path, "an object", err);
    *out = n;
    return 0;
}

int json_int_opt(const JsonSrc *s, const cJSON *obj, const char *path, int def, int *out, Err *err) {
    if (!json_has(obj, path)) {
        *out = def;
        return 0;
    }
    return json_int(s, obj, path, out, err);
}

int json_float_opt(const JsonSrc *s, const cJSON *obj, const char *path, float def, float *out, Err *err) {
    if (!json_has(obj, path)) {
        *out = def;
        return 0;
    }
    return json_float(s, obj, path, out, err);
}

int json_bool_opt(const JsonSrc *s, const cJSON *obj, const char *path, int def, int *out, Err *err) {
    if (!json_has(obj, path)) {
        *out = def;
        return 0;
    }
    return json_bool(s, obj, path, out, err);
}

int json_string_opt(const JsonSrc *s, const cJSON *obj, const char *path, const char *def, const char **out,
                    Err *err) {
    if (!json_has(obj, path)) {
        *out = def;
        return 0;
    }
    return json_string(s, obj, path, out, err);
}
