/* test_chat.c — the C chat template against HF apply_chat_template (Qwen3's template, golden renders in
 * tests/fixtures/tokenizer/chat_qwen3.jsonl for the conversations of chat_cases.jsonl: text and ids),
 * and the Qwen3.5 format of TOKENIZER.md §7 / shared/data/qwen35_tokenizer_vectors.json (non-thinking
 * default, --think, history turns). With a Qwen3.5 tokenizer.json (directory argv[1], or found by tokdata.h)
 * the §7 golden ids are checked too. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "test.h"
#include "tokdata.h"
#include "tokenizer.h"

#define MSG(r, c, th)                                                                                                  \
    { .role = (r), .content = (c), .reasoning = (th) }

static char *slurp(const char *path) {
    char *d = NULL;
    size_t n;
    Err err;
    return read_file(path, &d, &n, &err) ? NULL : d;
}

static int next_line(char **p, char **line) {
    if (!*p || !**p) return 0;
    *line = *p;
    char *e = strchr(*p, '\n');
    if (e) {
        *e = 0;
        *p = e + 1;
    } else
        *p += strlen(*p);
    return 1;
}

static void check_qwen3_golden(const Tokenizer *t) {
    char *cases = slurp("tests/fixtures/tokenizer/chat_cases.jsonl");
    char *gold = slurp("tests/fixtures/tokenizer/chat_qwen3.jsonl");
    CHECK(cases && gold, "chat fixtures missing");
    if (!cases || !gold) {
        free(cases);
        free(gold);
        return;
    }
    char *pc = cases, *pg = gold, *lc, *lg;
    next_line(&pg, &lg); /* header */
    int n = 0, bad_text = 0, bad_ids = 0;
    while (next_line(&pc, &lc) && next_line(&pg, &lg)) {
        cJSON *c = cJSON_Parse(lc), *g = cJSON_Parse(lg);
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *m;
        Q35ChatMessage mm[16];
        int k = 0;
        cJSON_ArrayForEach(m, msgs) {
            const cJSON *r = cJSON_GetObjectItem(m, "reasoning_content");
            mm[k++] = (Q35ChatMessage){.role = cJSON_GetObjectItem(m, "role")->valuestring,
                                       .content = cJSON_GetObjectItem(m, "content")->valuestring,
                                       .reasoning = cJSON_IsString(r) ? r->valuestring : NULL};
        }
        const cJSON *think = cJSON_GetObjectItem(c, "enable_thinking");
        int th = cJSON_IsTrue(think) ? Q35_THINK_ON : cJSON_IsFalse(think) ? Q35_THINK_OFF : Q35_THINK_DEFAULT;
        int gen = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        char *txt;
        Err err;
        int rc = q35_chat_render(t, mm, k, gen, th, &txt, &err);
        const char *want = cJSON_GetObjectItem(g, "text")->valuestring;
        if (rc || strcmp(txt, want)) {
            if (bad_text < 3) fprintf(stderr, "chat case %d:\n got: [%s]\nwant: [%s]\n", n, rc ? err.msg : txt, want);
            bad_text++;
        }
        if (!rc) {
            int *ids, ni;
            const cJSON *wid = cJSON_GetObjectItem(g, "ids");
            int ok = q35_tokenize(t, txt, strlen(txt), &ids, &ni, &err) == 0 && ni == cJSON_GetArraySize(wid);
            for (int q = 0; ok && q < ni; q++) ok = ids[q] == cJSON_GetArrayItem(wid, q)->valueint;
            bad_ids += !ok;
            free(ids);
            free(txt);
        }
        cJSON_Delete(c);
        cJSON_Delete(g);
        n++;
    }
    CHECK(n >= 20, "only %d chat cases", n);
    CHECK(bad_text == 0, "%d of %d Qwen3 chat renders differ from HF", bad_text, n);
    CHECK(bad_ids == 0, "%d of %d Qwen3 chat renders tokenize differently from HF", bad_ids, n);
    printf("Qwen3 chat template: %d conversations, %d text mismatches, %d id mismatches\n", n, bad_text, bad_ids);
    free(cases);
    free(gold);
}

static void expect(const ChatFormat *f, const Q35ChatMessage *m, int n, int gen, int think, const char *want,
                   const char *what) {
    char *got;
    Err err;
    int rc = chat_render(f, m, n, gen, think, &got, &err);
    CHECK(rc == 0 && !strcmp(got, want), "%s:\n got [%s]\nwant [%s]", what, rc ? err.msg : got, want);
    if (!rc) free(got);
}

