/* test_prefix_tree.c — the prefix cache's radix tree and its two snapshot tiers (src/prefix.c) directly, on a block
 * pool of its own, without a model: what prefix_insert / prefix_lookup / prefix_promote / prefix_forget /
 * prefix_reclaim return and the copies they ask for.
 *   (a) a full device tier demotes its least recently used snapshot to the host tier (the copy from -> to comes back
 *       with the insert, and from is the id returned), a full host tier evicts its least recently used entry, and
 *       lookups find demoted entries with their host id; without a host tier the entry is evicted as before;
 *   (b) prefix_promote moves a host entry to a free device id, and only then;
 *   (c) a snapshot recorded above an existing one on the same path while the device tier is full (the divergence
 *       point of a later request): the entry below is dropped or demoted, the new one is kept (the node being filled
 *       was removed with the leaf below it, leaking its snapshot id);
 *   (d) an entry over the block budget evicts least-recently-used leaves first, which frees a device id (no copy);
 *   (e) random inserts, lookups, promotions, forgets and reclaims with a model of what each snapshot id holds (copies
 *       applied as the caller makes them): every hit's snapshot holds its own prefix's state (so no id is held by two
 *       entries) and its blocks are held, and reclaiming everything frees every block and snapshot. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefix.h"
#include "test.h"

#define B      4 /* tokens per block: partly filled blocks and splits inside blocks are the rule */
#define NB     600
#define MAXLEN 240

static BlockPool pool;

static void pool_init(void) {
    free(pool.ref);
    free(pool.cref);
    free(pool.free_stack);
    pool = (BlockPool){.n_blocks = NB};
    pool.ref = calloc(NB, sizeof(int));
    pool.cref = calloc(NB, sizeof(int));
    pool.free_stack = malloc(NB * sizeof(int));
    for (int i = 0; i < NB; i++) pool.free_stack[i] = NB - 1 - i;
    pool.n_free = NB;
}

/* A cold sequence of ids[0, len) records a snapshot at len: fresh blocks (reclaimed from the cache when short), the
 * insert, then the sequence closes. Returns the insert's id, its move in *mv. */
static int record(PrefixCache *pc, const int *ids, int len, SnapMove *mv) {
    int table[MAXLEN / B + 1];
    const int nb = (len + B - 1) / B;
    if (pool.n_free < nb) prefix_reclaim(pc, nb);
    for (int b = 0; b < nb; b++) table[b] = pool_take(&pool);
    const int snap = prefix_insert(pc, ids, len, table, mv);
    for (int b = 0; b < nb; b++) pool_hold(&pool, table[b], -1, 0);
    return snap;
}

static int lookup(PrefixCache *pc, const int *ids, int n, int *snap) {
    int blocks[MAXLEN / B + 1], matched;
    return prefix_lookup(pc, ids, n, n, snap, blocks, &matched);
}

static void seq(int *ids, int n, int first) {
    for (int i = 0; i < n; i++) ids[i] = first + i;
}

