/* json.h — thin typed getters over cJSON. A key path is dot-separated ("rope_parameters.rope_theta")
 * and looked up case-sensitively. Every getter that fails fills Err with one line naming the file
 * and the full key path; src->code is the code used for a missing or mistyped key (Q35_ERR_CONFIG
 * for config files, Q35_ERR_FORMAT for data files). A JSON null counts as absent for the _opt getters.
 * Malformed JSON text is always Q35_ERR_FORMAT. */
#ifndef Q35_JSON_H
#define Q35_JSON_H

#include <cjson/cJSON.h>

#include "util.h"

typedef struct JsonSrc {
    const char *file; /* named in every message */
    int code;         /* Err code for a missing / mistyped key */
} JsonSrc;

/* Parses len bytes of text (NUL-terminated at text[len]) into *out (free with cJSON_Delete).
 * Trailing non-space bytes are an error. Error message: file + line:column. */
int json_parse(cJSON **out, const char *text, size_t len, const char *file, Err *err);
/* read_file + json_parse. */
int json_load(cJSON **out, const char *path, Err *err);

/* Node at path below obj, or NULL when any step is absent (or obj is not an object). */
const cJSON *json_at(const cJSON *obj, const char *path);
/* 1 when path exists below obj and is not null. */
int json_has(const cJSON *obj, const char *path);

/* Required values: absent, null or of the wrong type -> src->code. */
int json_int(const JsonSrc *s, const cJSON *obj, const char *path, int *out, Err *err);
int json_int64(const JsonSrc *s, const cJSON *obj, const char *path, int64_t *out, Err *err);
int json_float(const JsonSrc *s, const cJSON *obj, const char *path, float *out, Err *err);
int json_bool(const JsonSrc *s, const cJSON *obj, const char *path, int *out, Err *err);
/* Points *out into the cJSON tree (valid while the tree lives). */
int json_string(const JsonSrc *s, const cJSON *obj, const char *path, const char **out, Err *err);
/* Array node and its length. */
int json_array(const JsonSrc *s, const cJSON *obj, const char *path, const cJSON **out, int *n, Err *err);
int json_object(const JsonSrc *s, const cJSON *obj, const char *path, const cJSON **out, Err *err);

/* Optional values: absent or null -> *out = def and return 0; wrong type -> src->code. */
int json_int_opt(const JsonSrc *s, const cJSON *obj, const char *path, int def, int *out, Err *err);
int json_float_opt(const JsonSrc *s, const cJSON *obj, const char *path, float def, float *out, Err *err);
int json_bool_opt(const JsonSrc *s, const cJSON *obj, const char *path, int def, int *out, Err *err);
int json_string_opt(const JsonSrc *s, const cJSON *obj, const char *path, const char *def, const char **out,
                    Err *err);

/* Converts one node to an integer: must be a number with an integral value that fits.
 * what names the value in the message (e.g. "eos_token_id[1]"). */
int json_node_int64(const JsonSrc *s, const cJSON *node, const char *what, int64_t lo, int64_t hi, int64_t *out,
                    Err *err);

#endif
