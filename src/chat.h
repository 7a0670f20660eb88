/* chat.h — ChatML prompt rendering in C (no Jinja): messages -> prompt text, for the two Qwen families.
 * Qwen3: the chat_template of Qwen3's tokenizer_config.json (without the tools block), thinking on by
 * default, enable_thinking=false appends "<think>\n\n</think>\n\n". Qwen3.5 (TOKENIZER.md §7): assistant
 * turns after the last user query always carry "<think>\n{reasoning}\n</think>\n\n", and the generation
 * prompt is "<think>\n" (thinking) or the empty block "<think>\n\n</think>\n\n" (small models' default). */
#ifndef Q35_CHAT_H
#define Q35_CHAT_H

#include "util.h"

typedef struct ChatFormat {
    int family;           /* Q35_TOK_QWEN3 | Q35_TOK_QWEN35 (Q35_TOK_OTHER renders as Qwen3) */
    int default_thinking; /* what Q35_THINK_DEFAULT means */
} ChatFormat;

/* The format for a tokenizer: its family, and the default read from its chat template when it says
 * ("enable_thinking is true" gates thinking -> off by default; "is false" gates the empty block -> on). */
void chat_format_of(const Q35Tokenizer *t, ChatFormat *f);
int chat_render(const ChatFormat *f, const Q35ChatMessage *msgs, int n, int add_generation_prompt, int thinking,
                char **out, Err *err);

#endif
