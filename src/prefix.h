/* prefix.h — the prefix cache of the serving engine (src/serve.c; docs/SERVE_ENGINE.md "Prefix cache"): a radix
 * tree over token ids whose nodes hold KV blocks of the shared block pool (reference-counted, read-only) and
 * DeltaNet state snapshots at their end positions. Internal to core. */
#ifndef Q35_PREFIX_H
#define Q35_PREFIX_H

/* The KV block pool shared by the sequences' block tables and the cache's nodes. A block is free when no one holds
 * it (ref 0); cref counts the cache's holds, so a block with ref == cref is held by the cache alone (evictable). */
typedef struct BlockPool {
    int n_blocks;
    int *ref;        /* [n_blocks] holders: sequences' tables + cache nodes */
    int *cref;       /* [n_blocks] holders that are cache nodes */
    int *free_stack; /* [n_blocks] ids of the blocks with ref 0; the top is free_stack[n_free - 1] */
    int n_free;
    int n_cached;     /* blocks with cref > 0 */
    int n_cache_only; /* blocks with ref == cref > 0 */
} BlockPool;

/* Adds d to block b's references (and dc of them the cache's); a block whose ref drops to 0 goes on the free stack. */
void pool_hold(BlockPool *p, int b, int d, int dc);
/* Takes a free block (ref 1, a sequence's); -1 when none is free. */
int pool_take(BlockPool *p);

typedef struct PrefixCache PrefixCache;

/* A cache over pool for sequences of up to max_seq tokens in blocks of `block`: at most n_snaps snapshots on the
 * device (ids [0, n_snaps)), n_host more in host memory (ids [n_snaps, n_snaps + n_host), the host tier: device
 * snapshots demoted there instead of evicted) and max_blocks distinct blocks. NULL on out of memory. */
PrefixCache *prefix_open(BlockPool *pool, int block, int max_seq, int n_snaps, int n_host, int max_blocks);
void prefix_close(PrefixCache *pc);

/* The longest cached prefix of ids[0, n) with a snapshot at its end r <= limit: returns r (0: none) with its
 * snapshot id in *snap and its block ids in blocks[0, ceil(r / block)) (not held: hold them before anything can
 * evict). *matched: the length of the longest common prefix of ids and any cached sequence (>= r). Marks the path
 * used (LRU). */
int prefix_lookup(PrefixCache *pc, const int *ids, int n, int limit, int *snap, int *blocks, int *matched);

/* A copy the caller makes between snapshots (snap_copy): from -> to; from = -1: none. */
typedef struct SnapMove {
    int from, to;
} SnapMove;

/* Records ids[0, len), whose K/V rows are in blocks table[0, ceil(len / block)), with a snapshot at len: the new
 * nodes hold their blocks. Returns the device snapshot id the caller must fill (snap_save), or -1 when there is
 * nothing to fill (one exists already, or the budget cannot hold this sequence). May evict least-recently-used
 * entries. With the device tier full, the least recently used device snapshot moves to the host tier: *mv says
 * which copy the caller makes first (its `from` is the returned id), or mv->from = -1. */
int prefix_insert(PrefixCache *pc, const int *ids, int len, const int *table, SnapMove *mv);
/* Drops the snapshot id snap (its save or copy failed) and any node left without a reason to be. */
void prefix_forget(PrefixCache *pc, int snap);
/* snap, a host-tier snapshot that prefix_lookup returned, was just loaded into a slot: when a device id is free its
 * entry moves there, and the caller fills that id from the slot (snap_save; prefix_forget it on failure). Returns the
 * id, or -1 when the entry stays (no free device id, snap on the device, or its entry evicted since). */
int prefix_promote(PrefixCache *pc, int snap);

/* Evicts least-recently-used entries until the pool has `need` free blocks or the cache is empty; returns the
 * free blocks. */
int prefix_reclaim(PrefixCache *pc, int need);

typedef struct PrefixStats {
    int nodes, snaps, max_snaps, host_snaps, max_host_snaps, blocks, max_blocks; /* now / capacity */
    long long evicted;                                                           /* entries (leaves) evicted so far */
    long long demoted, promoted; /* snapshots moved device -> host tier / host -> device so far */
} PrefixStats;
void prefix_stats(const PrefixCache *pc, PrefixStats *st);

#endif