/* (a), (b) */
static void test_tiers(void) {
    pool_init();
    PrefixCache *pc = prefix_open(&pool, B, MAXLEN, 1, 2, NB);
    static int p[5][30];
    for (int k = 0; k < 5; k++) seq(p[k], 30, 1000 * (k + 1));
    SnapMove mv;
    int s = record(pc, p[0], 30, &mv);
    CHECK(s == 0 && mv.from == -1, "first entry: device id %d, no move (%d)", s, mv.from);
    s = record(pc, p[1], 30, &mv);
    CHECK(s == 0 && mv.from == 0 && mv.to == 1, "device tier full: demote 0 -> 1, fill 0 (got %d -> %d, %d)", mv.from,
          mv.to, s);
    int snap, r = lookup(pc, p[0], 30, &snap);
    CHECK(r == 30 && snap == 1, "the demoted entry hits with its host id: at %d snap %d", r, snap);
    s = record(pc, p[2], 30, &mv);
    CHECK(s == 0 && mv.from == 0 && mv.to == 2, "second demotion 0 -> 2 (got %d -> %d, %d)", mv.from, mv.to, s);
    /* host tier full: its least recently used (p[1]: p[0] was looked up since) goes */
    s = record(pc, p[3], 30, &mv);
    CHECK(s == 0 && mv.from == 0 && mv.to == 2, "host tier full: p[1] evicted, p[2] demoted to 2 (got %d -> %d)",
          mv.from, mv.to);
    PrefixStats st;
    prefix_stats(pc, &st);
    CHECK(st.nodes == 3 && st.snaps == 1 && st.host_snaps == 2 && st.max_host_snaps == 2 && st.demoted == 3 &&
              st.evicted == 1,
          "stats: %d nodes, %d + %d snapshots, %lld demoted, %lld evicted", st.nodes, st.snaps, st.host_snaps,
          st.demoted, st.evicted);
    r = lookup(pc, p[1], 30, &snap);
    CHECK(r == 0, "the evicted entry misses (%d)", r);
    r = lookup(pc, p[0], 30, &snap);
    CHECK(r == 30 && snap == 1, "p[0] on the host: %d %d", r, snap);
    CHECK(prefix_promote(pc, snap) == -1, "no free device id: the entry stays on the host");
    r = lookup(pc, p[3], 30, &snap);
    CHECK(r == 30 && snap == 0, "p[3] on the device: %d %d", r, snap);
    CHECK(prefix_promote(pc, 0) == -1, "a device id is not promoted");
    prefix_forget(pc, 0); /* p[3]'s save failed: its entry goes, device id 0 is free */
    r = lookup(pc, p[2], 30, &snap);
    CHECK(r == 30 && snap == 2, "p[2] on the host: %d %d", r, snap);
    const int d = prefix_promote(pc, 2);
    r = lookup(pc, p[2], 30, &snap);
    CHECK(d == 0 && r == 30 && snap == 0, "promoted to %d: now hits with %d", d, snap);
    prefix_stats(pc, &st);
    CHECK(st.snaps == 1 && st.host_snaps == 1 && st.promoted == 1, "after the promotion: %d + %d, %lld promoted",
          st.snaps, st.host_snaps, st.promoted);
    prefix_reclaim(pc, NB);
    prefix_stats(pc, &st);
    CHECK(st.nodes == 0 && st.snaps == 0 && st.host_snaps == 0 && st.blocks == 0 && pool.n_free == NB,
          "all reclaimed: %d nodes, %d + %d snapshots, %d blocks cached, %d of %d free", st.nodes, st.snaps,
          st.host_snaps, st.blocks, pool.n_free, NB);
    prefix_close(pc);

    /* no host tier: the least recently used entry is evicted */
    pool_init();
    pc = prefix_open(&pool, B, MAXLEN, 1, 0, NB);
    record(pc, p[0], 30, &mv);
    s = record(pc, p[1], 30, &mv);
    r = lookup(pc, p[0], 30, &snap);
    prefix_stats(pc, &st);
    CHECK(s == 0 && mv.from == -1 && r == 0 && st.max_host_snaps == 0 && st.evicted == 1,
          "no host tier: evicted (insert %d, move %d, lookup %d)", s, mv.from, r);
    prefix_close(pc);
    CHECK(pool.n_free == NB, "closing the cache frees its blocks: %d of %d", pool.n_free, NB);
}

