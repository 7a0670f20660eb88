/* chat.c — renders a conversation into the ChatML prompt text, as HF apply_chat_template does with the
 * model's template (chat.h). Strings are handled as Python's str methods in the templates: strip() (the
 * Jinja trim filter: Unicode whitespace), split('</think>')[-1], strip('\n'), startswith/endswith. The tools
 * block and the tool calls are in chat_tools.c. */
#include "chat.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* A view [p, p+n) of a string. */
typedef struct View {
    const char *p;
    size_t n;
} View;

static View view(const char *s) { return (View){s ? s : "", s ? strlen(s) : 0}; }
static void put_view(StrBuf *s, View v) { sb_put(s, v.p, v.n); }
static View lstrip_nl(View v) {
    while (v.n && v.p[0] == '\n') {
        v.p++;
        v.n--;
    }
    return v;
}
static View rstrip_nl(View v) {
    while (v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}

/* Python str.isspace for one code point. */
static int py_space(unsigned c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}
/* Decodes the UTF-8 sequence of k bytes at p (k from its lead byte); 0xFFFFFFFF when malformed. */
static unsigned utf8_at(const unsigned char *p, size_t avail, size_t *k) {
    unsigned c = p[0];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    *k = len ? len : 1;
    if (!len || len > avail) return 0xFFFFFFFFu;
    if (len == 1) return c;
    unsigned v = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80) return 0xFFFFFFFFu;
        v = v << 6 | (p[i] & 0x3f);
    }
    return v;
}
/* Python str.strip(): Unicode whitespace off both ends. */
static View py_strip(View v) {
    size_t k;
    while (v.n && py_space(utf8_at((const unsigned char *)v.p, v.n, &k))) {
        v.p += k;
        v.n -= k;
    }
    while (v.n) {
        size_t b = v.n - 1; /* start of the last code point */
        while (b > 0 && v.n - b < 4 && ((unsigned char)v.p[b] & 0xc0) == 0x80) b--;
        unsigned c = utf8_at((const unsigned char *)v.p + b, v.n - b, &k);
        if (b + k != v.n || !py_space(c)) break;
        v.n = b;
    }
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
static int starts(View v, const char *x) {
    size_t k = strlen(x);
    return v.n >= k && !memcmp(v.p, x, k);
}
static int ends(View v, const char *x) {
    size_t k = strlen(x);
    return v.n >= k && !memcmp(v.p + v.n - k, x, k);
}
static int is_tool_response(View c) { return starts(c, "<tool_response>") && ends(c, "</tool_response>"); }

/* content / reasoning of an assistant message as both templates derive them: reasoning given, or
 * content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') and the content after the
 * last '</think>' with lstrip('\n'). */
static void split_reasoning(const Q35ChatMessage *m, View *content, View *reasoning) {
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
    View before = rstrip_nl((View){c.p, (size_t)(close - c.p)});
    const char *open = find_last(before, "<think>");
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

int chat_format_for(const Q35Tokenizer *t, int family, ChatFormat *f, Err *err) {
    if (family == Q35_TOK_QWEN3 || family == Q35_TOK_QWEN35) {
        f->family = family;
        f->default_thinking = family == Q35_TOK_QWEN35 ? Q35_THINK_OFF : Q35_THINK_ON;
        if (t && t->family == family) chat_format_of(t, f);
        return 0;
    }
    if (family) return err_set(err, Q35_ERR_ARG, "chat: unknown template family %d", family);
    if (!t) return err_set(err, Q35_ERR_ARG, "chat: no tokenizer and no template family");
    chat_format_of(t, f);
    return 0;
}

static int check_messages(const Q35ChatMessage *msgs, int n, Err *err) {
    for (int i = 0; i < n; i++) {
        const Q35ChatMessage *m = &msgs[i];
        if (!m->role) return err_set(err, Q35_ERR_ARG, "chat message %d has no role", i);
        if (!m->content && !is_role(m, "assistant"))
            return err_set(err, Q35_ERR_ARG, "chat message %d (%s) has no content", i, m->role);
        if (!is_role(m, "system") && !is_role(m, "user") && !is_role(m, "assistant") && !is_role(m, "tool"))
            return err_set(err, Q35_ERR_ARG, "chat message %d: unknown role '%s'", i, m->role);
        if (m->n_tool_calls < 0 || (m->n_tool_calls > 0 && !m->tool_calls))
            return err_set(err, Q35_ERR_ARG, "chat message %d: bad tool_calls", i);
        for (int k = 0; k < m->n_tool_calls; k++)
            if (!m->tool_calls[k].name)
                return err_set(err, Q35_ERR_ARG, "chat message %d: tool call %d has no name", i, k);
    }
    return 0;
}

/* Qwen3.5 (chat_template.jinja): every content is trimmed; tools go first in the system turn. */
static int render_qwen35(StrBuf *s, const Q35ChatRequest *rq, const ChatTools *ct, Err *err) {
    const Q35ChatMessage *msgs = rq->messages;
    int n = rq->n_messages;
    if (n == 0) return err_set(err, Q35_ERR_ARG, "chat: no messages provided");
    int sys0 = is_role(&msgs[0], "system");
    if (ct->root) {
        sb_puts(s, "<|im_start|>system\n");
        chat_tools_block(s, ct, 1);
        View c = py_strip(view(sys0 ? msgs[0].content : NULL));
        if (sys0 && c.n) {
            sb_puts(s, "\n\n");
            put_view(s, c);
        }
        sb_puts(s, "<|im_end|>\n");
    } else if (sys0) {
        sb_puts(s, "<|im_start|>system\n");
        put_view(s, py_strip(view(msgs[0].content)));
        sb_puts(s, "<|im_end|>\n");
    }
    int last_query = -1;
    for (int i = n - 1; i >= 0 && last_query < 0; i--)
        if (is_role(&msgs[i], "user") && !is_tool_response(py_strip(view(msgs[i].content)))) last_query = i;
    if (last_query < 0) return err_set(err, Q35_ERR_ARG, "chat: no user query found in messages");
    for (int i = 0; i < n; i++) {
        const Q35ChatMessage *m = &msgs[i];
        View content = py_strip(view(m->content));
        if (is_role(m, "system")) {
            if (i > 0) return err_set(err, Q35_ERR_ARG, "chat: system message must be at the beginning");
        } else if (is_role(m, "user")) {
            sb_puts(s, "<|im_start|>user\n");
            put_view(s, content);
            sb_puts(s, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            View reasoning;
            split_reasoning(m, &content, &reasoning);
            reasoning = py_strip(reasoning);
            sb_puts(s, "<|im_start|>assistant\n");
            if (i > last_query) {
                sb_puts(s, "<think>\n");
                put_view(s, reasoning);
                sb_puts(s, "\n</think>\n\n");
            }
            put_view(s, content);
            int rc = chat_tool_calls(s, m, 1, py_strip(content).n > 0, err);
            if (rc) return rc;
            sb_puts(s, "<|im_end|>\n");
        } else { /* tool */
            if (i > 0 && !is_role(&msgs[i - 1], "tool")) sb_puts(s, "<|im_start|>user");
            sb_puts(s, "\n<tool_response>\n");
            put_view(s, content);
            sb_puts(s, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool")) sb_puts(s, "<|im_end|>\n");
        }
    }
    if (rq->add_generation_prompt)
        sb_puts(s,
                rq->thinking ? "<|im_start|>assistant\n<think>\n" : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return 0;
}

/* Qwen3 (tokenizer_config.json chat_template): contents as given; the system text goes before the tools. */
static int render_qwen3(StrBuf *s, const Q35ChatRequest *rq, const ChatTools *ct, Err *err) {
    const Q35ChatMessage *msgs = rq->messages;
    int n = rq->n_messages;
    int sys0 = n > 0 && is_role(&msgs[0], "system");
    if (ct->root) {
        sb_puts(s, "<|im_start|>system\n");
        if (sys0) {
            sb_puts(s, msgs[0].content);
            sb_puts(s, "\n\n");
        }
        chat_tools_block(s, ct, 0);
    } else if (sys0) {
        sb_puts(s, "<|im_start|>system\n");
        sb_puts(s, msgs[0].content);
        sb_puts(s, "<|im_end|>\n");
    }
    int last_query = n - 1; /* the last user message that is not a wrapped tool response */
    for (int i = n - 1; i >= 0; i--)
        if (is_role(&msgs[i], "user") && !is_tool_response(view(msgs[i].content))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const Q35ChatMessage *m = &msgs[i];
        if (is_role(m, "user") || (is_role(m, "system") && i > 0)) {
            sb_puts(s, "<|im_start|>");
            sb_puts(s, m->role);
            sb_puts(s, "\n");
            sb_puts(s, m->content);
            sb_puts(s, "<|im_end|>\n");
        } else if (is_role(m, "assistant")) {
            View content = view(m->content), reasoning;
            split_reasoning(m, &content, &reasoning);
            sb_puts(s, "<|im_start|>assistant\n");
            /* the think block after the last query: for the final turn, or when there is reasoning */
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                sb_puts(s, "<think>\n");
                put_view(s, rstrip_nl(lstrip_nl(reasoning)));
                sb_puts(s, "\n</think>\n\n");
                put_view(s, lstrip_nl(content));
            } else {
                put_view(s, content);
            }
            int rc = chat_tool_calls(s, m, 0, content.n > 0, err);
            if (rc) return rc;
            sb_puts(s, "<|im_end|>\n");
        } else if (is_role(m, "tool")) {
            if (i == 0 || !is_role(&msgs[i - 1], "tool")) sb_puts(s, "<|im_start|>user");
            sb_puts(s, "\n<tool_response>\n");
            sb_puts(s, m->content);
            sb_puts(s, "\n</tool_response>");
            if (i == n - 1 || !is_role(&msgs[i + 1], "tool")) sb_puts(s, "<|im_end|>\n");
        }
    }
    if (rq->add_generation_prompt) {
        sb_puts(s, "<|im_start|>assistant\n");
        if (!rq->thinking) sb_puts(s, "<think>\n\n</think>\n\n");
    }
    return 0;
}

int chat_render_request(const ChatFormat *f, const Q35ChatRequest *rq, char **out, Err *err) {
    *out = NULL;
    if (rq->n_messages < 0 || (rq->n_messages > 0 && !rq->messages))
        return err_set(err, Q35_ERR_ARG, "chat: bad message list");
    int rc = check_messages(rq->messages, rq->n_messages, err);
    if (rc) return rc;
    ChatTools ct;
    if ((rc = chat_tools_parse(&ct, rq->tools, err))) return rc;
    if (rq->tool_choice == Q35_TOOL_CHOICE_FUNCTION &&
        (!rq->tool_choice_name || !chat_tool_find(&ct, rq->tool_choice_name, strlen(rq->tool_choice_name)))) {
        chat_tools_free(&ct);
        return err_set(err, Q35_ERR_ARG, "chat: tool_choice names function '%s', which is not in tools",
                       rq->tool_choice_name ? rq->tool_choice_name : "(null)");
    }
    if (rq->tool_choice < 0 || rq->tool_choice > Q35_TOOL_CHOICE_FUNCTION) {
        chat_tools_free(&ct);
        return err_set(err, Q35_ERR_ARG, "chat: unknown tool_choice %d", rq->tool_choice);
    }
    Q35ChatRequest r = *rq;
    if (r.thinking == Q35_THINK_DEFAULT) r.thinking = f->default_thinking;
    StrBuf s = {0};
    sb_put(&s, "", 0);
    rc = f->family == Q35_TOK_QWEN35 ? render_qwen35(&s, &r, &ct, err) : render_qwen3(&s, &r, &ct, err);
    chat_tools_free(&ct);
    if (!rc && s.oom) rc = err_set(err, Q35_ERR_OOM, "out of memory");
    if (rc) {
        sb_free(&s);
        return rc;
    }
    *out = s.p;
    return 0;
}

int chat_render(const ChatFormat *f, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                char **out, Err *err) {
    Q35ChatRequest rq = {
        .messages = msgs, .n_messages = n, .add_generation_prompt = add_generation_prompt, .thinking = thinking};
    return chat_render_request(f, &rq, out, err);
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

int q35_chat_render_request(const Q35Tokenizer *t, const Q35ChatRequest *rq, char **out, Q35Err *err) {
    ChatFormat f;
    *out = NULL;
    int rc = chat_format_for(t, rq->family, &f, err);
    return rc ? rc : chat_render_request(&f, rq, out, err);
}

void q35_chat_marks(const Q35Tokenizer *t, Q35ChatMarks *m) {
    memset(m, 0, sizeof *m);
    m->im_start = m->im_end = m->nl = -1;
    if (!t) return;
    int *ids = NULL, n = 0;
    Q35Err err = {0};
    m->im_start = q35_token_id(t, "<|im_start|>");
    m->im_end = q35_token_id(t, "<|im_end|>");
    if (!q35_tokenize(t, "\n", 1, &ids, &n, &err) && n == 1) m->nl = ids[0];
    free(ids);
    ids = NULL;
    if (!q35_tokenize(t, "assistant\n", 10, &ids, &n, &err) && n >= 1 && n <= 4) {
        memcpy(m->asst, ids, sizeof(int) * (size_t)n);
        m->n_asst = n;
    }
    free(ids);
}

int q35_chat_prefix_points(const Q35ChatMarks *m, const int *t, int n, int from, int matched, int *out, int max_pts) {
    int pts[34], np = 0, asst_end = -1;
    if (max_pts > 32) max_pts = 32;
    if (max_pts < 1) return 0;
    for (int p = from + 1; p < n - 1; p++) {
        int take = p == matched;
        if (m->im_end >= 0 && p >= 2 && t[p - 2] == m->im_end && t[p - 1] == m->nl) take = 1;
        if (m->im_start >= 0 && m->n_asst > 0 && p >= m->n_asst + 1 && t[p - m->n_asst - 1] == m->im_start &&
            !memcmp(t + p - m->n_asst, m->asst, sizeof(int) * (size_t)m->n_asst))
            asst_end = p;
        if (take) {
            if (np == max_pts) memmove(pts, pts + 1, sizeof(int) * (size_t)--np); /* keep the last ones */
            pts[np++] = p;
        }
    }
    if (asst_end > from) { /* in order, unless it is there already */
        int i = np;
        while (i > 0 && pts[i - 1] > asst_end) i--;
        if (!(i > 0 && pts[i - 1] == asst_end)) {
            memmove(pts + i + 1, pts + i, sizeof(int) * (size_t)(np - i));
            pts[i] = asst_end;
            np++;
        }
    }
    if (n - 1 > from && (np == 0 || pts[np - 1] < n - 1)) pts[np++] = n - 1;
    const int skip = np > max_pts ? np - max_pts : 0;
    memcpy(out, pts + skip, sizeof(int) * (size_t)(np - skip));
    return np - skip;
}
