/* responses.h — OpenAI's Responses API (POST /v1/responses) on top of the chat path: the request is translated into
 * a chat completions request (oai_parse_request reads it, so every setting is validated once), and the answer is
 * written as a response object, or streamed as the API's typed events (response.created, output items with their
 * content parts and deltas, response.completed / incomplete / failed). No state is kept between requests: a
 * conversation is sent whole as `input` (previous_response_id, conversation and background are refused). */
#ifndef Q35_SERVER_RESPONSES_H
#define Q35_SERVER_RESPONSES_H
#include <stddef.h>

#include "server/openai.h"

/* Parses a /v1/responses body into r (a chat request; r->responses set, r->resp_echo the settings echoed in the
 * response object). Errors name the Responses API's fields (input[i]..., max_output_tokens, text.format, ...). */
int oai_parse_responses(const char *body, size_t len, int vocab, OaiRequest *r, OaiError *e);

enum { OAI_ITEM_REASONING = 0, OAI_ITEM_MESSAGE = 1, OAI_ITEM_CALL = 2 };
/* One output item: reasoning (reasoning_text), an assistant message (output_text) or a function call. */
typedef struct OaiRespItem {
    int type;                   /* OAI_ITEM_* */
    const char *id;             /* rs_..., msg_..., fc_... */
    const char *text;           /* the reasoning or message text, or the call's arguments (JSON text) */
    const char *call_id, *name; /* calls */
    int done; /* 0: status "in_progress", its text not yet in the item; 1 "completed"; 2 "incomplete" (cut by
               * max_output_tokens) */
    const OaiTokenLogprob *lps; /* message: the tokens' logprobs (those of part OAI_PART_CONTENT are its), or NULL */
    int n_lps;
} OaiRespItem;

/* The response object. status: "in_progress" | "completed" | "incomplete" (incomplete_details.reason
 * "max_output_tokens") | "failed" (err: its error). u: NULL (usage null) or the usage. Each returns malloc'ed JSON
 * text, NULL when out of memory. */
char *oai_resp_json(const OaiMeta *m, const OaiRequest *rq, const char *status, const OaiRespItem *items, int n,
                    const OaiUsage *u, const OaiError *err);
/* Stream events, each with its type and sequence_number seq:
 *   response.created / in_progress / completed / incomplete / failed: {"response": oai_resp_json's object};
 *   response.output_item.added / done: output_index, item;
 *   response.content_part.added / done: item_id, output_index, content_index 0, part (output_text or
 *     reasoning_text with text);
 *   response.output_text.delta / done, response.reasoning_text.delta / done: item_id, output_index,
 *     content_index 0, delta or text (value);
 *   response.function_call_arguments.delta / done: item_id, output_index, delta or arguments (value). */
char *oai_resp_event_response(const char *type, int seq, const OaiMeta *m, const OaiRequest *rq, const char *status,
                              const OaiRespItem *items, int n, const OaiUsage *u, const OaiError *err);
char *oai_resp_event_item(const char *type, int seq, int output_index, const OaiRespItem *item);
char *oai_resp_event_part(const char *type, int seq, int output_index, const OaiRespItem *item);
/* For output_text events, lps[0, n_lps) (the content tokens of a delta; of done: the item's) as its logprobs. */
char *oai_resp_event_text(const char *type, int seq, int output_index, const OaiRespItem *item, const char *value,
                          const OaiTokenLogprob *lps, int n_lps);

#endif
