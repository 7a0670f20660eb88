/* fuzz_chat_template.c — libFuzzer target: the chat-template renderer (q35_chat_render_request: ChatML for
 * Qwen3 and Qwen3.5, tools, tool calls, reasoning, thinking modes) on arbitrary conversations. Input:
 *   byte 0: bit 0 family (Qwen3 / Qwen3.5), bit 1 add_generation_prompt, bits 2-3 thinking (default, off, on),
 *           bits 4-5 tool_choice (auto, none, required, function)
 *   then records separated by 0x1e: the first is the tools JSON ("" = none); each next one is a message,
 *   fields separated by 0x1f: role, content, reasoning, tool_call_id, then name / arguments pairs of its
 *   tool calls ("" = NULL for the optional fields).
 * A render that succeeds is NUL-terminated text; one that fails has a one-line message. make fuzz builds
 * it; seeds: tests/fuzz/chat_template/. */
#include "fuzz.h"
#include "qwen35.h"

#define MAX_MSG    16
#define MAX_CALLS  4
#define MAX_FIELDS (4 + 2 * MAX_CALLS)

/* Splits s (NUL-terminated, modified) at sep into at most max pieces; returns the count. */
static int split(char *s, char sep, char **out, int max) {
    int k = 0;
    out[k++] = s;
    for (char *p = s; *p && k < max; p++)
        if (*p == sep) *p = 0, out[k++] = p + 1;
    return k;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    if (n < 1) return 0;
    char *text = fuzz_cstr(data + 1, n - 1);
    const unsigned flags = data[0];
    char *rec[MAX_MSG + 1];
    int n_rec = split(text, 0x1e, rec, MAX_MSG + 1);
    Q35ChatMessage msgs[MAX_MSG];
    Q35ChatToolCall calls[MAX_MSG][MAX_CALLS];
    int n_msg = 0;
    for (int r = 1; r < n_rec; r++) {
        char *f[MAX_FIELDS];
        int k = split(rec[r], 0x1f, f, MAX_FIELDS);
        Q35ChatMessage *m = &msgs[n_msg];
        memset(m, 0, sizeof *m);
        m->role = f[0];
        m->content = k > 1 && f[1][0] ? f[1] : NULL;
        m->reasoning = k > 2 && f[2][0] ? f[2] : NULL;
        m->tool_call_id = k > 3 && f[3][0] ? f[3] : NULL;
        for (int c = 0; 4 + 2 * c < k && c < MAX_CALLS; c++) {
            calls[n_msg][c] = (Q35ChatToolCall){NULL, f[4 + 2 * c], 5 + 2 * c < k ? f[5 + 2 * c] : NULL};
            m->n_tool_calls = c + 1;
        }
        m->tool_calls = m->n_tool_calls ? calls[n_msg] : NULL;
        n_msg++;
    }
    const int thinking[4] = {Q35_THINK_DEFAULT, Q35_THINK_OFF, Q35_THINK_ON, Q35_THINK_DEFAULT};
    Q35ChatRequest rq = {
        .messages = msgs,
        .n_messages = n_msg,
        .tools = rec[0][0] ? rec[0] : NULL,
        .tool_choice = (flags >> 4) & 3,
        .tool_choice_name = n_msg && msgs[0].n_tool_calls ? msgs[0].tool_calls[0].name : "f",
        .add_generation_prompt = (flags >> 1) & 1,
        .thinking = thinking[(flags >> 2) & 3],
        .family = flags & 1 ? Q35_TOK_QWEN35 : Q35_TOK_QWEN3,
    };
    char *out = NULL;
    Q35Err err = {0};
    if (q35_chat_render_request(NULL, &rq, &out, &err) == 0) {
        REQUIRE(out != NULL);
        free(out);
    } else {
        REQUIRE(err.code < 0 && err.msg[0] && !strchr(err.msg, '\n'));
    }
    free(text);
    return 0;
}
