/* anthropic.h — Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on top of the chat path:
 * the request is translated into a chat completions request (oai_parse_request validates it), and the answer is
 * written as a message object, or streamed as the API's events (message_start, content blocks with their deltas,
 * message_delta, message_stop). Errors are Anthropic's error objects. */
#ifndef Q35_SERVER_ANTHROPIC_H
#define Q35_SERVER_ANTHROPIC_H
#include <stddef.h>

#include "server/openai.h"
#include "server/responses.h"

/* Parses a /v1/messages body into r (a chat request, r->anthropic set). count: /v1/messages/count_tokens (no
 * max_tokens needed). Errors name the Messages API's fields (stop_sequences, thinking, messages[i].content[j]). */
int ant_parse_messages(const char *body, size_t len, int vocab, int count, OaiRequest *r, OaiError *e);

/* {"type": "error", "error": {"type", "message"}}, the type from e->status. */
char *ant_error_json(const OaiError *e);

/* How a message ended: stop_reason and stop_sequence from the chat path's finish_reason ("stop", "length",
 * "tool_calls", "abort") and the stop string that matched (NULL: none). */
typedef struct AntStop {
    const char *finish_reason;
    const char *stop_sequence;
} AntStop;

/* The message object: content blocks from the items (OaiRespItem: reasoning -> thinking, message -> text, call ->
 * tool_use with its arguments parsed as the input object), stop_reason / stop_sequence (st NULL: null, as in
 * message_start), usage (input_tokens: the prompt tokens not served from the prefix cache, cache_read_input_tokens
 * those that were). Each returns malloc'ed JSON text, NULL when out of memory. */
char *ant_message_json(const OaiMeta *m, const OaiRespItem *items, int n, const AntStop *st, const OaiUsage *u);
/* Stream events: message_start (the message with no content, stop_reason null, output_tokens 0);
 * content_block_start (index, the block empty: text "", thinking "", tool_use with input {});
 * content_block_delta (text_delta, thinking_delta or input_json_delta with value); content_block_stop;
 * message_delta (stop_reason, stop_sequence, usage.output_tokens); message_stop. */
char *ant_event_start(const OaiMeta *m, const OaiUsage *u);
char *ant_event_block_start(int index, const OaiRespItem *item);
char *ant_event_block_delta(int index, const OaiRespItem *item, const char *value);
char *ant_event_block_stop(int index);
char *ant_event_delta(const AntStop *st, const OaiUsage *u);
char *ant_event_stop(void);
/* POST /v1/messages/count_tokens: {"input_tokens": n}. */
char *ant_count_json(int n);

#endif
