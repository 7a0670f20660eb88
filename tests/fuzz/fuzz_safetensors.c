/* fuzz_safetensors.c — libFuzzer target for the checkpoint files that come from the internet. The first
 * input byte picks the mode:
 *   even: the rest is a .safetensors file: safetensors_open (header length, JSON header, dtypes, shapes,
 *         offsets against the file size) and, when it opens, every tensor found again by name and lying
 *         inside the file;
 *   odd:  the rest is model.safetensors.index.json beside the tiny test model's config.json and its weights
 *         as the shard "shard.safetensors": model_load (weight_map, shard names, tensors bound by name and
 *         shape).
 * make fuzz builds it; seeds: tests/fuzz/safetensors/. */
#include "fuzz.h"
#include "model.h"
#include "safetensors.h"

static char *copy_fixture(const char *from, const char *to) {
    char *d;
    size_t n;
    Err err;
    REQUIRE(read_file(from, &d, &n, &err) == 0);
    fuzz_write(to, d, n);
    free(d);
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    /* run from the repo root (the fixture) */
    copy_fixture("tests/fixtures/qwen35_text/config.json", "config.json");
    copy_fixture("tests/fixtures/qwen35_text/model.safetensors", "shard.safetensors");
    return 0;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t n) {
    if (n < 1) return 0;
    Err err = {0};
    if (!(data[0] & 1)) {
        const char *path = fuzz_write("x.safetensors", data + 1, n - 1);
        SafeTensors st = {0};
        if (safetensors_open(&st, path, &err) == 0) {
            for (int i = 0; i < st.n_tensors; i++) {
                const Tensor *t = &st.tensors[i];
                REQUIRE(safetensors_find(&st, t->name) != NULL);
                REQUIRE((const char *)t->data >= (const char *)st.map &&
                        (const char *)t->data + t->nbytes <= (const char *)st.map + st.map_len);
                REQUIRE((int64_t)t->nbytes == t->numel * dtype_size(t->dtype));
            }
        } else {
            REQUIRE(err.code < 0 && err.msg[0]);
        }
        safetensors_close(&st);
    } else {
        fuzz_write("model.safetensors.index.json", data + 1, n - 1);
        Model m;
        ModelLoadOptions lo = {0, 0};
        if (model_load(&m, fuzz_scratch(), &lo, &err) == 0)
            model_free(&m);
        else
            REQUIRE(err.code < 0 && err.msg[0]);
    }
    return 0;
}
