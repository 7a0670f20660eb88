/* pyjson.h — JSON as Python's json module reads and writes it, which is what the HF chat templates see:
 * json.loads keeps an int literal exact and a literal with '.', 'e' or 'E' as a float, and the template's
 * tojson is json.dumps(x, ensure_ascii=False) (", " and ": " separators, non-ASCII raw, floats by repr).
 * cJSON gives the structure; pyjson_parse stores each number's literal in its node's valuestring so that
 * 1.0 prints "1.0" and 12345678901234567890 keeps its digits. Duplicate keys print once, at the first key's
 * place with the last value, as a Python dict holds them. */
#ifndef Q35_PYJSON_H
#define Q35_PYJSON_H

#include <cjson/cJSON.h>

#include "strbuf.h"
#include "util.h"

/* Parses len bytes (need not be NUL-terminated) into *out (cJSON_Delete frees it). Malformed JSON or
 * trailing non-space bytes -> Q35_ERR_FORMAT naming what (e.g. "tools"). */
int pyjson_parse(const char *text, size_t len, const char *what, cJSON **out, Err *err);
/* A dict's items in Python's order: skip member c when pyjson_key_shadowed(obj->child, c) (its key came
 * earlier); its value is pyjson_key_value(c) (the last member with that key). */
int pyjson_key_shadowed(const cJSON *first, const cJSON *c);
const cJSON *pyjson_key_value(const cJSON *c);
/* json.dumps(v, ensure_ascii=False) appended to s. */
void pyjson_dump(StrBuf *s, const cJSON *v);
/* As pyjson_dump, but always valid JSON (RFC 8259), for text a client parses (a tool call's arguments): a
 * float literal beyond a double's range, which json.dumps would write as Infinity, keeps its literal. */
void pyjson_dump_strict(StrBuf *s, const cJSON *v);
/* A JSON string literal of the bytes x[0..n) as json.dumps writes it (\" \\ \n \r \t \b \f, other
 * bytes below 0x20 as \u00xx, everything else raw). */
void pyjson_dump_string(StrBuf *s, const char *x, size_t n);
/* Python's str(v): strings raw, True / False / None, int digits, float repr; containers as dump. */
void pyjson_str(StrBuf *s, const cJSON *v);
/* repr(x) of a Python float: shortest round-trip digits, fixed notation for 1e-4 <= |x| < 1e16 ("1.0",
 * "0.0001"), else "1e-05" / "1.5e+16"; inf / nan as "inf" / "nan". */
void pyjson_float_repr(double x, char out[32]);

#endif
