/* fuzz_tokenizer_json.c — libFuzzer target: tokenizer.json loading (tokenizer_load_json: the BPE model's
 * vocab and merges, added tokens, the pre-tokenizer regex, normalizer). A tokenizer that loads must then
 * encode and decode a fixed text without error other than a clean one. make fuzz builds it; seeds:
 * tests/fuzz/tokenizer_json/. */
#include "fuzz.h"
#include "tokenizer.h"

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    Tokenizer *t = NULL;
    Err err = {0};
    if (tokenizer_load_json(&t, (const char *)data, n, "tokenizer.json", &err) == 0) {
        static const char text[] = "Hello, world! 123 \xe4\xbd\xa0\xe5\xa5\xbd <|im_end|>\n";
        int *ids = NULL, k = 0;
        if (q35_tokenize(t, text, sizeof text - 1, &ids, &k, &err) == 0) {
            char *out = NULL;
            if (q35_detokenize(t, ids, k, 0, &out, &err) == 0) free(out);
            free(ids);
        }
        q35_tokenizer_free(t);
    } else {
        REQUIRE(err.code < 0 && err.msg[0]);
    }
    return 0;
}
