/* translate.h — what the Responses and Messages APIs share to become chat requests (responses.c, anthropic.c):
 * field lookups, copies, text parts joined, tools, and the last step: the chat request printed and read by
 * oai_parse_request, its error params renamed to the API's fields. (Their bodies are read by oai_parse_body.) */
#ifndef Q35_SERVER_TRANSLATE_H
#define Q35_SERVER_TRANSLATE_H
#include <cjson/cJSON.h>
#include <stddef.h>

#include "server/openai.h"

/* A 400 naming param ("'param' what"), and the out-of-memory 500; both return -1. */
int tr_bad(OaiError *e, const char *param, const char *what);
int tr_oom(OaiError *e);
/* A member of o; absent and JSON null alike. */
cJSON *tr_field(const cJSON *o, const char *name);
/* A copy of v (number literals kept) into o under name; 0, or -1 out of memory. */
int tr_put(cJSON *o, const char *name, const cJSON *v);
/* Text of a content value: a string, or an array of parts {"type": one of types (NULL-terminated), "text": string},
 * joined into *out (malloc'ed). Another part is a 400 naming param[i]. */
int tr_parts_text(const cJSON *c, const char *const *types, const char *param, char **out, OaiError *e);
/* The API's tools array as chat's "tools" in chat: each tool an object whose "type" is `type` (or, with
 * type_optional, absent) and with a non-empty "name", else a 400 naming tools[i] (what: the form expected) or
 * tools[i].name; each becomes {"type": "function", "function": {...}} with the tool's members keys[k][0] copied as
 * keys[k][1] (k < n). */
int tr_tools(const cJSON *tools, cJSON *chat, const char *type, int type_optional, const char *what,
             const char *const (*keys)[2], int n, OaiError *e);
/* Copies into chat what the APIs share with a chat request as it is: model, stream, temperature, top_p, and the chat
 * path's extensions (top_k, min_p, seed, penalties, stop_token_ids, ignore_eos, min_tokens, logit_bias). */
int tr_chat_fields(const cJSON *root, cJSON *chat, OaiError *e);
/* Appends {"role", "content"} to msgs; returns it, NULL out of memory. */
cJSON *tr_add_message(cJSON *msgs, const char *role, const char *content);

/* A param rename: an error param starting with from becomes to + the rest, or (whole) to alone. */
typedef struct TrRename {
    const char *from, *to;
    int whole;
} TrRename;
/* chat (a chat completions request) read by oai_parse_request into r; an error's param renamed by the first entry
 * of map[0, n) it starts with. */
int tr_parse_chat(const cJSON *chat, int vocab, OaiRequest *r, const TrRename *map, int n, OaiError *e);

#endif
