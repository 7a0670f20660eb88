/* test_safetensors.c — safetensors_open on small files written here: a valid file (dtypes, lookup,
 * data, metadata), then every malformed input, each of which must give the right code and a
 * message naming the file and the tensor; finally every truncation of a valid file must fail
 * cleanly. Random tensor contents; the seed is printed and can be given as argv[1]. */
#include <stdint.h>
#include <time.h>

#include "safetensors.h"
#include "st_write.h"
#include "test.h"

static char dir[64];
static char path[256];
static int verbose; /* argv[2] == "-v": print every expected error message */

/* Opens path, expects failure with code and a message containing both needles (file, tensor). */
static void expect_fail(const char *what, int code, const char *needle1, const char *needle2) {
    SafeTensors st;
    Err err = {0, ""};
    int rc = safetensors_open(&st, path, &err);
    if (verbose) printf("  %-40s -> %s\n", what, err.msg);
    CHECK(rc == code && err.code == code, "%s: rc %d (want %d): %s", what, rc, code, err.msg);
    CHECK(strstr(err.msg, needle1) != NULL, "%s: message lacks '%s': %s", what, needle1, err.msg);
    if (needle2) CHECK(strstr(err.msg, needle2) != NULL, "%s: message lacks '%s': %s", what, needle2, err.msg);
    CHECK(strchr(err.msg, '\n') == NULL, "%s: message is not one line", what);
    CHECK(st.map == NULL && st.tensors == NULL && st.path == NULL, "%s: st not cleaned up", what);
}

/* Writes a header given as text, with data_len bytes of data. */
static void write_header(const char *hdr, size_t data_len) {
    uint8_t *data = calloc(data_len ? data_len : 1, 1);
    st_write_raw(path, strlen(hdr), hdr, strlen(hdr), data, data_len);
    free(data);
}

static void test_safetensors_valid(Rng *rng) {
    uint16_t a[6], c[5];
    float b[4];
    int64_t d[3];
    uint8_t e[3];
    for (int i = 0; i < 6; i++) a[i] = f32_to_bf16(rng_normal(rng));
    for (int i = 0; i < 4; i++) b[i] = rng_normal(rng);
    for (int i = 0; i < 5; i++) c[i] = f32_to_f16(rng_normal(rng));
    for (int i = 0; i < 3; i++) d[i] = (int64_t)rng_u64(rng);
    for (int i = 0; i < 3; i++) e[i] = (uint8_t)rng_u64(rng);
    int32_t g[2] = {(int32_t)rng_u64(rng), -7};
    StSpec t[] = {
        {"w.a", "BF16", 2, {2, 3}, a, 0}, {"w.b", "F32", 1, {4}, b, 0},  {"h", "F16", 1, {5}, c, 0},
        {"i64", "I64", 1, {3}, d, 0},     {"u8", "U8", 1, {3}, e, 0},    {"i32", "I32", 2, {1, 2}, g, 0},
        {"empty", "F32", 2, {0, 7}, NULL, 0}, {"scalar", "F32", 0, {0}, b, 0},
    };
    pj(path, sizeof path, dir, "ok.safetensors");
    CHECK(st_write(path, t, 8, "{\"format\":\"pt\"}") == 0, "write");
    SafeTensors st;
    Err err = {0, ""};
    int rc = safetensors_open(&st, path, &err);
    CHECK(rc == 0, "open: %s", err.msg);
    if (rc) return;
    CHECK(st.n_tensors == 8, "n_tensors %d", st.n_tensors);
    CHECK(st.metadata_json && strstr(st.metadata_json, "\"format\"") && strstr(st.metadata_json, "\"pt\""),
          "metadata %s", st.metadata_json ? st.metadata_json : "(null)");
    CHECK(safetensors_find(&st, "__metadata__") == NULL, "metadata is not a tensor");
    const Tensor *ta = safetensors_find(&st, "w.a"), *tb = safetensors_find(&st, "w.b"),
                 *tc = safetensors_find(&st, "h"), *td = safetensors_find(&st, "i64"),
                 *te = safetensors_find(&st, "u8"), *tg = safetensors_find(&st, "i32"),
                 *tz = safetensors_find(&st, "empty"), *ts = safetensors_find(&st, "scalar");
    CHECK(ta && tb && tc && td && te && tg && tz && ts, "find");
    CHECK(safetensors_find(&st, "w") == NULL && safetensors_find(&st, "W.A") == NULL, "no false hits");
    if (ta && tb && tc && td && te && tg && tz && ts) {
        CHECK(ta->dtype == DT_BF16 && ta->ndim == 2 && ta->shape[0] == 2 && ta->shape[1] == 3 && ta->numel == 6 &&
                  ta->nbytes == 12, "w.a meta");
        CHECK(memcmp(ta->data, a, sizeof a) == 0, "w.a data");
        CHECK(tb->dtype == DT_F32 && tb->numel == 4 && memcmp(tb->data, b, sizeof b) == 0, "w.b");
        CHECK(tc->dtype == DT_F16 && memcmp(tc->data, c, sizeof c) == 0, "h");
        CHECK(td->dtype == DT_I64 && memcmp(td->data, d, sizeof d) == 0, "i64");
        CHECK(te->dtype == DT_U8 && memcmp(te->data, e, sizeof e) == 0, "u8");
        CHECK(tg->dtype == DT_I32 && tg->shape[1] == 2 && memcmp(tg->data, g, sizeof g) == 0, "i32");
        CHECK(tz->numel == 0 && tz->nbytes == 0, "empty");
        CHECK(ts->ndim == 0 && ts->numel == 1 && ts->nbytes == 4, "scalar");
        CHECK(strcmp(ta->name, "w.a") == 0, "name");
    }
    CHECK(dtype_size(DT_BF16) == 2 && dtype_size(DT_F32) == 4 && dtype_size(DT_I64) == 8 &&
              dtype_size(DT_U8) == 1 && strcmp(dtype_name(DT_F16), "F16") == 0 && dtype_size(DT_F8_E4M3) == 1 &&
              strcmp(dtype_name(DT_F8_E4M3), "F8_E4M3") == 0,
          "dtype table");
    safetensors_close(&st);
    CHECK(st.map == NULL && st.n_tensors == 0, "close clears");
    safetensors_close(&st); /* closing twice is harmless */

    /* Empty header, no tensors. */
    pj(path, sizeof path, dir, "empty.safetensors");
    write_header("{}", 0);
    rc = safetensors_open(&st, path, &err);
    CHECK(rc == 0 && st.n_tensors == 0 && st.metadata_json == NULL, "empty header: %s", err.msg);
    if (!rc) safetensors_close(&st);
}

