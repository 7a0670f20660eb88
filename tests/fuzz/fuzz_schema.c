/* fuzz_schema.c — libFuzzer target over the response_format schema compiler and reader (src/chat_schema.c).
 * Input: a JSON Schema, then 0x1e, then a reply. The compile must succeed or fail with one line; a reply the reader
 * takes byte by byte and calls complete must parse as JSON (cJSON), and a refused byte must stay refused when
 * stepped again from the same state (the reader is a function of its state).
 * Build: make fuzz (-> build/fuzz/fuzz_schema); run: make fuzz-run, or
 * build/fuzz/fuzz_schema -runs=1000000 CORPUS_DIR tests/fuzz/schema */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *sep = memchr(data, 0x1e, size);
    size_t ns = sep ? (size_t)(sep - data) : size;
    Schema *s = NULL;
    Err err = {0};
    if (schema_compile((const char *)data, ns, "schema", &s, &err)) {
        if (s || !err.msg[0] || strchr(err.msg, '\n')) abort(); /* a failure is one line and no schema */
        return 0;
    }
    if (!s) abort();
    const char *doc = sep ? (const char *)sep + 1 : "";
    size_t nd = sep ? size - ns - 1 : 0;
    SchemaState st;
    schema_start(s, &st);
    size_t taken = 0;
    for (; taken < nd; taken++) {
        SchemaState a = st, b = st;
        int ra = schema_step(s, &a, (unsigned char)doc[taken]), rb = schema_step(s, &b, (unsigned char)doc[taken]);
        if (ra != rb) abort();
        if (!ra) break;
        st = a;
    }
    if (schema_done(s, &st)) {
        cJSON *v = cJSON_ParseWithLength(doc, taken);
        if (!v) abort(); /* complete means valid JSON */
        cJSON_Delete(v);
    }
    schema_free(s);
    return 0;
}