/* (c) */
static void test_snapshot_above(void) {
    static int ids[500], other[100];
    seq(ids, 500, 1);
    seq(other, 100, 5000);
    for (int host = 0; host <= 1; host++) {
        pool_init();
        PrefixCache *pc = prefix_open(&pool, 16, 1000, 1, host, NB);
        SnapMove mv;
        const int s1 = record(pc, ids, 200, &mv), s2 = record(pc, ids, 130, &mv);
        PrefixStats st;
        prefix_stats(pc, &st);
        int snap, r = lookup(pc, ids, 200, &snap);
        CHECK(s1 == 0 && s2 == 0 && st.snaps == 1 && st.host_snaps == host && st.nodes == 1 + host,
              "host tier %d: a snapshot at 130 below one at 200: ids %d %d, %d nodes, %d + %d snapshots", host, s1, s2,
              st.nodes, st.snaps, st.host_snaps);
        CHECK(r == (host ? 200 : 130) && snap == (host ? 1 : 0), "host tier %d: lookup at %d snap %d", host, r, snap);
        const int s3 = record(pc, other, 100, &mv);
        prefix_stats(pc, &st);
        CHECK(s3 == 0 && st.snaps == 1, "host tier %d: the cache still records (id %d, %d snapshots)", host, s3,
              st.snaps);
        prefix_reclaim(pc, NB);
        prefix_stats(pc, &st);
        CHECK(st.snaps == 0 && st.host_snaps == 0 && st.nodes == 0 && pool.n_free == NB,
              "host tier %d: nothing left after reclaiming: %d + %d snapshots, %d nodes, %d free", host, st.snaps,
              st.host_snaps, st.nodes, pool.n_free);
        prefix_close(pc);
    }
}

/* (d) */
static void test_block_budget(void) {
    pool_init();
    PrefixCache *pc = prefix_open(&pool, B, MAXLEN, 2, 3, 40); /* entries of 30 ids: 8 blocks each */
    static int p[6][30];
    for (int k = 0; k < 6; k++) seq(p[k], 30, 1000 * (k + 1));
    SnapMove mv;
    for (int k = 0; k < 5; k++) record(pc, p[k], 30, &mv); /* p[0..2] demoted to host ids 2, 3, 4 */
    PrefixStats st;
    prefix_stats(pc, &st);
    CHECK(st.blocks == 40 && st.snaps == 2 && st.host_snaps == 3 && st.demoted == 3 && st.evicted == 0,
          "5 entries in 40 blocks: %d blocks, %d + %d snapshots, %lld demoted, %lld evicted", st.blocks, st.snaps,
          st.host_snaps, st.demoted, st.evicted);
    /* a 6th: over the block budget, the least recently used leaf (p[0], host id 2) goes; the device tier stays full,
     * so p[3] (device id 1) moves into host id 2 */
    int s = record(pc, p[5], 30, &mv);
    prefix_stats(pc, &st);
    CHECK(s == 1 && mv.from == 1 && mv.to == 2 && st.evicted == 1 && st.blocks == 40,
          "6th entry: id %d, move %d -> %d, %lld evicted, %d blocks", s, mv.from, mv.to, st.evicted, st.blocks);
    /* lookups make the host entries the most recent: the next entry evicts the least recently used device entry
     * (p[4], device id 0) and takes its id, no copy */
    int snap;
    for (int k = 1; k <= 3; k++) lookup(pc, p[k], 30, &snap);
    static int q[30];
    seq(q, 30, 9000);
    s = record(pc, q, 30, &mv);
    prefix_stats(pc, &st);
    const int r4 = lookup(pc, p[4], 30, &snap);
    CHECK(s == 0 && mv.from == -1 && st.evicted == 2 && st.demoted == 4 && r4 == 0,
          "an evicted device entry's id is reused without a copy: id %d, move %d, %lld evicted, %lld demoted, p[4] "
          "at %d",
          s, mv.from, st.evicted, st.demoted, r4);
    prefix_close(pc);
}

/* (e) */
static unsigned rng_state = 12345u;
static unsigned rnd(unsigned n) {
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 8) % n;
}

static unsigned long long hash_ids(const int *ids, int n) {
    unsigned long long h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (unsigned)ids[i]) * 1099511628211ull;
    return h ^ (unsigned long long)n;
}

