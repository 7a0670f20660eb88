/* fuzz_config.c — libFuzzer target: config.json text -> Config (config_parse, which runs config_finish's
 * consistency checks). Accepted configs must hold the invariants the engine relies on. make fuzz builds it;
 * seeds: tests/fuzz/config/. */
#include "config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    char *text = fuzz_cstr(data, n);
    Config c;
    Err err = {0};
    if (config_parse(&c, text, "config.json", &err) == 0) {
        REQUIRE(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_hidden_layers <= Q35_MAX_LAYERS);
        REQUIRE(c.vocab_size > 0 && c.intermediate_size > 0);
        REQUIRE(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0);
        REQUIRE(c.num_attention_heads % c.num_key_value_heads == 0);
        REQUIRE(c.n_linear_layers + c.n_full_layers == c.num_hidden_layers);
        REQUIRE(c.rotary_dim >= 0 && c.rotary_dim <= c.head_dim && c.rotary_dim % 2 == 0);
    } else {
        REQUIRE(err.code < 0 && err.msg[0] && !strchr(err.msg, '\n'));
    }
    free(text);
    return 0;
}
