/* serve.c — many sequences in one engine (include/qwen35.h, "serve"): a table of slots, a pool of KV blocks with
 * a block table per sequence, a sampler and a token history per sequence, and q35_step, which appends tokens to
 * any subset of the open sequences in one backend call and samples each with its own settings.
 *   A sequence of len tokens holds ceil(len / block) blocks; its table maps position p to row p % block of block
 *   table[p / block]. Blocks come from a free stack and go back on close (or preempt).
 * Backends with a batched step (Backend.step_batch) run all items in one call. Others serve one sequence at a time
 * through forward() (the fallback: one slot, the backend's own single-sequence state, reset whenever a sequence
 * starts at position 0; the block accounting is kept all the same, over ceil(max_seq / block) blocks).
 * Logprobs: log softmax of the raw logits row over the valid ids, lse = max + log sum exp(l - max) in double. */
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "engine.h"
#include "prefix.h"
#include "sampler.h"

typedef struct SeqRec {
    int handle;     /* the public id: slot + n_slots * generation; -1 while the slot is free */
    int generation; /* opens of this slot so far (modulo), so a closed handle never names a new sequence */
    int broken;     /* a backend error hit the sequence: only close is accepted */
    int len;        /* tokens in the KV cache and state: positions 0 .. len-1 */
    int n_hist;     /* ids known: fed ones, then the sampled id not fed yet; > len also while replaying */
    int *hist;      /* [max_seq + 1] */
    int *table;     /* [max_blocks] block ids; the first n_held are this sequence's */
    int n_held;
    int top_logprobs; /* -1: none; 0..20 */
    int n_gen;        /* ids sampled so far: the counter of the next draw (counter_rng) */
    unsigned stamp;   /* last step that named the sequence (duplicate check) */
    Sampler sm;
} SeqRec;

struct Serve {
    int n_slots, block, n_blocks, max_blocks, batched;
    size_t slot_bytes, block_bytes;
    int state_bf16;  /* Q35ServeOptions.state_bf16 */
    int kv_fp8;      /* Q35ServeOptions.kv_fp8 */
    SeqRec *seqs;    /* [n_slots] */
    BlockPool pool;  /* reference counts and the free stack of the KV blocks */
    PrefixCache *pc; /* NULL: no prefix cache (turned off, or a backend without the snapshot hooks) */
    int n_snaps, n_host_snaps, cache_blocks;
    size_t prefix_bytes, host_bytes;
    int n_open;
    unsigned step; /* steps checked so far (duplicate check) */
    float *logits; /* [n_slots][V] the step's logits rows */
    float *row;    /* [n_row_threads][V] the rows being sampled (the sampler changes them in place), one per thread */
    int n_row_threads;
    BatchItem *items;   /* [n_slots] */
    int *pick;          /* [n_slots] BatchItem.pick targets */
    DeviceSampling *ds; /* [n_slots] BatchItem.sample settings */
    int counter_rng;    /* the backend samples on the device: every draw's u is counter_uniform(seed, n_gen), so the
                         * host and the device draw alike */
    const float **rows; /* [n_slots] a step's items' logits rows in s->logits */
    float *lp;          /* [n_slots] BatchItem.logprob targets */
    int *snap_off, *snap_id; /* [n_slots * Q35_MAX_STEP_SNAPS] the items' BatchItem.snap_off / snap_id */
};

static int blocks_for(const Serve *s, int64_t len) { return (int)((len + s->block - 1) / s->block); }

static SeqRec *find(const Serve *s, int seq) {
    if (!s || seq < 0) return NULL;
    SeqRec *r = &s->seqs[seq % s->n_slots];
    return r->handle == seq ? r : NULL;
}

static void release_blocks(Serve *s, SeqRec *r) {
    while (r->n_held > 0) pool_hold(&s->pool, r->table[--r->n_held], -1, 0);
}

void q35_serve_close(Q35Engine *e) {
    Serve *s = e->serve;
    if (!s) return;
    prefix_close(s->pc);
    if (s->seqs)
        for (int i = 0; i < s->n_slots; i++) {
            sampler_free(&s->seqs[i].sm);
            free(s->seqs[i].hist);
            free(s->seqs[i].table);
        }
    if (s->batched && e->be->serve_close) e->be->serve_close(e->bctx);
    if (e->be->reset) { /* the fallback (and a backend's solo steps) used the single sequence: hand it back empty */
        e->be->reset(e->bctx, NULL);
        e->pos = 0;
    }
    free(s->seqs);
    free(s->pool.free_stack);
    free(s->pool.ref);
    free(s->pool.cref);
    free(s->logits);
    free(s->row);
    free(s->items);
    free(s->pick);
    free(s->ds);
    free(s->rows);
    free(s->lp);
    free(s->snap_off);
    free(s->snap_id);
    free(s);
    e->serve = NULL;
}

