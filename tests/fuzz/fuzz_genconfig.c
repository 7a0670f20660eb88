/* fuzz_genconfig.c — libFuzzer target: generation_config.json (genconfig_load against the built-in
 * qwen3.5-0.8b Config): stop ids within the vocabulary, sampling values as read. make fuzz builds it;
 * seeds: tests/fuzz/genconfig/. */
#include "config.h"
#include "fuzz.h"

static Config cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    Err err;
    REQUIRE(config_builtin(&cfg, "qwen3.5-0.8b", &err) == 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    fuzz_write("generation_config.json", data, n);
    GenConfig g;
    Err err = {0};
    if (genconfig_load(&g, fuzz_scratch(), &cfg, &err) == 0) {
        REQUIRE(g.n_eos >= 0 && g.n_eos <= (int)(sizeof g.eos_ids / sizeof g.eos_ids[0]));
        for (int i = 0; i < g.n_eos; i++) REQUIRE(g.eos_ids[i] >= 0 && g.eos_ids[i] < cfg.vocab_size);
    } else {
        REQUIRE(err.code < 0 && err.msg[0] && !strchr(err.msg, '\n'));
    }
    return 0;
}