static void test_safetensors_bad(void) {
    const char *F = "bad.safetensors";
    pj(path, sizeof path, dir, F);

    write_text(path, "abcde");
    expect_fail("shorter than 8 bytes", Q35_ERR_FORMAT, F, "8-byte");
    write_text(path, "");
    expect_fail("empty file", Q35_ERR_FORMAT, F, NULL);

    const char *hdr = "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    st_write_raw(path, strlen(hdr) + 100, hdr, strlen(hdr), "12345678", 8);
    expect_fail("header length past EOF", Q35_ERR_FORMAT, F, "past the end");
    st_write_raw(path, UINT64_MAX, hdr, strlen(hdr), "12345678", 8);
    expect_fail("absurd header length", Q35_ERR_FORMAT, F, "header length");
    st_write_raw(path, 0, hdr, strlen(hdr), "12345678", 8);
    expect_fail("zero header length", Q35_ERR_FORMAT, F, "header length");

    write_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8);
    expect_fail("malformed header JSON", Q35_ERR_FORMAT, F, "malformed JSON");
    write_header("{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}} xx", 8);
    expect_fail("trailing garbage after header", Q35_ERR_FORMAT, F, "malformed JSON");
    write_header("[1,2]", 8);
    expect_fail("header not an object", Q35_ERR_FORMAT, F, "not a JSON object");
    st_write_raw(path, 12, "{\"a\":\0   }  ", 12, "", 0);
    expect_fail("NUL in header", Q35_ERR_FORMAT, F, NULL);

    write_header("{\"w.q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 8);
    expect_fail("offsets outside data", Q35_ERR_FORMAT, F, "'w.q'");
    write_header("{\"w.q\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8);
    expect_fail("end < begin", Q35_ERR_FORMAT, F, "'w.q'");
    write_header("{\"w.q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"w.k\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 16);
    expect_fail("overlapping tensors", Q35_ERR_FORMAT, "'w.k'", "'w.q'");
    write_header("{\"big\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
                 "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,4]},"
                 "\"in\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[6,8]}}", 16);
    expect_fail("overlap hidden behind an empty tensor", Q35_ERR_FORMAT, "'in'", "'big'");
    write_header("{\"w.q\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_fail("nbytes != numel*size", Q35_ERR_FORMAT, F, "'w.q'");
    write_header("{\"w.q\":{\"dtype\":\"F8_E5M2\",\"shape\":[8],\"data_offsets\":[0,8]}}", 8);
    expect_fail("unknown dtype", Q35_ERR_FORMAT, "'w.q'", "F8_E5M2");
    write_header("{\"w.q\":{\"dtype\":\"F8_E4M3\",\"shape\":[9],\"data_offsets\":[0,8]}}", 8);
    expect_fail("F8_E4M3 is one byte per element", Q35_ERR_FORMAT, "'w.q'", "F8_E4M3");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 8);
    expect_fail("too many dims", Q35_ERR_FORMAT, "'w.q'", "dims");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 8);
    expect_fail("negative dim", Q35_ERR_FORMAT, "'w.q'", "shape[0]");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 8);
    expect_fail("fractional dim", Q35_ERR_FORMAT, "'w.q'", "shape[0]");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],"
                 "\"data_offsets\":[0,1]}}", 8);
    expect_fail("shape overflow", Q35_ERR_FORMAT, "'w.q'", "too large");
    write_header("{\"w.q\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 8);
    expect_fail("dtype missing", Q35_ERR_FORMAT, "'w.q'", "dtype");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 8);
    expect_fail("shape missing", Q35_ERR_FORMAT, "'w.q'", "shape");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 8);
    expect_fail("one offset", Q35_ERR_FORMAT, "'w.q'", "data_offsets");
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[\"0\",\"1\"]}}", 8);
    expect_fail("string offsets", Q35_ERR_FORMAT, "'w.q'", "data_offsets");
    write_header("{\"w.q\":[1,2]}", 8);
    expect_fail("entry not an object", Q35_ERR_FORMAT, "'w.q'", F);
    write_header("{\"w.q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                 "\"w.q\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 8);
    expect_fail("duplicate name", Q35_ERR_FORMAT, "'w.q'", "twice");

    pj(path, sizeof path, dir, "does_not_exist.safetensors");
    expect_fail("missing file", Q35_ERR_IO, "does_not_exist.safetensors", NULL);
    pj(path, sizeof path, dir, ".");
    expect_fail("a directory", Q35_ERR_IO, dir, NULL);
}