static double mib(size_t b) { return (double)b / (1024.0 * 1024.0); }

/* Slots and blocks from the budget: one sequence of the full context must fit; then as many slots as asked (and
 * as leave room for that one sequence's blocks), then the rest in blocks (never more than the slots can hold). */
static int size_pools(const Q35Engine *e, const Q35ServeOptions *o, Serve *s, Err *err) {
    ServeSizes z = {0};
    int rc = e->be->serve_sizes(e->bctx, s->block, o->state_bf16, o->kv_fp8, &z, err);
    if (rc) return rc;
    double frac = o->kv_fraction > 0 ? o->kv_fraction : z.mem_fraction;
    size_t budget = o->kv_bytes ? o->kv_bytes : (size_t)(frac * (double)z.mem_bytes);
    size_t one_ctx = (size_t)s->max_blocks * z.block_bytes;
    /* Prefix cache: prefix_bytes (default a quarter of the KV budget) bounds its snapshots + cached blocks. The
     * snapshots (at most half of it) are memory of their own: beside kv_bytes when that is given, else taken out of
     * the automatic budget. The cached blocks are pool blocks no sequence holds (sequences evict them on demand). */
    s->prefix_bytes = 0;
    s->n_snaps = s->cache_blocks = 0;
    if (e->be->snap_save && e->be->snap_load && e->be->block_copy && !o->no_prefix_cache) {
        size_t pb = o->prefix_bytes ? o->prefix_bytes : budget / 4;
        int64_t snaps = z.slot_bytes ? (int64_t)(pb / 2 / z.slot_bytes) : 4096;
        if (z.slot_bytes && snaps < 2 && pb >= 2 * z.slot_bytes) snaps = 2;
        if (snaps > 65536) snaps = 65536;
        size_t snap_mem = (size_t)snaps * z.slot_bytes;
        if (!o->kv_bytes && budget - snap_mem < z.slot_bytes + one_ctx) snaps = 0, snap_mem = 0;
        if (snaps > 0) {
            if (!o->kv_bytes) budget -= snap_mem;
            s->n_snaps = (int)snaps;
            s->prefix_bytes = pb;
            int64_t cb = z.block_bytes ? (int64_t)((pb - snap_mem) / z.block_bytes) : INT_MAX / 2;
            s->cache_blocks = cb > INT_MAX / 2 ? INT_MAX / 2 : (int)cb;
        }
    }
    /* The host tier (prefix_host_bytes, default min(4 GiB, a quarter of the host memory z.host_mem_bytes: none on a
     * backend whose snapshots are in host memory already)): device snapshots move there instead of being evicted. */
    s->n_host_snaps = 0;
    s->host_bytes = 0;
    if (s->n_snaps > 0 && z.slot_bytes && e->be->snap_copy && !o->no_prefix_host) {
        size_t hb = o->prefix_host_bytes;
        if (!hb) hb = z.host_mem_bytes / 4 < ((size_t)4 << 30) ? z.host_mem_bytes / 4 : (size_t)4 << 30;
        int64_t h = (int64_t)(hb / z.slot_bytes);
        if (h > 65536) h = 65536;
        s->n_host_snaps = (int)h;
        s->host_bytes = (size_t)h * z.slot_bytes;
    }
    if (budget < z.slot_bytes + one_ctx)
        return err_set(err, Q35_ERR_OOM,
                       "KV memory of %.2f MiB is too small: one sequence of the full context (%d tokens) needs %.2f "
                       "MiB (a %.2f MiB state slot + %d blocks of %.1f KiB); give more memory or a shorter context",
                       mib(budget), e->max_seq, mib(z.slot_bytes + one_ctx), mib(z.slot_bytes), s->max_blocks,
                       (double)z.block_bytes / 1024.0);
    int64_t slots = o->max_seqs > 0 ? o->max_seqs : 64;
    if (z.slot_bytes > 0 && (int64_t)((budget - one_ctx) / z.slot_bytes) < slots)
        slots = (int64_t)((budget - one_ctx) / z.slot_bytes);
    int64_t most = slots * s->max_blocks;
    int64_t blocks = z.block_bytes ? (int64_t)((budget - (size_t)slots * z.slot_bytes) / z.block_bytes) : most;
    if (blocks > most) blocks = most;
    if (blocks > INT_MAX / 2) blocks = INT_MAX / 2;
    s->n_slots = (int)slots;
    s->n_blocks = (int)blocks;
    s->slot_bytes = z.slot_bytes;
    s->block_bytes = z.block_bytes;
    return 0;
}

