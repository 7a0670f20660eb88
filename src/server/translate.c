/* translate.c — the helpers of translate.h. */
#include "server/translate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pyjson.h"

int tr_bad(OaiError *e, const char *param, const char *what) {
    return oai_fail(e, 400, "invalid_request_error", NULL, param, "'%s' %s", param, what);
}

int tr_oom(OaiError *e) { return oai_fail(e, 500, "server_error", NULL, NULL, "out of memory"); }

cJSON *tr_field(const cJSON *o, const char *name) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsNull(v) ? NULL : v;
}

int tr_put(cJSON *o, const char *name, const cJSON *v) {
    cJSON *c = cJSON_Duplicate(v, 1); /* valuestring copied too: pyjson_parse's number literals stay */
    if (!c) return -1;
    cJSON_AddItemToObject(o, name, c);
    return 0;
}

int tr_parts_text(const cJSON *c, const char *const *types, const char *param, char **out, OaiError *e) {
    if (cJSON_IsString(c)) return (*out = strdup(c->valuestring)) ? 0 : tr_oom(e);
    if (!cJSON_IsArray(c)) return tr_bad(e, param, "must be a string or an array of text parts");
    StrBuf b = {0};
    sb_puts(&b, "");
    const cJSON *p;
    int i = 0;
    cJSON_ArrayForEach(p, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "type"), *x = cJSON_GetObjectItemCaseSensitive(p, "text");
        int known = 0;
        for (int k = 0; types[k] && cJSON_IsString(t); k++) known |= !strcmp(t->valuestring, types[k]);
        if (!cJSON_IsObject(p) || !known || !cJSON_IsString(x)) {
            char what[160], at[64];
            snprintf(at, sizeof at, "%s[%d]", param, i);
            snprintf(what, sizeof what, "must be {\"type\": \"%s\", \"text\": string} (no images, files or audio)",
                     types[0]);
            sb_free(&b);
            return tr_bad(e, at, what);
        }
        sb_puts(&b, x->valuestring);
        i++;
    }
    if (b.oom) {
        sb_free(&b);
        return tr_oom(e);
    }
    *out = b.p;
    return 0;
}

int tr_tools(const cJSON *tools, cJSON *chat, const char *type, int type_optional, const char *what,
             const char *const (*keys)[2], int n, OaiError *e) {
    if (!cJSON_IsArray(tools)) return tr_bad(e, "tools", "must be an array of tools");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    if (!out) return tr_oom(e);
    const cJSON *t;
    int i = 0;
    cJSON_ArrayForEach(t, tools) {
        char param[48];
        const cJSON *ty = tr_field(t, "type"), *name = tr_field(t, "name");
        snprintf(param, sizeof param, "tools[%d]", i);
        if (!cJSON_IsObject(t) || (ty ? !cJSON_IsString(ty) || strcmp(ty->valuestring, type) : !type_optional))
            return tr_bad(e, param, what);
        if (!cJSON_IsString(name) || !name->valuestring[0]) {
            snprintf(param, sizeof param, "tools[%d].name", i);
            return tr_bad(e, param, "must be a non-empty string");
        }
        cJSON *c = cJSON_CreateObject(); /* "type" first: the template prints the tool with its keys in order */
        cJSON *fn = c && cJSON_AddStringToObject(c, "type", "function") ? cJSON_AddObjectToObject(c, "function") : NULL;
        if (!fn) {
            cJSON_Delete(c);
            return tr_oom(e);
        }
        cJSON_AddItemToArray(out, c);
        for (int k = 0; k < n; k++) {
            const cJSON *v = tr_field(t, keys[k][0]);
            if (v && tr_put(fn, keys[k][1], v)) return tr_oom(e);
        }
        i++;
    }
    return 0;
}

int tr_chat_fields(const cJSON *root, cJSON *chat, OaiError *e) {
    static const char *const same[] = {"model",
                                       "stream",
                                       "temperature",
                                       "top_p",
                                       "top_k",
                                       "min_p",
                                       "seed",
                                       "presence_penalty",
                                       "frequency_penalty",
                                       "repetition_penalty",
                                       "stop_token_ids",
                                       "ignore_eos",
                                       "min_tokens",
                                       "logit_bias"};
    for (size_t k = 0; k < sizeof same / sizeof same[0]; k++) {
        const cJSON *v = tr_field(root, same[k]);
        if (v && tr_put(chat, same[k], v)) return tr_oom(e);
    }
    return 0;
}

cJSON *tr_add_message(cJSON *msgs, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    if (!m || !cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", content)) {
        cJSON_Delete(m);
        return NULL;
    }
    cJSON_AddItemToArray(msgs, m);
    return m;
}

int tr_parse_chat(const cJSON *chat, int vocab, OaiRequest *r, const TrRename *map, int n, OaiError *e) {
    StrBuf text = {0};
    pyjson_dump_strict(&text, chat);
    if (text.oom || !text.p) {
        sb_free(&text);
        memset(r, 0, sizeof *r);
        return tr_oom(e);
    }
    const int rc = oai_parse_request(text.p, text.n, OAI_CHAT, vocab, r, e);
    sb_free(&text);
    for (int k = 0; rc && k < n; k++) {
        const size_t l = strlen(map[k].from);
        if (strncmp(e->param, map[k].from, l)) continue;
        char rest[64];
        snprintf(rest, sizeof rest, "%s", map[k].whole ? "" : e->param + l);
        snprintf(e->param, sizeof e->param, "%s%s", map[k].to, rest);
        break;
    }
    return rc;
}
