/* pyjson.c — Python-compatible JSON printing over cJSON trees (see pyjson.h). The number literals are
 * recovered by a scan over the text cJSON has already accepted: outside strings, a number starts at '-' or
 * a digit and runs over [0-9+-.eE]; the k-th literal belongs to the k-th number node in document order. */
#include "pyjson.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_num_char(char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Assigns literals to the number nodes below v in document order; returns the next unread position. */
static size_t attach_literals(cJSON *v, const char *t, size_t len, size_t pos, int *bad) {
    for (; v && !*bad; v = v->next) {
        if (cJSON_IsNumber(v)) {
            int in_str = 0;
            while (pos < len) { /* the next number literal outside a string */
                char c = t[pos];
                if (in_str) {
                    if (c == '\\')
                        pos++;
                    else if (c == '"')
                        in_str = 0;
                } else if (c == '"') {
                    in_str = 1;
                } else if (c == '-' || (c >= '0' && c <= '9')) {
                    break;
                }
                pos++;
            }
            size_t b = pos;
            while (pos < len && is_num_char(t[pos])) pos++;
            if (b == pos) {
                *bad = 1;
                return pos;
            }
            v->valuestring = malloc(pos - b + 1);
            if (!v->valuestring) {
                *bad = 1;
                return pos;
            }
            memcpy(v->valuestring, t + b, pos - b);
            v->valuestring[pos - b] = 0;
        } else if (v->child) {
            pos = attach_literals(v->child, t, len, pos, bad);
        }
    }
    return pos;
}

int pyjson_parse(const char *text, size_t len, const char *what, cJSON **out, Err *err) {
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out) {
        size_t at = end && end >= text ? (size_t)(end - text) : 0;
        return err_set(err, Q35_ERR_FORMAT, "%s: malformed JSON near byte %zu", what, at);
    }
    for (const char *p = end; p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(*out);
            *out = NULL;
            return err_set(err, Q35_ERR_FORMAT, "%s: trailing bytes after the JSON value", what);
        }
    int bad = 0;
    attach_literals(*out, text, len, 0, &bad);
    if (bad) {
        cJSON_Delete(*out);
        *out = NULL;
        return err_set(err, Q35_ERR_OOM, "%s: out of memory", what);
    }
    return 0;
}

void pyjson_float_repr(double x, char out[32]) { /* at most 1 + 17 + 1 + 5 bytes in exponent form */
    if (isnan(x)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    for (int p = 0; p < 17; p++) { /* shortest %.{p}e that reads back as x */
        snprintf(e, sizeof e, "%.*e", p, x);
        if (strtod(e, NULL) == x) break;
    }
    /* e = [-]d[.ddd]e(+|-)XX -> sign, digits, decimal exponent */
    const char *q = e;
    int neg = *q == '-';
    if (neg) q++;
    char dig[20];
    int nd = 0;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int ex = atoi(q + 1), decpt = ex + 1; /* value = 0.dig * 10^decpt */
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) { /* Python: exponent form when decpt <= -4 or decpt > 16 */
        if (decpt <= 0) {            /* 0.000ddd */
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = dig[i];
        } else {
            for (int i = 0; i < decpt; i++) *o++ = i < nd ? dig[i] : '0';
            *o++ = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++) *o++ = dig[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = dig[i];
        }
        snprintf(o, 8, "e%c%02d", ex < 0 ? '-' : '+', (ex < 0 ? -ex : ex) % 1000); /* |ex| <= 324 */
    }
}

/* An int literal (no '.', 'e', 'E') as Python prints int(literal): leading zeros and "-0" normalised. */
static int int_literal(const char *lit) {
    for (const char *p = lit; *p; p++)
        if (*p == '.' || *p == 'e' || *p == 'E') return 0;
    return 1;
}