int q35_serve_open(Q35Engine *e, const Q35ServeOptions *o, Q35Err *err) {
    Q35ServeOptions d = {0};
    if (!o) o = &d;
    if (e->serve) return err_set(err, Q35_ERR_ARG, "the engine is already serving (q35_serve_close first)");
    if (o->max_seqs < 0 || o->max_seqs > 65536)
        return err_set(err, Q35_ERR_ARG, "max_seqs %d outside [0, 65536]", o->max_seqs);
    if (o->kv_block < 0 || o->kv_block > 65536)
        return err_set(err, Q35_ERR_ARG, "kv_block %d outside [0, 65536]", o->kv_block);
    if (!(o->kv_fraction >= 0 && o->kv_fraction <= 1))
        return err_set(err, Q35_ERR_ARG, "kv_fraction %g outside [0, 1]", o->kv_fraction);
    Serve *s = calloc(1, sizeof *s);
    if (!s) return err_set(err, Q35_ERR_OOM, "out of memory");
    e->serve = s;
    s->block = o->kv_block ? o->kv_block : 16;
    s->max_blocks = blocks_for(s, e->max_seq);
    s->batched = !o->single_seq && e->be->step_batch && e->be->serve_sizes && e->be->serve_open;
    s->counter_rng = s->batched && e->be->decode_sample; /* the backends that sample on the device */
    int rc;
    if (o->state_bf16 && !s->batched) {
        rc = err_set(err, Q35_ERR_UNSUPPORTED, "bf16 DeltaNet states need a backend with a batched step");
        goto fail;
    }
    if (o->kv_fp8 && !s->batched) {
        rc = err_set(err, Q35_ERR_UNSUPPORTED, "an fp8 KV cache needs a backend with a batched step");
        goto fail;
    }
    if (o->ablate && *o->ablate && !s->batched) {
        rc = err_set(err, Q35_ERR_UNSUPPORTED, "--ablate measures the batched step, which this backend does not have");
        goto fail;
    }
    s->state_bf16 = !!o->state_bf16;
    s->kv_fp8 = !!o->kv_fp8;
    if (s->batched) {
        if ((rc = size_pools(e, o, s, err))) goto fail;
        ServeLayout l = {s->n_slots,      s->n_blocks,     s->block,    s->max_blocks, s->n_snaps,
                         s->n_host_snaps, !!o->state_bf16, !!o->kv_fp8, o->ablate};
        rc = e->be->serve_open(e->bctx, &l, err);
        if (rc == Q35_ERR_OOM && l.n_host_snaps && !o->prefix_host_bytes) { /* a default host tier that does not fit */
            l.n_host_snaps = s->n_host_snaps = 0;                           /* (pinned memory) is left out */
            s->host_bytes = 0;
            if (!(rc = e->be->serve_open(e->bctx, &l, err)) && err) *err = (Err){0};
        }
        if (rc) {
            s->batched = 0; /* nothing of the backend's to close */
            goto fail;
        }
    } else {
        s->n_slots = 1;
        s->n_blocks = s->max_blocks;
        if ((rc = e->be->reset(e->bctx, err))) goto fail;
        e->pos = 0;
    }
    const size_t V = (size_t)e->model.config.vocab_size;
    s->seqs = calloc((size_t)s->n_slots, sizeof *s->seqs);
    s->pool.free_stack = malloc(sizeof(int) * (size_t)s->n_blocks);
    s->pool.ref = calloc((size_t)s->n_blocks, sizeof(int));
    s->pool.cref = calloc((size_t)s->n_blocks, sizeof(int));
    s->logits = malloc(sizeof(float) * V * (size_t)s->n_slots);
    s->n_row_threads = omp_get_max_threads() < s->n_slots ? omp_get_max_threads() : s->n_slots;
    if (s->n_row_threads < 1) s->n_row_threads = 1;
    s->row = malloc(sizeof(float) * V * (size_t)s->n_row_threads);
    s->items = malloc(sizeof(BatchItem) * (size_t)s->n_slots);
    s->pick = malloc(sizeof(int) * (size_t)s->n_slots);
    s->ds = malloc(sizeof(DeviceSampling) * (size_t)s->n_slots);
    s->rows = malloc(sizeof(float *) * (size_t)s->n_slots);
    s->lp = malloc(sizeof(float) * (size_t)s->n_slots);
    s->snap_off = malloc(sizeof(int) * Q35_MAX_STEP_SNAPS * (size_t)s->n_slots);
    s->snap_id = malloc(sizeof(int) * Q35_MAX_STEP_SNAPS * (size_t)s->n_slots);
    int failed = !s->seqs || !s->pool.free_stack || !s->pool.ref || !s->pool.cref || !s->logits || !s->row ||
                 !s->items || !s->pick || !s->ds || !s->rows || !s->lp || !s->snap_off || !s->snap_id;
    for (int i = 0; !failed && i < s->n_slots; i++) {
        SeqRec *r = &s->seqs[i];
        r->handle = -1;
        r->hist = malloc(sizeof(int) * (size_t)(e->max_seq + 1));
        r->table = malloc(sizeof(int) * (size_t)s->max_blocks);
        failed = !r->hist || !r->table;
    }
    if (failed) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory for %d sequences of %d tokens", s->n_slots, e->max_seq);
        goto fail;
    }
    for (int i = 0; i < s->n_blocks; i++) s->pool.free_stack[i] = s->n_blocks - 1 - i; /* block 0 on top */
    s->pool.n_free = s->pool.n_blocks = s->n_blocks;
    if (s->batched && s->n_snaps > 0 &&
        !(s->pc = prefix_open(&s->pool, s->block, e->max_seq, s->n_snaps, s->n_host_snaps, s->cache_blocks))) {
        rc = err_set(err, Q35_ERR_OOM, "out of memory for the prefix cache");
        goto fail;
    }
    return 0;
