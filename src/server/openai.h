/* openai.h — the OpenAI wire format: request JSON -> validated parameters (every bad field answered with an
 * OpenAI error object naming it), and the response / stream-chunk / error JSON. Knows nothing about the engine
 * beyond the parameter ranges; the fuzz target (tests/fuzz/fuzz_request.c) drives oai_parse_request alone. */
#ifndef Q35_SERVER_OPENAI_H
#define Q35_SERVER_OPENAI_H
#include <stddef.h>
#include <stdint.h>

#include "qwen35.h"

/* OAI_RESPONSES and OAI_MESSAGES (Anthropic's) only route: their requests are parsed into chat requests */
enum { OAI_CHAT = 0, OAI_COMPLETION = 1, OAI_RESPONSES = 2, OAI_MESSAGES = 3 };

/* {"error":{"message","type","param","code"}} with its HTTP status. */
typedef struct OaiError {
    int status;       /* 400, 401, 404, 405, 413, 429, 500, 503 */
    const char *type; /* "invalid_request_error", "authentication_error", "not_found_error", ... */
    const char *code; /* NULL or e.g. "model_not_found", "context_length_exceeded" */
    char param[64];   /* the request field at fault, "" for none */
    char message[512];
} OaiError;

/* Fills e and returns -1 (so callers can `return oai_fail(...)`). */
int oai_fail(OaiError *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* An assistant message's tool_calls[i]: {"id", "type": "function", "function": {"name", "arguments"}}. */
typedef struct OaiToolCall {
    char *id;        /* NULL when absent */
    char *name;      /* required */
    char *arguments; /* JSON text of an object as sent (a string in OpenAI's shape; an object is re-printed) */
} OaiToolCall;

typedef struct OaiMessage {
    char *role;              /* system | user | assistant | tool */
    char *content;           /* text parts joined; "" for null */
    char *reasoning;         /* assistant reasoning_content, or NULL */
    OaiToolCall *tool_calls; /* assistant: the calls of this turn, or NULL */
    int n_tool_calls;
    char *tool_call_id; /* tool: the call answered, or NULL */
} OaiMessage;

/* Sampling fields the request set (the rest keep the model's defaults). */
enum {
    OAI_SET_TEMPERATURE = 1 << 0,
    OAI_SET_TOP_P = 1 << 1,
    OAI_SET_TOP_K = 1 << 2,
    OAI_SET_MIN_P = 1 << 3,
    OAI_SET_PRESENCE = 1 << 4,
    OAI_SET_REPETITION = 1 << 5,
    OAI_SET_SEED = 1 << 6,
};

#define OAI_MAX_STOP    16
#define OAI_MAX_N       16 /* choices per prompt (n) */
#define OAI_MAX_CHOICES 64 /* choices per request: prompts x n (completions with a list of prompts) */
typedef struct OaiRequest {
    int kind;    /* OAI_CHAT | OAI_COMPLETION */
    char *model; /* NULL when absent */
    OaiMessage *messages;
    int n_messages;
    char *prompt; /* completions: text prompt, or NULL when given as ids */
    int *prompt_ids;
    int n_prompt_ids;
    int n_prompts; /* completions: the prompts of the request (a list of strings or of id lists; else 1); prompt /
                      prompt_ids hold the one oai_parse_request_at was asked for */
    int stream, include_usage;
    int max_tokens; /* -1: up to the context */
    int n;          /* choices, 1 .. OAI_MAX_N: n sequences of the same prompt, each its own draws */
    int set;        /* OAI_SET_* */
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
    int top_k; /* 0 = off (-1 in the request means off too) */
    uint64_t seed;
    char *stop[OAI_MAX_STOP];
    int n_stop;
    /* vLLM's stop_token_ids: ids that end the completion (not returned), beside the model's */
    int stop_ids[OAI_MAX_STOP];
    int n_stop_ids;
    int top_logprobs; /* -1: no logprobs; else the alternatives per token (0..Q35_MAX_TOP_LOGPROBS) */
    int thinking;     /* Q35_THINK_DEFAULT | OFF | ON (chat_template_kwargs.enable_thinking) */
    int ignore_eos;   /* vLLM extension: keep going past the stop ids */
    int one_call;     /* parallel_tool_calls false: the reply ends with its first complete call */
    int echo;         /* completions: the text starts with the prompt (as text; ids detokenized) */
    int min_tokens;   /* vLLM's: no stop id before this many completion tokens (0: off) */
    char *tools;      /* chat: the "tools" array re-printed by cJSON (key order kept), or NULL (absent or []) */
    int n_tools;
    int tool_choice;        /* Q35_TOOL_CHOICE_* (auto when absent) */
    char *tool_choice_name; /* Q35_TOOL_CHOICE_FUNCTION: the function's name (one of tools) */
    int *bias_ids;          /* logit_bias: n_bias ids (< vocab) and their biases in [-100, 100] */
    float *bias;
    int n_bias;
    char *response_schema; /* response_format json_object / json_schema: the JSON Schema of the reply (text;
                               {"type": "object"} for json_object), NULL for text */
    int responses;         /* POST /v1/responses (responses.h): a chat request answered as a response object */
    char *resp_echo;       /* responses: JSON object of the settings the response object echoes */
    int anthropic;         /* POST /v1/messages (anthropic.h): a chat request answered as an Anthropic message */
} OaiRequest;

/* The request body as one JSON object (*root; cJSON_Delete frees it), read by pyjson_parse (number literals kept):
 * 400 when it is not valid JSON, has bytes other than blanks after the value, or is not an object; 500 out of
 * memory. */
struct cJSON;
int oai_parse_body(const char *body, size_t len, struct cJSON **root, OaiError *e);
/* Parses body[0..len) as a kind request. vocab: ids in a token prompt must be below it. 0 on success (free r
 * with oai_request_free), else -1 with e filled (status 400) and r holding nothing. */
int oai_parse_request(const char *body, size_t len, int kind, int vocab, OaiRequest *r, OaiError *e);
/* The same with prompt `at` of a completions request's list of prompts (every one validated; at < n_prompts). */
int oai_parse_request_at(const char *body, size_t len, int kind, int vocab, int at, OaiRequest *r, OaiError *e);
void oai_request_free(OaiRequest *r);

/* One alternative / chosen token for logprobs: its text (detokenized alone) and log-probability. */
typedef struct OaiTopLogprob {
    const char *token;
    float logprob;
} OaiTopLogprob;
enum { OAI_PART_CONTENT = 0, OAI_PART_REASONING = 1, OAI_PART_OTHER = 2 };
typedef struct OaiTokenLogprob {
    const char *token;
    float logprob;
    int n_top;
    OaiTopLogprob top[Q35_MAX_TOP_LOGPROBS];
    int part; /* OAI_PART_*: where the token's text went (reasoning; content; else a tool call's text, or nothing) */
} OaiTokenLogprob;

/* A generated tool call, or one stream delta of it: id and name only on its first delta (NULL after). */
typedef struct OaiCallOut {
    int index;
    const char *id;
    const char *name;
    const char *arguments; /* the JSON text (a delta: the fragment, "" on the first one) */
} OaiCallOut;

/* The text of one response, or of one stream chunk's delta. */
typedef struct OaiOutput {
    int index;               /* the choice (0 .. n - 1) */
    const char *content;     /* NULL: no content field in a delta (a response with tool calls: "content": null) */
    const char *reasoning;   /* NULL: none */
    const OaiCallOut *calls; /* chat: message.tool_calls / delta.tool_calls */
    int n_calls;
    const OaiTokenLogprob *logprobs;
    int n_logprobs;
    int want_logprobs;         /* put a logprobs object (possibly empty) in the choice */
    size_t text_offset;        /* completions' text_offset of the first token: bytes of text sent before */
    const char *finish_reason; /* "stop" | "length" | "tool_calls" | NULL (stream chunk still running) */
} OaiOutput;

typedef struct OaiUsage {
    int prompt_tokens, completion_tokens;
    int cached_tokens;    /* prompt tokens served from the prefix cache: usage.prompt_tokens_details.cached_tokens */
    int reasoning_tokens; /* completion tokens whose text went to the reasoning: completion_tokens_details */
} OaiUsage;

typedef struct OaiMeta {
    const char *id; /* "chatcmpl-..." / "cmpl-..." */
    long created;   /* unix seconds */
    const char *model;
} OaiMeta;

/* [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}] of lps[0, n) (part < 0) or of
 * those with that part: the entries of chat's logprobs.content and of the Responses API's output_text.logprobs. */
struct cJSON *oai_logprobs_array(const OaiTokenLogprob *lps, int n, int part);

/* Each returns a malloc'ed NUL-terminated JSON text, or NULL when out of memory. */
char *oai_error_json(const OaiError *e);
/* Non-streamed chat.completion / text_completion. */
char *oai_response_json(int kind, const OaiMeta *m, const OaiOutput *o, int n_choices, const OaiUsage *u);
/* One stream chunk. o: the choice's delta (NULL: a usage-only chunk with "choices": []); first: the chat delta
 * carries "role": "assistant"; u: NULL or the usage (include_usage: null on every chunk but the last). */
char *oai_chunk_json(int kind, const OaiMeta *m, const OaiOutput *o, int first, const OaiUsage *u, int with_usage);
/* GET /v1/models, and GET /v1/models/{model}: the model object alone */
char *oai_models_json(const char *model, long created, int max_model_len);
char *oai_model_json(const char *model, long created, int max_model_len);
/* POST /tokenize (vLLM's): a request is a completions one ("prompt") or a chat one ("messages", rendered with the
 * generation prompt); *kind says which, from the body. The answer: {"count", "max_model_len", "tokens"}. */
int oai_tokenize_kind(const char *body, size_t len, int *kind, OaiError *e);
char *oai_tokenize_json(const int *ids, int n, int max_model_len);
/* POST /detokenize (vLLM's): {"tokens": [ids < vocab]} -> *ids (malloc'ed), *n; the answer {"prompt": text}. */
int oai_parse_detokenize(const char *body, size_t len, int vocab, int **ids, int *n, OaiError *e);
char *oai_detokenize_json(const char *text);

#endif
