/* test_prefix_cuda.c — issue 29's exactness on the CUDA backend: tests/prefix_check.h's check (a request resumed from
 * the prefix cache at exactly L ids gives the sampled ids, logprobs and top ids / logprobs of the same request served
 * cold, bit for bit) through the public API on two deterministic-mode CUDA engines (one without a cache), for
 * L = 1, 63, 64, 65, 527, 529, 4096:
 *   - Qwen3.5 hybrid at the 0.8B shapes (DeltaNet snapshots + KV blocks): greedy with 5 top logprobs (the host picks
 *     from the logits rows) with blocks of 16 and 64 tokens; with blocks of 16 also greedy with only the chosen id's
 *     logprob (the id and its logprob picked on the device) and sampled with a seed (temperature 0.8, top-k 40,
 *     top-p 0.95), both with 5 top logprobs (drawn on the host from the logits row) and with only the chosen id's
 *     logprob (drawn on the device where the backend samples there);
 *     with blocks of 16 again greedy with 5 top logprobs and sampled with only the chosen id's logprob, the snapshot at
 *     L taken inside a step (Q35StepItem.snap_at: in deterministic mode a copy of the slot's layer after that token);
 *   - Qwen3 dense at the 0.6B shapes (KV blocks only): greedy with 5 top logprobs, blocks of 16, the snapshot inside
 *     a step;
 *   - the host tier (pinned host memory) on the hybrid, greedy with 5 top logprobs, blocks of 16: a snapshot moved
 *     out of the full device tier (device -> host copy) gives hits at exactly L (host -> slot copy) bitwise equal to
 *     cold, with a host tier of 4 snapshots (evicting its own) and none (misses); a host snapshot hit while a device
 *     id is free moves back (slot -> device copy), and hits from the host, the host then moved, and the device all
 *     equal cold (prefix_check_host / prefix_check_promote).
 * The models are the built-in random dummies (--dummy qwen3.5-0.8b / qwen3-0.6b, the benchmark shapes), since
 * the public API opens only a model directory or a dummy, and the golden fixtures test_prefix.c uses do not fit: the
 * hybrid one's 16-wide DeltaNet heads are outside the batched step's kernels (128 x 128), so q35_serve_open refuses
 * it on CUDA, and their max_position_embeddings (4096) is short of L = 4096 plus the rest of a request.
 * Usage: test_prefix_cuda [seed] (of the dummy weights). Skips (exit 0, "no GPU") without a GPU. */
#include "test.h"
#include "gpu_common.h"
#include "prefix_check.h"

#define CTX (4096 + PREFIX_TAIL + PREFIX_GEN)

static const int LENS[] = {1, 63, 64, 65, 527, 529, 4096};
#define N_LENS    ((int)(sizeof LENS / sizeof LENS[0]))
#define KV_BYTES  ((size_t)2 << 30) /* per engine; one full context (CTX ids) of the 0.6B dense model: 453 MiB */
#define PFX_BYTES ((size_t)1 << 30)

static Q35Engine *open_dummy(const char *name, uint64_t seed) {
    Q35Options o;
    q35_options_init(&o);
    o.dummy = name;
    o.dummy_seed = seed;
    o.backend = "cuda";
    o.max_seq = CTX;
    o.deterministic = 1;
    Q35Engine *e = NULL;
    Q35Err err = {0};
    if (q35_engine_open(&e, &o, &err)) fprintf(stderr, "open %s: %s\n", name, err.msg);
    return e;
}

/* The check for each parameter set ps[i] with blocks of blocks[i] tokens, on one pair of engines of the dummy `name`. */
static void test_model(const char *name, uint64_t seed, const Q35SeqParams *const *ps, const int *blocks,
                       const int *in_step, int n) {
    Q35Engine *cold = open_dummy(name, seed), *warm = open_dummy(name, seed);
    CHECK(cold && warm, "%s: two CUDA engines", name);
    for (int i = 0; cold && warm && i < n; i++) {
        const Q35SeqParams *p = ps[i] ? ps[i] : &prefix_greedy;
        const PrefixExact x = {name, blocks[i], KV_BYTES, PFX_BYTES, LENS, N_LENS, p, in_step[i]};
        const double t0 = now_s();
        prefix_check_exact(cold, warm, &x);
        printf("  %s, blocks of %d, %s, %d top logprobs%s: %.1f s\n", name, blocks[i],
               p->sampling.temperature > 0 ? "sampled" : "greedy", p->top_logprobs,
               in_step[i] ? ", snapshot inside a step" : "", now_s() - t0);
    }
    q35_engine_close(cold);
    q35_engine_close(warm);
}

/* The host tier on the hybrid (see the top). */
static void test_host(uint64_t seed) {
    Q35Engine *cold = open_dummy("qwen3.5-0.8b", seed), *warm = open_dummy("qwen3.5-0.8b", seed);
    CHECK(cold && warm, "qwen3.5-0.8b: two CUDA engines");
    if (cold && warm) {
        const PrefixExact x = {"qwen3.5-0.8b", 16, KV_BYTES, 0, LENS, N_LENS, NULL, 0};
        const double t0 = now_s();
        prefix_check_host(cold, warm, &x, 4);
        prefix_check_host(cold, warm, &x, 0);
        prefix_check_promote(cold, warm, "qwen3.5-0.8b", 16);
        printf("  qwen3.5-0.8b host tier, blocks of 16: %.1f s\n", now_s() - t0);
    }
    q35_engine_close(cold);
    q35_engine_close(warm);
}

int main(int argc, char **argv) {
    GPU_TEST_PROLOGUE("prefix_cuda");
    const uint64_t seed = test_seed(argc, argv, "test_prefix_cuda");
    const Q35Sampling greedy = {.top_p = 1.0f, .repetition_penalty = 1.0f};
    const Q35Sampling sampled = {
        .temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.0f, .seed = seed ^ 0x5eed};
    const Q35SeqParams g0 = {.sampling = greedy, .top_logprobs = 0}, s5 = {.sampling = sampled, .top_logprobs = 5},
                       s0 = {.sampling = sampled, .top_logprobs = 0};
    const Q35SeqParams *hybrid[] = {NULL, NULL, &g0, &s5, &s0, NULL, &s0}, *dense[] = {NULL};
    const int hybrid_blocks[] = {16, 64, 16, 16, 16, 16, 16}, dense_blocks[] = {16};
    const int hybrid_in_step[] = {0, 0, 0, 0, 0, 1, 1}, dense_in_step[] = {1};
    test_model("qwen3.5-0.8b", seed, hybrid, hybrid_blocks, hybrid_in_step, 7);
    test_model("qwen3-0.6b", seed, dense, dense_blocks, dense_in_step, 1);
    test_host(seed);
    return TEST_SUMMARY("prefix_cuda");
}