fail:
    q35_serve_close(e);
    return rc;
}

void q35_serve_info(const Q35Engine *e, Q35ServeInfo *info) {
    memset(info, 0, sizeof *info);
    info->max_context = e->max_seq;
    const Serve *s = e->serve;
    if (!s) return;
    info->max_seqs = s->n_slots;
    info->kv_block = s->block;
    info->n_blocks = s->n_blocks;
    info->free_blocks = s->pool.n_free + s->pool.n_cache_only;
    info->open_seqs = s->n_open;
    info->slot_bytes = s->slot_bytes;
    info->state_bf16 = s->state_bf16;
    info->kv_fp8 = s->kv_fp8;
    info->block_bytes = s->block_bytes;
    if (s->pc) {
        PrefixStats st;
        prefix_stats(s->pc, &st);
        info->prefix_bytes = s->prefix_bytes;
        info->prefix_snaps = st.max_snaps;
        info->prefix_max_blocks = st.max_blocks;
        info->prefix_used_snaps = st.snaps;
        info->prefix_host_snaps = st.max_host_snaps;
        info->prefix_used_host_snaps = st.host_snaps;
        info->prefix_demoted = st.demoted;
        info->prefix_promoted = st.promoted;
        info->prefix_used_blocks = st.blocks;
        info->prefix_evicted = st.evicted;
    }
}

int q35_seq_open(Q35Engine *e, const Q35SeqParams *p, int *seq, Q35Err *err) {
    Serve *s = e->serve;
    if (!s) return err_set(err, Q35_ERR_ARG, "the engine is not serving (q35_serve_open first)");
    if (p->top_logprobs < -1 || p->top_logprobs > Q35_MAX_TOP_LOGPROBS)
        return err_set(err, Q35_ERR_ARG, "top_logprobs %d outside [-1, %d]", p->top_logprobs, Q35_MAX_TOP_LOGPROBS);
    int slot = 0;
    while (slot < s->n_slots && s->seqs[slot].handle >= 0) slot++;
    if (slot == s->n_slots) return err_set(err, Q35_ERR_OOM, "all %d sequence slots are taken", s->n_slots);
    SeqRec *r = &s->seqs[slot];
    int rc = sampler_reset(&r->sm, &p->sampling, e->model.config.vocab_size, e->n_valid, err);
    if (!rc) rc = sampler_set_bias(&r->sm, p->bias_ids, p->bias, p->n_bias, err);
    if (!rc) rc = sampler_set_ban(&r->sm, p->min_ids, p->n_min_ids, p->min_tokens, err);
    if (rc) {
        sampler_free(&r->sm);
        return rc;
    }
    int max_gen = INT_MAX / s->n_slots - 1;
    r->generation = r->generation + 1 < max_gen ? r->generation + 1 : 0;
    r->handle = slot + s->n_slots * r->generation;
    r->broken = 0;
    r->len = 0;
    r->n_hist = 0;
    r->n_held = 0;
    r->top_logprobs = p->top_logprobs;
    r->n_gen = 0;
    s->n_open++;
    *seq = r->handle;
    return 0;
}