static void test_random(void) {
    enum { N_DEV = 3, N_HOST = 5, N_SEQS = 40, OPS = 4000 };
    pool_init();
    PrefixCache *pc = prefix_open(&pool, B, MAXLEN, N_DEV, N_HOST, 150);
    static int seqs[N_SEQS][MAXLEN];
    int lens[N_SEQS];
    for (int k = 0; k < N_SEQS; k++) { /* a few stems, each sequence a stem's start + its own tail */
        const int stem = (int)rnd(4), keep = (int)rnd(MAXLEN);
        lens[k] = 1 + (int)rnd(MAXLEN);
        for (int i = 0; i < lens[k]; i++) seqs[k][i] = i < keep ? 1 + stem * 1000 + i : 100000 + k * 1000 + i;
    }
    unsigned long long content[N_DEV + N_HOST] = {0}; /* what each snapshot id holds: the hash of its prefix */
    int bad_hit = 0, bad_move = 0, bad_count = 0, hits = 0, host_hits = 0, moves = 0, promotions = 0;
    for (int op = 0; op < OPS; op++) {
        const int k = (int)rnd(N_SEQS), what = (int)rnd(10);
        if (what < 4) { /* record a snapshot at a random point of sequence k */
            const int len = 1 + (int)rnd((unsigned)lens[k]);
            SnapMove mv;
            const int s = record(pc, seqs[k], len, &mv);
            if (mv.from >= 0) {
                bad_move += mv.from != s || mv.from >= N_DEV || mv.to < N_DEV || mv.to >= N_DEV + N_HOST;
                content[mv.to] = content[mv.from];
                moves++;
            }
            if (s >= 0) content[s] = hash_ids(seqs[k], len);
        } else if (what < 8) { /* a request for sequence k: the hit's snapshot must hold its prefix */
            int snap, blocks[MAXLEN / B + 1], matched;
            const int r = prefix_lookup(pc, seqs[k], lens[k], lens[k], &snap, blocks, &matched);
            if (r > 0) {
                hits++;
                host_hits += snap >= N_DEV;
                bad_hit += content[snap] != hash_ids(seqs[k], r);
                for (int b = 0; b < (r + B - 1) / B; b++) bad_hit += blocks[b] < 0 || pool.ref[blocks[b]] <= 0;
                const int d = snap >= N_DEV ? prefix_promote(pc, snap) : -1;
                if (d >= 0) {
                    content[d] = content[snap];
                    promotions++;
                }
            }
        } else if (what < 9) { /* a failed save */
            prefix_forget(pc, (int)rnd(N_DEV + N_HOST));
        } else {
            prefix_reclaim(pc, pool.n_free + 1 + (int)rnd(20));
        }
        PrefixStats st;
        prefix_stats(pc, &st);
        bad_count += st.snaps > N_DEV || st.host_snaps > N_HOST || st.snaps < 0 || st.host_snaps < 0;
    }
    CHECK(!bad_hit && !bad_move && !bad_count,
          "random ops: %d hits (%d from the host tier), %d demotions, %d promotions; wrong hits %d, moves %d, "
          "tier counts %d",
          hits, host_hits, moves, promotions, bad_hit, bad_move, bad_count);
    printf("random ops: %d hits (%d from the host tier), %d demotions, %d promotions\n", hits, host_hits, moves,
           promotions);
    CHECK(host_hits > 50 && moves > 50 && promotions > 5, "the random ops use both tiers: %d %d %d", host_hits, moves,
          promotions);
    prefix_reclaim(pc, NB);
    PrefixStats st;
    prefix_stats(pc, &st);
    CHECK(st.nodes == 0 && st.snaps == 0 && st.host_snaps == 0 && pool.n_free == NB && pool.n_cached == 0,
          "after the random ops, reclaiming everything leaves %d nodes, %d + %d snapshots, %d of %d blocks free",
          st.nodes, st.snaps, st.host_snaps, pool.n_free, NB);
    prefix_close(pc);
}

int main(void) {
    test_tiers();
    test_snapshot_above();
    test_block_budget();
    test_random();
    free(pool.ref);
    free(pool.cref);
    free(pool.free_stack);
    return TEST_SUMMARY("prefix_tree");
}
