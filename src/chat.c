/* chat.c — renders a conversation into the ChatML prompt text, as HF apply_chat_template does with the
 * model's template (see chat.h for the two variants). Strings are handled as Python's str methods in
 * the template: split('</think>')[-1], strip('\n'), startswith/endswith. Tools lists and tool_calls are
 * not rendered; "tool" messages are (wrapped in <tool_response> inside a user turn). */
#include "chat.h"

#include <stdlib.h>

#include "tokenizer.h"

typedef struct Str {
    char *p;
    size_t n, cap;
    int oom;
} Str;

static void put(Str *s, const char *x, size_t n) {
    if (s->oom) return;
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + n + 1) cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) { s->oom = 1; return; }
        s->p = p;
        s->cap = cap;
    }
    memcpy(s->p + s->n, x, n);
    s->n += n;
    s->p[s->n] = 0;
}
static void puts_(Str *s, const char *x) { put(s, x, strlen(x)); }

/* A view [p, p+n) of a string. */
typedef struct View {
    const char *p;
    size_t n;
} View;

static View view(const char *s) { return (View){s ? s : "", s ? strlen(s) : 0}; }
static View lstrip_nl(View v) {
    while (v.n && v.p[0] == '\n') { v.p++; v.n--; }
    return v;
}
static View rstrip_nl(View v) {
    while (v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}
static const char *find(View v, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= v.n; i++)
        if (!memcmp(v.p + i, needle, k)) return v.p + i;
    return NULL;
}
static const char *find_last(View v, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = v.n; i >= k; i--)
        if (!memcmp(v.p + i - k, needle, k)) return v.p + i - k;
    return NULL;
}
static int starts(View v, const char *x) { size_t k = strlen(x); return v.n >= k && !memcmp(v.p, x, k); }
static int ends(View v, const char *x) { size_t k = strlen(x); return v.n >= k && !memcmp(v.p + v.n - k, x, k); }

/* content / reasoning of an assistant message, as the templates derive them. */
static void split_reasoning(const Q35ChatMessage *m, View *content, View *reasoning) {
    *content = view(m->content);
    *reasoning = view("");
    if (m->reasoning) {
        *reasoning = view(m->reasoning);
        return;
    }
    View c = *content;
    const char *close = find(c, "</think>");
    if (!close) return;
    const char *last = find_last(c, "</think>") + strlen("</think>");
    *content = lstrip_nl((View){last, (size_t)(c.p + c.n - last)});
    View before = rstrip_nl((View){c.p, (size_t)(close - c.p)}); /* split('</think>')[0].rstrip('\n') */
    const char *open = find_last(before, "<think>");           /* .split('<think>')[-1] */
    if (open) {
        const char *after = open + strlen("<think>");
        before = (View){after, (size_t)(before.p + before.n - after)};
    }
    *reasoning = lstrip_nl(before);
}

static int is_role(const Q35ChatMessage *m, const char *r) { return m->role && !strcmp(m->role, r); }

void chat_format_of(const Q35Tokenizer *t, ChatFormat *f) {
    f->family = t->family;
    f->default_thinking = t->family == Q35_TOK_QWEN35 ? Q35_THINK_OFF : Q35_THINK_ON;
    const char *tpl = t->chat_template;
    if (!tpl) return;
    int gate_true = strstr(tpl, "enable_thinking is true") != NULL;
    int gate_false = strstr(tpl, "enable_thinking is false") != NULL;
    if (gate_true != gate_false) f->default_thinking = gate_true ? Q35_THINK_OFF : Q35_THINK_ON;
}

int chat_render(const ChatFormat *f, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                char **out, Err *err) {
    *out = NULL;
    for (int i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return err_set(err, Q35_ERR_ARG, "chat message %d has no role or content", i);
    int q35 = f->family == Q35_TOK_QWEN35;
    if (thinking == Q35_THINK_DEFAULT) thinking = f->default_thinking;
    Str s = {0};
    put(&s, "", 0);
    if (n > 0 && is_role(&msgs[0], "system")) {
        puts_(&s, "<|im_start|>system\n");
        puts_(&s, msgs[0].content);
        puts_(&s, "<|im_end|>\n");
    }
    /* the last user message that is not a wrapped tool response */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        View c = view(msgs[i].content);
        if (is_role(&msgs[i], "user") && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const Q35ChatMessage *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            puts_(&s, "<|im_start|>");
            puts_(&s, m->role);
            puts_(&s, "\n");
            puts_(&s, m->content);
            puts_(&s, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            View content, reasoning;
            split_reasoning(m, &content, &reasoning);
            puts_(&s, "<|im_start|>assistant\n");
            /* Qwen3 writes the think block after the last query only for the final turn or when there is
             * reasoning; Qwen3.5 always does there. */
            if (i > last_query && (q35 || i == n - 1 || reasoning.n)) {
                View r = rstrip_nl(lstrip_nl(reasoning)), c = lstrip_nl(content);
                puts_(&s, "<think>\n");
                put(&s, r.p, r.n);
                puts_(&s, "\n</think>\n\n");
                put(&s, c.p, c.n);
            } else {
                put(&s, content.p, content.n);
            }
            puts_(&s, "<|im_end|>\n");
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) puts_(&s, "<|im_start|>user");
            puts_(&s, "\n<tool_response>\n");
            puts_(&s, m->content);
            puts_(&s, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool")) puts_(&s, "<|im_end|>\n");
        } else if (!is_role(m, "system")) {
            free(s.p);
            return err_set(err, Q35_ERR_ARG, "chat message %d: unknown role '%s'", i, m->role);
        }
    }
    if (add_generation_prompt) {
        puts_(&s, "<|im_start|>assistant\n");
        if (q35) puts_(&s, thinking ? "<think>\n" : "<think>\n\n</think>\n\n");
        else if (!thinking) puts_(&s, "<think>\n\n</think>\n\n");
    }
    if (s.oom) {
        free(s.p);
        return err_set(err, Q35_ERR_OOM, "out of memory");
    }
    *out = s.p;
    return 0;
}

int q35_chat_default_thinking(const Q35Tokenizer *t) {
    ChatFormat f;
    chat_format_of(t, &f);
    return f.default_thinking;
}

int q35_chat_render(const Q35Tokenizer *t, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                    char **out, Q35Err *err) {
    ChatFormat f;
    chat_format_of(t, &f);
    return chat_render(&f, msgs, n, add_generation_prompt, thinking, out, err);
}