int q35_seq_open_cached(Q35Engine *e, const Q35SeqParams *p, const int *prompt, int n, int *seq, Q35PrefixHit *hit,
                        Q35Err *err) {
    if (hit) *hit = (Q35PrefixHit){0};
    if (n < 0 || (n > 0 && !prompt)) return err_set(err, Q35_ERR_ARG, "cached open: a prompt of %d ids", n);
    int rc = q35_seq_open(e, p, seq, err);
    Serve *s = e->serve;
    if (rc || !s->pc || n < 2) return rc;
    SeqRec *r = find(s, *seq);
    const int V = e->model.config.vocab_size;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= V) return 0; /* q35_step names the bad id later */
    int snap, matched;
    int at = prefix_lookup(s->pc, prompt, n, n > e->max_seq ? e->max_seq : n - 1, &snap, r->table, &matched);
    if (hit) hit->matched = matched;
    if (at <= 0) return 0;
    const int slot = (int)(r - s->seqs), full = at / s->block, part = at % s->block != 0;
    for (int b = 0; b < full + part; b++) pool_hold(&s->pool, r->table[b], 1, 0); /* before anything can evict */
    r->n_held = full + part;
    Err ignored = {0};
    rc = e->be->snap_load(e->bctx, snap, slot, &ignored);
    if (!rc && part) { /* copy-on-write: the partly filled last block becomes the sequence's own */
        const int src = r->table[full];
        if (s->pool.n_free == 0) prefix_reclaim(s->pc, 1);
        const int dst = pool_take(&s->pool);
        rc = dst < 0 ? Q35_ERR_OOM : e->be->block_copy(e->bctx, src, dst, &ignored);
        if (dst >= 0) {
            r->table[full] = dst; /* the sequence holds dst now; src loses its hold */
            pool_hold(&s->pool, src, -1, 0);
        }
    }
    if (rc) { /* no hit after all: the sequence starts empty (position 0 zeroes the slot's state) */
        release_blocks(s, r);
        return 0;
    }
    const int dev = prefix_promote(s->pc, snap); /* a host snapshot back to a free device id: the slot holds it now */
    if (dev >= 0 && e->be->snap_save(e->bctx, slot, dev, &ignored)) prefix_forget(s->pc, dev);
    for (int i = 0; i < at; i++) {
        r->hist[i] = prompt[i];
        sampler_observe(&r->sm, prompt[i], 0);
    }
    r->len = r->n_hist = at;
    if (hit) hit->cached = at;
    return 0;
}

int q35_seq_snapshot(Q35Engine *e, int seq, Q35Err *err) {
    Serve *s = e->serve;
    SeqRec *r = find(s, seq);
    if (!r) return err_set(err, Q35_ERR_ARG, "sequence %d is not open", seq);
    if (r->broken) return err_set(err, Q35_ERR_ARG, "sequence %d failed in an earlier step (close it)", seq);
    if (!s->pc || r->len == 0) return 0;
    SnapMove mv;
    const int snap = prefix_insert(s->pc, r->hist, r->len, r->table, &mv);
    if (snap < 0) return 0;
    /* the demotion first: the snapshot leaves device id snap before the slot's state goes there */
    int rc = mv.from >= 0 ? e->be->snap_copy(e->bctx, mv.from, mv.to, err) : 0;
    if (rc) prefix_forget(s->pc, mv.to);
    if (!rc) rc = e->be->snap_save(e->bctx, (int)(r - s->seqs), snap, err);
    if (rc) prefix_forget(s->pc, snap);
    return rc;
}

void q35_seq_close(Q35Engine *e, int seq) {
    Serve *s = e->serve;
    SeqRec *r = find(s, seq);
    if (!r) return;
    release_blocks(s, r);
    if (s->batched && e->be->seq_end) e->be->seq_end(e->bctx, (int)(r - s->seqs));
    r->handle = -1; /* its sampler's buffers stay for the slot's next sequence (sampler_reset) */
    s->n_open--;
}

int q35_seq_preempt(Q35Engine *e, int seq, Q35Err *err) {
    Serve *s = e->serve;
    SeqRec *r = find(s, seq);
    if (!r) return err_set(err, Q35_ERR_ARG, "sequence %d is not open", seq);
    release_blocks(s, r);
    if (s->batched && e->be->seq_end) e->be->seq_end(e->bctx, (int)(r - s->seqs));
    r->len = 0;
    r->broken = 0;
    return 0;
}

