/* chat_tools.c — the tools half of the chat templates: the tools block of the system turn (each tool as
 * tojson = json.dumps(tool, ensure_ascii=False)) and the tool calls of an assistant turn.
 * Qwen3.5: "<tool_call>\n<function=NAME>\n" then per argument "<parameter=KEY>\n" VALUE "\n</parameter>\n"
 * (VALUE: tojson for objects and arrays, Python str() otherwise: "True", "None", "1.0"), then
 * "</function>\n</tool_call>"; calls joined by "\n", "\n\n" before the first when the content is not empty.
 * Qwen3: "<tool_call>\n{\"name\": \"NAME\", \"arguments\": " tojson(arguments) "}\n</tool_call>" (arguments
 * given as a dict, as vLLM passes them), "\n" before each call but a first one after empty content.
 * The literal texts below are copied from the official templates (docs/CHAT.md lists their sha256). */
#include <stdio.h>
#include <stdlib.h>

#include "chat.h"
#include "pyjson.h"

static const char q35_tools_head[] = "# Tools\n"
                                     "\n"
                                     "You have access to the following functions:\n"
                                     "\n"
                                     "<tools>";
static const char q35_tools_tail[] =
    "\n"
    "\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n"
    "\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n"
    "\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within "
    "<tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT "
    "after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do not "
    "tell the user about function calls\n"
    "</IMPORTANT>";
static const char q3_tools_head[] = "# Tools\n"
                                    "\n"
                                    "You may call one or more functions to assist with the user query.\n"
                                    "\n"
                                    "You are provided with function signatures within <tools></tools> XML tags:\n"
                                    "<tools>";
static const char q3_tools_tail[] = "\n"
                                    "</tools>\n"
                                    "\n"
                                    "For each function call, return a json object with function name and arguments "
                                    "within <tool_call></tool_call> XML tags:\n"
                                    "<tool_call>\n"
                                    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
                                    "</tool_call><|im_end|>\n";

int chat_tools_parse(ChatTools *ct, const char *json, Err *err) {
    *ct = (ChatTools){0};
    if (!json) return 0;
    cJSON *root;
    int rc = pyjson_parse(json, strlen(json), "tools", &root, err);
    if (rc) return rc;
    if (!cJSON_IsArray(root)) {
        cJSON_Delete(root);
        return err_set(err, Q35_ERR_FORMAT, "tools: not a JSON array");
    }
    ct->n = cJSON_GetArraySize(root);
    if (ct->n == 0)
        cJSON_Delete(root);
    else
        ct->root = root;
    return 0;
}

void chat_tools_free(ChatTools *ct) {
    cJSON_Delete(ct->root);
    *ct = (ChatTools){0};
}

const cJSON *chat_tool_function(const ChatTools *ct, int i) {
    const cJSON *t = ct->root ? cJSON_GetArrayItem(ct->root, i) : NULL;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    return cJSON_IsObject(fn) ? fn : cJSON_IsObject(t) ? t : NULL;
}

const cJSON *chat_tool_find(const ChatTools *ct, const char *name, size_t n) {
    for (int i = 0; i < ct->n; i++) {
        const cJSON *fn = chat_tool_function(ct, i);
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (cJSON_IsString(nm) && strlen(nm->valuestring) == n && !memcmp(nm->valuestring, name, n)) return fn;
    }
    return NULL;
}

const char *chat_param_type(const cJSON *fn, const char *p, size_t n) {
    const cJSON *props =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"), "properties");
    const cJSON *prop = NULL;
    for (const cJSON *c = cJSON_IsObject(props) ? props->child : NULL; c; c = c->next)
        if (strlen(c->string) == n && !memcmp(c->string, p, n)) prop = c; /* the last one, as a dict keeps */
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(prop, "type");
    if (cJSON_IsString(ty)) return ty->valuestring;
    if (cJSON_IsArray(ty))
        for (const cJSON *e = ty->child; e; e = e->next)
            if (cJSON_IsString(e) && strcmp(e->valuestring, "null")) return e->valuestring;
    return NULL;
}

void chat_tools_block(StrBuf *s, const ChatTools *ct, int q35) {
    sb_puts(s, q35 ? q35_tools_head : q3_tools_head);
    for (const cJSON *t = ct->root->child; t; t = t->next) {
        sb_putc(s, '\n');
        pyjson_dump(s, t);
    }
    if (q35) {
        sb_puts(s, "\n</tools>");
        sb_puts(s, q35_tools_tail);
    } else {
        sb_puts(s, q3_tools_tail);
    }
}

int chat_tool_calls(StrBuf *s, const Q35ChatMessage *m, int q35, int content_nonempty, Err *err) {
    for (int k = 0; k < m->n_tool_calls; k++) {
        const Q35ChatToolCall *tc = &m->tool_calls[k];
        cJSON *args = NULL;
        if (tc->arguments && tc->arguments[0]) {
            char what[64];
            snprintf(what, sizeof what, "tool call %d arguments", k);
            int rc = pyjson_parse(tc->arguments, strlen(tc->arguments), what, &args, err);
            if (rc) return rc;
        }
        if (q35) {
            if (args && !cJSON_IsObject(args)) {
                cJSON_Delete(args);
                return err_set(err, Q35_ERR_ARG, "tool call %d (%s): arguments are not a JSON object", k, tc->name);
            }
            sb_puts(s, k                  ? "\n<tool_call>\n<function="
                       : content_nonempty ? "\n\n<tool_call>\n<function="
                                          : "<tool_call>\n<function=");
            sb_puts(s, tc->name);
            sb_puts(s, ">\n");
            for (const cJSON *a = args ? args->child : NULL; a; a = a->next) {
                if (pyjson_key_shadowed(args->child, a)) continue;
                const cJSON *v = pyjson_key_value(a);
                sb_puts(s, "<parameter=");
                sb_puts(s, a->string);
                sb_puts(s, ">\n");
                if (cJSON_IsObject(v) || cJSON_IsArray(v))
                    pyjson_dump(s, v);
                else
                    pyjson_str(s, v);
                sb_puts(s, "\n</parameter>\n");
            }
            sb_puts(s, "</function>\n</tool_call>");
        } else {
            if (k || content_nonempty) sb_putc(s, '\n');
            sb_puts(s, "<tool_call>\n{\"name\": \"");
            sb_puts(s, tc->name);
            sb_puts(s, "\", \"arguments\": ");
            if (args)
                pyjson_dump(s, args);
            else
                sb_puts(s, "{}");
            sb_puts(s, "}\n</tool_call>");
        }
        cJSON_Delete(args);
    }
    return 0;
}