/* as_str: str(x) (inf / nan); strict: valid JSON, so a float beyond a double's range keeps its literal. */
static void dump_number(StrBuf *s, const cJSON *v, int as_str, int strict) {
    const char *lit = v->valuestring;
    if (lit && int_literal(lit)) {
        const char *d = lit + (*lit == '-' || *lit == '+');
        while (d[0] == '0' && d[1]) d++;
        if (*lit == '-' && strcmp(d, "0")) sb_putc(s, '-');
        sb_puts(s, d);
        return;
    }
    double x = v->valuedouble;
    if (!lit && x == floor(x) && fabs(x) < 9007199254740992.0) { /* a tree built without literals */
        char b[32];
        snprintf(b, sizeof b, "%.0f", x);
        sb_puts(s, b);
        return;
    }
    if (strict && lit && (isinf(x) || isnan(x))) {
        sb_puts(s, lit);
        return;
    }
    if (!as_str && (isinf(x) || isnan(x))) {
        sb_puts(s, isnan(x) ? "NaN" : x < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char b[32];
    pyjson_float_repr(x, b);
    sb_puts(s, b);
}

void pyjson_dump_string(StrBuf *s, const char *x, size_t n) {
    sb_putc(s, '"');
    size_t run = 0; /* bytes copied in one go */
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)x[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(u, sizeof u, "\\u%04x", c);
                esc = u;
            }
        }
        if (!esc) continue;
        sb_put(s, x + run, i - run);
        sb_puts(s, esc);
        run = i + 1;
    }
    sb_put(s, x + run, n - run);
    sb_putc(s, '"');
}

const cJSON *pyjson_key_value(const cJSON *v) {
    const cJSON *last = v;
    for (const cJSON *w = v->next; w; w = w->next)
        if (w->string && v->string && !strcmp(w->string, v->string)) last = w;
    return last;
}
int pyjson_key_shadowed(const cJSON *first, const cJSON *v) {
    for (const cJSON *w = first; w != v; w = w->next)
        if (w->string && v->string && !strcmp(w->string, v->string)) return 1;
    return 0;
}

static void dump(StrBuf *s, const cJSON *v, int strict) {
    if (cJSON_IsString(v)) {
        pyjson_dump_string(s, v->valuestring, strlen(v->valuestring));
    } else if (cJSON_IsNumber(v)) {
        dump_number(s, v, 0, strict);
    } else if (cJSON_IsTrue(v)) {
        sb_puts(s, "true");
    } else if (cJSON_IsFalse(v)) {
        sb_puts(s, "false");
    } else if (cJSON_IsArray(v)) {
        sb_putc(s, '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            dump(s, c, strict);
            if (c->next) sb_puts(s, ", ");
        }
        sb_putc(s, ']');
    } else if (cJSON_IsObject(v)) {
        sb_putc(s, '{');
        int k = 0;
        for (const cJSON *c = v->child; c; c = c->next) {
            if (pyjson_key_shadowed(v->child, c)) continue;
            if (k++) sb_puts(s, ", ");
            pyjson_dump_string(s, c->string, strlen(c->string));
            sb_puts(s, ": ");
            dump(s, pyjson_key_value(c), strict);
        }
        sb_putc(s, '}');
    } else {
        sb_puts(s, "null");
    }
}

void pyjson_dump(StrBuf *s, const cJSON *v) { dump(s, v, 0); }
void pyjson_dump_strict(StrBuf *s, const cJSON *v) { dump(s, v, 1); }

void pyjson_str(StrBuf *s, const cJSON *v) {
    if (cJSON_IsString(v))
        sb_puts(s, v->valuestring);
    else if (cJSON_IsNumber(v))
        dump_number(s, v, 1, 0);
    else if (cJSON_IsTrue(v))
        sb_puts(s, "True");
    else if (cJSON_IsFalse(v))
        sb_puts(s, "False");
    else if (cJSON_IsNull(v))
        sb_puts(s, "None");
    else
        pyjson_dump(s, v);
}