int q35_seq_length(const Q35Engine *e, int seq) {
    const SeqRec *r = find(e->serve, seq);
    return r ? r->len : Q35_ERR_ARG;
}

int q35_seq_history(const Q35Engine *e, int seq, const int **ids) {
    const SeqRec *r = find(e->serve, seq);
    if (!r) return Q35_ERR_ARG;
    if (ids) *ids = r->hist;
    return r->n_hist;
}

int q35_seq_blocks_needed(const Q35Engine *e, int seq, int n) {
    const SeqRec *r = find(e->serve, seq);
    if (!r || n < 0) return Q35_ERR_ARG;
    if (n > e->max_seq - r->len) n = e->max_seq - r->len + 1; /* past the context anyway; no int overflow */
    int need = blocks_for(e->serve, (int64_t)r->len + n) - r->n_held;
    return need > 0 ? need : 0;
}

/* Raw-logit log softmax over [0, n_valid): the chosen id's logprob and the k largest (ties: smaller id first). */
static void logprobs(Q35StepOut *o, const float *l, int n_valid, int k) {
    if (k > Q35_MAX_TOP_LOGPROBS) k = Q35_MAX_TOP_LOGPROBS;
    float mx = l[0];
    for (int i = 1; i < n_valid; i++)
        if (l[i] > mx) mx = l[i];
    double sum = 0;
    for (int i = 0; i < n_valid; i++) sum += exp((double)l[i] - mx);
    const double lse = mx + log(sum);
    o->logprob = (float)((double)l[o->id] - lse);
    int m = 0; /* top_id[0..m) sorted by logit descending, id ascending */
    for (int i = 0; i < n_valid && k > 0; i++) {
        if (m == k && !(l[i] > l[o->top_id[m - 1]])) continue;
        int j = m < k ? m++ : m - 1;
        while (j > 0 && l[i] > l[o->top_id[j - 1]]) {
            o->top_id[j] = o->top_id[j - 1];
            j--;
        }
        o->top_id[j] = i;
    }
    for (int j = 0; j < m; j++) o->top_logprob[j] = (float)((double)l[o->top_id[j]] - lse);
    o->n_top = m;
}

void q35_logprobs(const Q35Engine *e, const float *logits, int top, Q35StepOut *o) {
    logprobs(o, logits, e->n_valid, top);
}

/* Every check before anything changes: a failed step leaves all sequences as they were. */
static int check_step(Q35Engine *e, const Q35StepItem *items, int n, const Q35StepOut *out, Err *err) {
    Serve *s = e->serve;
    const int V = e->model.config.vocab_size;
    if (!s) return err_set(err, Q35_ERR_ARG, "the engine is not serving (q35_serve_open first)");
    if (n < 0 || (n > 0 && !items)) return err_set(err, Q35_ERR_ARG, "step: %d items", n);
    s->step++;
    for (int i = 0; i < n; i++) {
        const Q35StepItem *it = &items[i];
        SeqRec *r = find(s, it->seq);
        if (!r) return err_set(err, Q35_ERR_ARG, "step item %d: sequence %d is not open", i, it->seq);
        if (r->broken)
            return err_set(err, Q35_ERR_ARG, "step item %d: sequence %d failed in an earlier step (close it)", i,
                           it->seq);
        if (r->stamp == s->step)
            return err_set(err, Q35_ERR_ARG, "step item %d: sequence %d appears twice in the step", i, it->seq);
        r->stamp = s->step;
        if (it->n < 1 || !it->ids) return err_set(err, Q35_ERR_ARG, "step item %d: %d ids", i, it->n);
        if (it->sample && !out) return err_set(err, Q35_ERR_ARG, "step item %d samples but out is NULL", i);
        for (int j = 0; j < it->n; j++) {
            if (it->ids[j] < 0 || it->ids[j] >= V)
                return err_set(err, Q35_ERR_ARG, "step item %d: token id %d at index %d is out of range [0, %d)", i,
                               it->ids[j], j, V);
            const int p = r->len + j;
            if (p < r->n_hist && it->ids[j] != r->hist[p])
                return err_set(err, Q35_ERR_ARG,
                               "step item %d: id %d at position %d is not the sequence's id there (%d): feed the "
                               "sampled id, or after a preemption the history",
                               i, it->ids[j], p, r->hist[p]);
        }
        if (it->sample && r->len + it->n < r->n_hist)
            return err_set(err, Q35_ERR_ARG, "step item %d samples inside the history (position %d of %d)", i,
                           r->len + it->n, r->n_hist);
        if (it->n_snap_at < 0 || it->n_snap_at > Q35_MAX_STEP_SNAPS || (it->n_snap_at && !it->snap_at))
            return err_set(err, Q35_ERR_ARG, "step item %d: %d snapshot points (at most %d)", i, it->n_snap_at,
                           Q35_MAX_STEP_SNAPS);
        for (int k = 0; k < it->n_snap_at; k++)
            if (it->snap_at[k] <= (k ? it->snap_at[k - 1] : r->len) || it->snap_at[k] >= r->len + it->n)
                return err_set(err, Q35_ERR_ARG,
                               "step item %d: snapshot point %d is not inside the step's positions (%d, %d) in "
                               "ascending order",
                               i, it->snap_at[k], r->len, r->len + it->n);
    }
    for (int i = 0; i < n; i++) {
        const SeqRec *r = find(s, items[i].seq);
        if (items[i].n > e->max_seq - r->len)
            return err_set(err, Q35_ERR_CONTEXT,
                           "step item %d: %d tokens do not fit in the context: sequence %d holds %d of %d", i,
                           items[i].n, items[i].seq, r->len, e->max_seq);
    }
    int64_t need = 0;
    for (int i = 0; i < n; i++) need += q35_seq_blocks_needed(e, items[i].seq, items[i].n);
    if (need > s->pool.n_free && s->pc) prefix_reclaim(s->pc, (int)(need < INT_MAX ? need : INT_MAX));
    if (need > s->pool.n_free)
        return err_set(err, Q35_ERR_OOM, "step needs %lld KV blocks, %d are free", (long long)need, s->pool.n_free);
    return 0;
}

