/* chat.h — ChatML prompt rendering in C (no Jinja) for the two Qwen families, tools included, and the
 * shared pieces of the output parser and the tool_choice guide (docs/CHAT.md).
 * Qwen3: the chat_template of Qwen3's tokenizer_config.json; thinking on by default, enable_thinking=false
 * appends "<think>\n\n</think>\n\n"; tool calls are JSON inside <tool_call>. Qwen3.5: chat_template.jinja
 * (shared/data/qwen35/); contents are trimmed (Python str.strip), assistant turns after the last user query
 * carry "<think>\n{reasoning}\n</think>\n\n", tool calls are XML (<function=NAME><parameter=P>), the
 * generation prompt is "<think>\n" (thinking) or "<think>\n\n</think>\n\n". */
#ifndef Q35_CHAT_H
#define Q35_CHAT_H

#include <cjson/cJSON.h>

#include "strbuf.h"
#include "util.h"

typedef struct ChatFormat {
    int family;           /* Q35_TOK_QWEN3 | Q35_TOK_QWEN35 (Q35_TOK_OTHER renders as Qwen3) */
    int default_thinking; /* what Q35_THINK_DEFAULT means */
} ChatFormat;

/* The format for a tokenizer: its family, and the default read from its chat template when it says
 * ("enable_thinking is true" gates thinking -> off by default; "is false" gates the empty block -> on). */
void chat_format_of(const Q35Tokenizer *t, ChatFormat *f);
/* The format of a request: rq->family when set (default thinking: Qwen3 on, Qwen3.5 off), else t's. */
int chat_format_for(const Q35Tokenizer *t, int family, ChatFormat *f, Err *err);
int chat_render(const ChatFormat *f, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                char **out, Err *err);
int chat_render_request(const ChatFormat *f, const Q35ChatRequest *rq, char **out, Err *err);

/* ---- tools (chat_tools.c) ---- */
/* The parsed "tools" array: root is NULL when there are none (NULL text, or an empty array). */
typedef struct ChatTools {
    cJSON *root;
    int n;
} ChatTools;
/* Parses JSON text (pyjson_parse): must be an array of objects. Q35_ERR_FORMAT otherwise. */
int chat_tools_parse(ChatTools *ct, const char *json, Err *err);
void chat_tools_free(ChatTools *ct);
/* The function object of tool i ({"type":"function","function":{...}} or a bare {"name":...}), or NULL. */
const cJSON *chat_tool_function(const ChatTools *ct, int i);
/* The function object named name[0..n), or NULL. */
const cJSON *chat_tool_find(const ChatTools *ct, const char *name, size_t n);
/* The declared JSON schema type of parameter p[0..n) of fn ("string", "integer", ...; the first non-"null"
 * entry of a type list; NULL when undeclared). */
const char *chat_param_type(const cJSON *fn, const char *p, size_t n);
/* The system turn's tools block (without <|im_start|>system\n and without the system text). */
void chat_tools_block(StrBuf *s, const ChatTools *ct, int q35);
/* One assistant turn's tool calls as the template writes them after the content (content_nonempty: the
 * content as the template tests it). */
int chat_tool_calls(StrBuf *s, const Q35ChatMessage *m, int q35, int content_nonempty, Err *err);

#endif