static void check_qwen35_format(void) {
    ChatFormat f = {Q35_TOK_QWEN35, Q35_THINK_OFF};
    Q35ChatMessage sys_user[] = {MSG("system", "You are concise.", NULL), MSG("user", "Say hello to Firewing.", NULL)};
    const char *base =
        "<|im_start|>system\nYou are concise.<|im_end|>\n<|im_start|>user\nSay hello to Firewing.<|im_end|>\n"
        "<|im_start|>assistant\n";
    char want[1024];
    snprintf(want, sizeof want, "%s<think>\n\n</think>\n\n", base);
    expect(&f, sys_user, 2, 1, Q35_THINK_DEFAULT, want, "Qwen3.5 default = non-thinking");
    expect(&f, sys_user, 2, 1, Q35_THINK_OFF, want, "Qwen3.5 thinking off");
    snprintf(want, sizeof want, "%s<think>\n", base);
    expect(&f, sys_user, 2, 1, Q35_THINK_ON, want, "Qwen3.5 --think");
    Q35ChatMessage done[] = {MSG("user", "Return one word.", NULL), MSG("assistant", "Done", NULL)};
    expect(
        &f, done, 2, 0, Q35_THINK_DEFAULT,
        "<|im_start|>user\nReturn one word.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nDone<|im_end|>\n",
        "Qwen3.5 completed turn");
    Q35ChatMessage multi[] = {MSG("user", "Hi", NULL), MSG("assistant", "Hello", "greet back"),
                              MSG("user", "Bye", NULL), MSG("assistant", "<think>\nshort\n</think>\n\nSee you", NULL),
                              MSG("tool", "{\"ok\":1}", NULL)};
    expect(&f, multi, 2, 0, 0,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\ngreet back\n</think>\n\nHello<|im_end|>\n",
           "Qwen3.5 reasoning after the last query");
    expect(&f, multi, 5, 1, Q35_THINK_OFF,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
           "<|im_start|>assistant\n<think>\nshort\n</think>\n\nSee you<|im_end|>\n<|im_start|>user\n<tool_response>\n"
           "{\"ok\":1}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
           "Qwen3.5 history: earlier assistant turns keep only content");
    /* Qwen3: a middle assistant turn after the last query without reasoning has no think block */
    ChatFormat f3 = {Q35_TOK_QWEN3, Q35_THINK_ON};
    Q35ChatMessage tools[] = {MSG("user", "Hi", NULL), MSG("assistant", "a", NULL), MSG("tool", "r", NULL),
                              MSG("assistant", "b", NULL)};
    expect(&f3, tools, 4, 0, 0,
           "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n<|im_start|>user\n<tool_response>\nr\n"
           "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n",
           "Qwen3 tool turn");
    Q35ChatMessage bad[] = {MSG("wizard", "x", NULL)};
    char *out;
    Err err;
    CHECK(chat_render(&f, bad, 1, 1, 0, &out, &err) == Q35_ERR_ARG, "unknown role rejected");
    Q35ChatMessage null_content[] = {MSG("user", NULL, NULL)};
    CHECK(chat_render(&f, null_content, 1, 1, 0, &out, &err) == Q35_ERR_ARG, "NULL content rejected");

    /* default thinking from the template text */
    Tokenizer fake;
    memset(&fake, 0, sizeof fake);
    fake.family = Q35_TOK_QWEN35;
    CHECK(q35_chat_default_thinking(&fake) == Q35_THINK_OFF, "Qwen3.5 without template: off");
    fake.chat_template =
        "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}";
    CHECK(q35_chat_default_thinking(&fake) == Q35_THINK_ON, "template gating the empty block: on");
    fake.chat_template =
        "{%- if enable_thinking is defined and enable_thinking is true %}<think>\n{%- else %}x{%- endif %}";
    fake.family = Q35_TOK_QWEN3;
    CHECK(q35_chat_default_thinking(&fake) == Q35_THINK_OFF, "template gating thinking: off");
}

static void check_qwen35_ids(const char *arg) {
    char dir[512];
    Tokenizer *t;
    Err err;
    if (!find_qwen35_tokenizer(arg, &t, dir, sizeof dir)) {
        printf("SKIP Qwen3.5 chat ids: no Qwen3.5 tokenizer.json under .cache/ or models/\n");
        return;
    }
    Q35ChatMessage m[] = {MSG("system", "You are concise.", NULL), MSG("user", "Say hello to Firewing.", NULL)};
    char *txt;
    int *ids, n;
    static const int want[] = {248045, 8678, 198,    2523,  513,   61446,  13,   248046, 198,
                               248045, 846,  198,    44240, 23066, 310,    6438, 22856,  13,
                               248046, 198,  248045, 74455, 198,   248068, 271,  248069, 271};
    int ok = q35_chat_render(t, m, 2, 1, Q35_THINK_DEFAULT, &txt, &err) == 0 &&
             q35_tokenize(t, txt, strlen(txt), &ids, &n, &err) == 0;
    CHECK(ok && n == 27 && !memcmp(ids, want, sizeof want), "Qwen3.5 chat golden ids (TOKENIZER.md §7)");
    if (ok) {
        free(ids);
        free(txt);
    }
    q35_tokenizer_free(t);
}

int main(int argc, char **argv) {
    check_qwen35_format();
    Tokenizer *t;
    Err err;
    int rc = q35_tokenizer_load(&t, ".cache/qwen3-tokenizer", &err);
    CHECK(rc == 0, "Qwen3 tokenizer (run scripts/fetch_tokenizer.sh): %s", err.msg);
    if (!rc) {
        CHECK(q35_chat_default_thinking(t) == Q35_THINK_ON, "Qwen3 default: thinking on");
        check_qwen3_golden(t);
        q35_tokenizer_free(t);
    }
    check_qwen35_ids(argc > 1 ? argv[1] : NULL);
    return TEST_SUMMARY("chat");
}