int q35_step(Q35Engine *e, const Q35StepItem *items, int n, Q35StepOut *out, Q35Err *err) {
    int rc = check_step(e, items, n, out, err);
    if (rc || n == 0) return rc;
    Serve *s = e->serve;
    const size_t V = (size_t)e->model.config.vocab_size;
    int n_out = 0;
    for (int i = 0; i < n; i++) {
        SeqRec *r = find(s, items[i].seq);
        const int held = blocks_for(s, r->len + items[i].n);
        while (r->n_held < held) r->table[r->n_held++] = pool_take(&s->pool);
        const int want = items[i].sample || items[i].logits;
        s->items[i] = (BatchItem){.slot = (int)(r - s->seqs),
                                  .tokens = items[i].ids,
                                  .n = items[i].n,
                                  .pos = r->len,
                                  .blocks = r->table,
                                  .logits = want};
        /* the fed ids join the history (penalties count them) */
        for (int j = 0; j < items[i].n; j++) {
            const int p = r->len + j;
            if (p < r->n_hist) continue; /* the sampled id, or a replay: observed already */
            r->hist[p] = items[i].ids[j];
            r->n_hist = p + 1;
            sampler_observe(&r->sm, items[i].ids[j], 0);
        }
        /* a pick needs no row on the host: the backend may return the argmax or (counter_rng) the drawn id instead,
         * after the logit changes (penalties, bias, a min_tokens ban: their list goes with the item), and with it the
         * logprob when only the chosen id's is asked for */
        const Q35Sampling *c = &r->sm.cfg;
        s->pick[i] = -1;
        s->lp[i] = NAN;
        if (items[i].sample && !items[i].logits && r->top_logprobs <= 0 && (c->temperature <= 0.0f || s->counter_rng)) {
            const SamplePenalty *pen = NULL;
            const int n_pen = sampler_adjusts(&r->sm) ? sampler_penalties(&r->sm, &pen) : 0;
            if (n_pen >= 0) { /* out of memory for the list: the host picks (and reports it) */
                s->items[i].pick = &s->pick[i];
                if (r->top_logprobs == 0) s->items[i].logprob = &s->lp[i];
            }
            if (n_pen >= 0 && (c->temperature > 0.0f || n_pen > 0)) {
                s->ds[i] = (DeviceSampling){.temperature = c->temperature,
                                            .top_p = c->top_p,
                                            .min_p = c->min_p,
                                            .top_k = c->top_k,
                                            .seed = c->seed,
                                            .step = (uint64_t)r->n_gen,
                                            .repetition = c->repetition_penalty,
                                            .presence = c->presence_penalty,
                                            .frequency = r->sm.cfg.frequency_penalty,
                                            .n_pen = n_pen,
                                            .pen = pen};
                s->items[i].sample = &s->ds[i];
            }
        }
        n_out += want;
    }
    /* snapshots inside the step: recorded in the cache now, filled by the step (on its stream after any demotion) */
    int n_snaps = 0;
    for (int i = 0; i < n && s->pc && !rc; i++) {
        SeqRec *r = find(s, items[i].seq);
        s->items[i].snap_off = s->snap_off + n_snaps;
        s->items[i].snap_id = s->snap_id + n_snaps;
        for (int k = 0; k < items[i].n_snap_at && !rc; k++) {
            const int p = items[i].snap_at[k]; /* the history holds ids [0, p) (the fed ids joined it) */
            SnapMove mv;
            const int snap = prefix_insert(s->pc, r->hist, p, r->table, &mv);
            if (snap < 0) continue;
            int reused = 0; /* an earlier point of this step lost its id (evicted or demoted): it is not filled */
            for (int q = 0; q < n_snaps; q++)
                if (s->snap_id[q] == snap) s->snap_id[q] = -1, reused = 1;
            if (mv.from >= 0 && reused) { /* the demoted copy would be of a snapshot not filled yet */
                prefix_forget(s->pc, mv.to);
            } else if (mv.from >= 0 && (rc = e->be->snap_copy(e->bctx, mv.from, mv.to, err))) {
                prefix_forget(s->pc, mv.to);
                prefix_forget(s->pc, snap);
                break;
            }
            s->snap_off[n_snaps] = p - r->len;
            s->snap_id[n_snaps++] = snap;
            s->items[i].n_snaps++;
        }
    }
    if (!rc && s->batched) {
        rc = e->be->step_batch(e->bctx, s->items, n, n_out ? s->logits : NULL, err);
    } else if (!rc) { /* one slot, so one item (no prefix cache) */
        if (s->items[0].pos == 0) rc = e->be->reset(e->bctx, err);
        if (!rc)
            rc = e->be->forward(e->bctx, items[0].ids, items[0].n, s->items[0].pos, 0, n_out ? s->logits : NULL, err);
    }
    if (rc) {
        for (int k = 0; k < n_snaps; k++)
            if (s->snap_id[k] >= 0) prefix_forget(s->pc, s->snap_id[k]);
        for (int i = 0; i < n; i++) find(s, items[i].seq)->broken = 1;
        return rc;
    }
    /* each item's logits row located; then the host picks and logprobs, in parallel over items: each reads its own row
     * and changes only its own sampler (RNG, scratch) and output, so no result depends on the thread count; then the
     * picks join the histories */
    const float *row = s->logits;
    int n_host = 0;
    for (int i = 0; i < n; i++) {
        SeqRec *r = find(s, items[i].seq);
        r->len += items[i].n;
        if (items[i].logits) memcpy(items[i].logits, row, V * sizeof(float));
        s->rows[i] = row;
        if (!items[i].sample) {
            if (out) out[i] = (Q35StepOut){.id = -1};
            if (items[i].logits) row += V;
            continue;
        }
        memset(&out[i], 0, sizeof out[i]);
        if (s->pick[i] >= 0) {
            out[i].id = s->pick[i];
            if (r->top_logprobs == 0) out[i].logprob = s->lp[i]; /* the backend's (its contract with pick) */
        }
        n_host += s->pick[i] < 0;
        row += V;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(s->n_row_threads) if (n_host > 1)
    for (int i = 0; i < n; i++) {
        if (!items[i].sample) continue;
        SeqRec *r = find(s, items[i].seq);
        Q35StepOut *o = &out[i];
        if (s->pick[i] < 0) {
            float *own = s->row + (size_t)omp_get_thread_num() * V;
            memcpy(own, s->rows[i], V * sizeof(float));
            o->id = s->counter_rng ? sampler_sample_at(&r->sm, own, (uint64_t)r->n_gen) : sampler_sample(&r->sm, own);
        }
        if (r->top_logprobs >= 0 && s->pick[i] < 0) logprobs(o, s->rows[i], e->n_valid, r->top_logprobs);
    }
    for (int i = 0; i < n; i++)
        if (items[i].sample && out[i].id < 0) {
            for (int k = 0; k < n; k++) find(s, items[k].seq)->broken = 1;
            return err_set(err, Q35_ERR_OOM, "out of memory for the sampler");
        }
    for (int i = 0; i < n; i++) {
        if (!items[i].sample) continue;
        SeqRec *r = find(s, items[i].seq);
        sampler_observe(&r->sm, out[i].id, 1);
        r->hist[r->n_hist++] = out[i].id;
        r->n_gen++;
    }
    return 0;
}