/* Every strict prefix of a valid file must fail cleanly (no crash, no leak under ASan). */
static void test_safetensors_truncations(Rng *rng) {
    uint16_t a[12];
    for (int i = 0; i < 12; i++) a[i] = f32_to_bf16(rng_normal(rng));
    StSpec t[] = {{"x", "BF16", 2, {3, 4}, a, 0}};
    char full[256];
    pj(full, sizeof full, dir, "full.safetensors");
    st_write(full, t, 1, NULL);
    char *buf;
    size_t len;
    Err err;
    CHECK(read_file(full, &buf, &len, &err) == 0, "read back");
    pj(path, sizeof path, dir, "trunc.safetensors");
    int bad = 0;
    for (size_t n = 0; n < len; n++) {
        FILE *f = fopen(path, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
        SafeTensors st;
        if (safetensors_open(&st, path, &err) == 0) {
            bad++;
            safetensors_close(&st);
        } else if (!strstr(err.msg, "trunc.safetensors")) {
            bad++;
        }
    }
    CHECK(bad == 0, "%d of %zu truncations were accepted or unnamed", bad, len);
    /* Random single-byte corruptions of the header: must never crash; record how many fail. */
    int failed = 0;
    for (int k = 0; k < 200; k++) {
        char *c = malloc(len);
        memcpy(c, buf, len);
        size_t hlen = (size_t)(uint8_t)buf[0];
        c[8 + rng_u64(rng) % hlen] = (char)rng_u64(rng);
        FILE *f = fopen(path, "wb");
        fwrite(c, 1, len, f);
        fclose(f);
        free(c);
        SafeTensors st;
        if (safetensors_open(&st, path, &err) == 0) safetensors_close(&st);
        else failed++;
    }
    CHECK(failed > 0, "no corruption was ever detected");
    free(buf);
}

int main(int argc, char **argv) {
    uint64_t seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)time(NULL);
    verbose = argc > 2 && strcmp(argv[2], "-v") == 0;
    printf("test_safetensors: seed %llu\n", (unsigned long long)seed);
    Rng rng;
    rng_seed(&rng, seed);
    snprintf(dir, sizeof dir, "/tmp/q35_st_XXXXXX");
    if (!make_tmpdir(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_safetensors_valid(&rng);
    test_safetensors_bad();
    test_safetensors_truncations(&rng);
    rm_rf(dir);
    return TEST_SUMMARY("safetensors");
}
