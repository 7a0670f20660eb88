/* chat_schema.h — a JSON Schema as a byte-level recognizer of the JSON values it accepts: what the guide
 * (chat_guide.c) constrains an OpenAI response_format reply with. Keywords (docs/CHAT.md has the table): type
 * (one or a list), properties, required, additionalProperties (absent: no other keys when "properties" is given,
 * any keys when not), items, minItems, maxItems, minLength, maxLength, enum, const, anyOf / oneOf (alternatives
 * that a value's first byte tells apart), $ref to "#", "#/$defs/NAME" or "#/definitions/NAME". Annotations
 * (title, description, default, examples, format, ...) and unknown keywords are ignored, as JSON Schema says;
 * an assertion it cannot enforce (pattern, minimum, allOf, ...) fails the compile with a one-line error naming
 * it, so a reply is never passed off as validated when it was not. */
#ifndef Q35_CHAT_SCHEMA_H
#define Q35_CHAT_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define SCHEMA_DEPTH 16 /* nesting of objects and arrays in a reply */

typedef struct Schema Schema;

/* One open object or array of the value being read. */
typedef struct SchemaFrame {
    uint64_t seen;  /* object: declared properties given */
    int node;       /* its schema node */
    uint16_t count; /* array: items started */
    uint8_t obj;    /* 1: object, 0: array */
    uint8_t phase;  /* where in it the reader is (chat_schema.c) */
} SchemaFrame;

/* The reader's state: a plain value (~330 bytes), copied to try each candidate token. */
typedef struct SchemaState {
    SchemaFrame f[SCHEMA_DEPTH];
    int depth;
    int mode;        /* what the next byte continues (chat_schema.c) */
    int node;        /* the node of the scalar being read / of the key's value */
    int sub;         /* number: its syntax state; \u escape: hex digits left; literal / enum / key: bytes matched */
    int len;         /* string: characters so far */
    int esc;         /* string: inside an escape (1: after '\', 2: in \uXXXX) */
    int hex;         /* \uXXXX: the digits so far */
    int hi;          /* string: the last escape was a high surrogate (a low one must follow) */
    const char *lit; /* true / false / null: the literal */
    uint64_t alive;  /* enum: values still matching; key: declared properties still matching */
    int key_other;   /* key: the bytes may still name a property that is not declared */
    int ws;          /* whitespace bytes in a row */
} SchemaState;

/* Compiles the schema (JSON text, len bytes). what names it in errors ("response_format.json_schema.schema").
 * Q35_ERR_ARG with one line (the keyword and where) for what it cannot enforce or cannot be satisfied. */
int schema_compile(const char *text, size_t len, const char *what, Schema **out, Err *err);
void schema_free(Schema *s);
void schema_start(const Schema *s, SchemaState *st);
/* Advances st over byte c: 0 = not allowed (st is then garbage: callers step a copy), 1 = taken, 2 = taken and the
 * value is complete (an object, array, string or literal closed at the top). */
int schema_step(const Schema *s, SchemaState *st, unsigned c);
/* 1 when the reader is inside a string value, or a key that cannot be a declared property, and not in an escape:
 * then bytes other than '"', '\\' and those below 0x20 are taken as they come, while *left characters remain
 * allowed (-1: no maxLength). A fast path for a guide. */
int schema_in_string(const Schema *s, const SchemaState *st, int *left);
/* 1 when the value read so far is complete (also a top-level number or enum value that more digits could extend). */
int schema_done(const Schema *s, const SchemaState *st);

#endif
