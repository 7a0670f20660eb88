/* prefix.c — the prefix cache (prefix.h): a radix tree over token ids.
 *   A node covers the token span [start, end) below its parent (root: the empty span) and holds the KV blocks of
 *   block indices start / B .. (end - 1) / B (B = block): the rows of its span, and in the first block (when
 *   start % B != 0) also its ancestors' rows, equal to theirs (the same ids before them). A node may hold the
 *   snapshot of the DeltaNet state after `end` tokens. Every leaf has a snapshot (a node without one and without
 *   children is removed), so eviction removes least-recently-used leaves, each giving back its snapshot and blocks.
 *   Blocks are never written through the cache: a sequence that resumes at r shares blocks [0, r / B) and copies
 *   the partly filled block r / B (serve.c), and a sequence only appends rows past what it recorded.
 *   Snapshots come in two tiers: device ids [0, n_snaps) and host ids [n_snaps, n_snaps + n_host). A new snapshot
 *   takes a device id; with none free, the least recently used device snapshot moves to a host id (the host tier's
 *   least recently used goes first when that is full) and its node keeps its blocks. A hit loads a host snapshot
 *   straight into the slot, and moves it back to the device only when a device id is free (prefix_promote). */
#include <stdlib.h>
#include <string.h>

#include "prefix.h"

void pool_hold(BlockPool *p, int b, int d, int dc) {
    const int only0 = p->ref[b] > 0 && p->ref[b] == p->cref[b], cached0 = p->cref[b] > 0;
    p->ref[b] += d;
    p->cref[b] += dc;
    p->n_cache_only += (p->ref[b] > 0 && p->ref[b] == p->cref[b]) - only0;
    p->n_cached += (p->cref[b] > 0) - cached0;
    if (d < 0 && p->ref[b] == 0) p->free_stack[p->n_free++] = b;
}

int pool_take(BlockPool *p) {
    if (p->n_free == 0) return -1;
    const int b = p->free_stack[--p->n_free];
    p->ref[b] = 1;
    return b;
}

typedef struct Node {
    int parent, child, next; /* tree links: first child, next sibling (-1: none) */
    int start, end;          /* token span [start, end) */
    int *ids;                /* [end - start] */
    int *blocks;             /* [last_block - first_block + 1] */
    int snap;                /* snapshot id at `end` (device or host tier), -1: none */
    unsigned long long used; /* LRU stamp */
} Node;

struct PrefixCache {
    BlockPool *pool;
    int block, max_seq, n_snaps, n_host, max_blocks;
    Node *nodes; /* [cap]; node 0 is the root */
    int cap, n_live, free_node;
    int *free_snaps, n_free_snaps; /* free device ids */
    int *free_host, n_free_host;   /* free host ids */
    int pin;                       /* the node prefix_insert fills: removing leaves never takes it (-1: none) */
    unsigned long long clock;
    long long evicted, demoted, promoted;
};

static void release_snap(PrefixCache *pc, int snap) {
    if (snap < pc->n_snaps)
        pc->free_snaps[pc->n_free_snaps++] = snap;
    else
        pc->free_host[pc->n_free_host++] = snap;
}

static int first_block(const PrefixCache *pc, const Node *x) { return x->start / pc->block; }
static int n_node_blocks(const PrefixCache *pc, const Node *x) {
    return x->end > x->start ? (x->end - 1) / pc->block - x->start / pc->block + 1 : 0;
}

PrefixCache *prefix_open(BlockPool *pool, int block, int max_seq, int n_snaps, int n_host, int max_blocks) {
    PrefixCache *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->pool = pool;
    pc->block = block;
    pc->max_seq = max_seq;
    pc->n_snaps = n_snaps;
    pc->n_host = n_snaps > 0 && n_host > 0 ? n_host : 0;
    pc->max_blocks = max_blocks;
    pc->pin = -1;
    pc->cap = 64;
    pc->nodes = calloc((size_t)pc->cap, sizeof *pc->nodes);
    pc->free_snaps = malloc(sizeof(int) * (size_t)(n_snaps > 0 ? n_snaps : 1));
    pc->free_host = malloc(sizeof(int) * (size_t)(pc->n_host > 0 ? pc->n_host : 1));
    if (!pc->nodes || !pc->free_snaps || !pc->free_host) {
        prefix_close(pc);
        return NULL;
    }
    for (int i = 0; i < n_snaps; i++) pc->free_snaps[i] = n_snaps - 1 - i;
    pc->n_free_snaps = n_snaps;
    for (int i = 0; i < pc->n_host; i++) pc->free_host[i] = n_snaps + pc->n_host - 1 - i;
    pc->n_free_host = pc->n_host;
    pc->nodes[0] = (Node){.parent = -1, .child = -1, .next = -1, .snap = -1};
    pc->free_node = -1;
    for (int i = pc->cap - 1; i >= 1; i--) {
        pc->nodes[i].next = pc->free_node;
        pc->nodes[i].parent = -2; /* free */
        pc->free_node = i;
    }
    pc->n_live = 1;
    return pc;
}

void prefix_close(PrefixCache *pc) {
    if (!pc) return;
    if (pc->nodes)
        for (int i = 1; i < pc->cap; i++)
            if (pc->nodes[i].parent != -2) {
                Node *x = &pc->nodes[i];
                for (int j = 0; j < n_node_blocks(pc, x); j++) pool_hold(pc->pool, x->blocks[j], -1, -1);
                free(x->ids);
                free(x->blocks);
            }
    free(pc->nodes);
    free(pc->free_snaps);
    free(pc->free_host);
    free(pc);
}

/* A new node (links and arrays unset); -1 on out of memory. */
static int node_new(PrefixCache *pc) {
    if (pc->free_node < 0) {
        const int cap = pc->cap * 2;
        Node *n = realloc(pc->nodes, sizeof *n * (size_t)cap);
        if (!n) return -1;
        pc->nodes = n;
        for (int i = cap - 1; i >= pc->cap; i--) {
            n[i].next = pc->free_node;
            n[i].parent = -2;
            pc->free_node = i;
        }
        pc->cap = cap;
    }
    const int i = pc->free_node;
    pc->free_node = pc->nodes[i].next;
    pc->nodes[i] = (Node){.parent = -1, .child = -1, .next = -1, .snap = -1};
    pc->n_live++;
    return i;
}

static void unlink_child(PrefixCache *pc, int x) {
    Node *p = &pc->nodes[pc->nodes[x].parent];
    if (p->child == x) {
        p->child = pc->nodes[x].next;
        return;
    }
    for (int c = p->child; c >= 0; c = pc->nodes[c].next)
        if (pc->nodes[c].next == x) {
            pc->nodes[c].next = pc->nodes[x].next;
            return;
        }
}

static void link_child(PrefixCache *pc, int parent, int x) {
    pc->nodes[x].parent = parent;
    pc->nodes[x].next = pc->nodes[parent].child;
    pc->nodes[parent].child = x;
}

/* Removes leaf x and then each ancestor it leaves without children and without a snapshot (never the pinned one). */
static void remove_leaf(PrefixCache *pc, int x) {
    while (x > 0 && x != pc->pin && pc->nodes[x].child < 0) {
        Node *n = &pc->nodes[x];
        if (n->snap >= 0) release_snap(pc, n->snap);
        for (int j = 0; j < n_node_blocks(pc, n); j++) pool_hold(pc->pool, n->blocks[j], -1, -1);
        free(n->ids);
        free(n->blocks);
        const int parent = n->parent;
        unlink_child(pc, x);
        n->parent = -2;
        n->next = pc->free_node;
        pc->free_node = x;
        pc->n_live--;
        x = parent;
        if (x > 0 && pc->nodes[x].snap >= 0) break;
    }
}

/* The least recently used leaf other than `keep` (and not an ancestor of it); -1 if none. */
static int lru_leaf(const PrefixCache *pc, int keep) {
    int best = -1;
    for (int i = 1; i < pc->cap; i++) {
        const Node *n = &pc->nodes[i];
        if (n->parent == -2 || n->child >= 0 || i == keep) continue;
        if (best < 0 || n->used < pc->nodes[best].used) best = i;
    }
    return best;
}

static void evict_one(PrefixCache *pc, int x) {
    pc->evicted++;
    remove_leaf(pc, x);
}

/* The least recently used node with a snapshot on the host tier (host = 1) or the device tier; -1 if none. */
static int lru_snap(const PrefixCache *pc, int host) {
    int best = -1;
    for (int i = 1; i < pc->cap; i++) {
        const Node *n = &pc->nodes[i];
        if (n->parent == -2 || n->snap < 0 || (n->snap >= pc->n_snaps) != host) continue;
        if (best < 0 || n->used < pc->nodes[best].used) best = i;
    }
    return best;
}

/* Node x's snapshot goes: with it the entry when x is a leaf (and ancestors left without a reason to be). */
static void drop_snap(PrefixCache *pc, int x) {
    if (pc->nodes[x].child < 0) {
        evict_one(pc, x);
    } else {
        release_snap(pc, pc->nodes[x].snap);
        pc->nodes[x].snap = -1;
    }
}

/* Frees a device id: the least recently used device snapshot moves to a host id (*mv: the copy), the host tier's
 * least recently used going first when that is full; without a host tier it goes. */
static void free_device_snap(PrefixCache *pc, SnapMove *mv) {
    if (pc->n_host > 0 && pc->n_free_host == 0) {
        const int h = lru_snap(pc, 1);
        if (h >= 0) drop_snap(pc, h);
    }
    const int d = lru_snap(pc, 0);
    if (d < 0) return;
    if (pc->n_free_host == 0) {
        drop_snap(pc, d);
        return;
    }
    Node *nd = &pc->nodes[d];
    *mv = (SnapMove){nd->snap, pc->free_host[--pc->n_free_host]};
    pc->free_snaps[pc->n_free_snaps++] = nd->snap;
    nd->snap = mv->to;
    pc->demoted++;
}

int prefix_reclaim(PrefixCache *pc, int need) {
    while (pc->pool->n_free < need && pc->pool->n_cache_only > 0) {
        const int x = lru_leaf(pc, -1);
        if (x < 0) break;
        evict_one(pc, x);
    }
    return pc->pool->n_free;
}

/* Common length of ids[0, n) and node x's span, ids starting at x's start. */
static int common(const Node *x, const int *ids, int n) {
    int k = 0;
    const int span = x->end - x->start;
    while (k < span && x->start + k < n && x->ids[k] == ids[x->start + k]) k++;
    return k;
}

static int child_for(const PrefixCache *pc, int x, int id) {
    for (int c = pc->nodes[x].child; c >= 0; c = pc->nodes[c].next)
        if (pc->nodes[c].ids[0] == id) return c;
    return -1;
}

int prefix_lookup(PrefixCache *pc, const int *ids, int n, int limit, int *snap, int *blocks, int *matched) {
    int x = 0, pos = 0, best = 0;
    const unsigned long long now = ++pc->clock;
    *snap = -1;
    for (;;) {
        const int c = pos < n ? child_for(pc, x, ids[pos]) : -1;
        if (c < 0) break;
        Node *nc = &pc->nodes[c];
        const int k = common(nc, ids, n);
        pos += k;
        if (k < nc->end - nc->start) break;
        x = c;
        nc->used = now;
        if (nc->snap >= 0 && nc->end <= limit) best = x;
    }
    *matched = pos;
    if (!best) return 0;
    /* blocks along the path to best, bottom up: a deeper node's copy of a shared first block wins */
    const int nb = (pc->nodes[best].end + pc->block - 1) / pc->block;
    for (int b = 0; b < nb; b++) blocks[b] = -1;
    for (int y = best; y > 0; y = pc->nodes[y].parent) {
        const Node *ny = &pc->nodes[y];
        for (int j = 0; j < n_node_blocks(pc, ny); j++)
            if (blocks[first_block(pc, ny) + j] < 0) blocks[first_block(pc, ny) + j] = ny->blocks[j];
    }
    *snap = pc->nodes[best].snap;
    return pc->nodes[best].end;
}

/* Splits node x at absolute position k (start < k < end): a new node takes [start, k) in x's place, x keeps
 * [k, end) below it. Returns the new node or -1. */
static int split(PrefixCache *pc, int x, int k) {
    const int y = node_new(pc);
    if (y < 0) return -1;
    Node *nx = &pc->nodes[x], *ny = &pc->nodes[y];
    ny->start = nx->start;
    ny->end = k;
    ny->used = nx->used;
    const int nb_y = n_node_blocks(pc, ny), drop = k / pc->block - nx->start / pc->block;
    ny->ids = malloc(sizeof(int) * (size_t)(k - nx->start));
    ny->blocks = malloc(sizeof(int) * (size_t)nb_y);
    int *ids = malloc(sizeof(int) * (size_t)(nx->end - k));
    if (!ny->ids || !ny->blocks || !ids) {
        free(ny->ids);
        free(ny->blocks);
        free(ids);
        ny->parent = -2;
        ny->next = pc->free_node;
        pc->free_node = y;
        pc->n_live--;
        return -1;
    }
    memcpy(ny->ids, nx->ids, sizeof(int) * (size_t)(k - nx->start));
    memcpy(ids, nx->ids + (k - nx->start), sizeof(int) * (size_t)(nx->end - k));
    memcpy(ny->blocks, nx->blocks, sizeof(int) * (size_t)nb_y);
    if (k % pc->block) pool_hold(pc->pool, nx->blocks[drop], 1, 1); /* the straddling block: held by both */
    memmove(nx->blocks, nx->blocks + drop, sizeof(int) * (size_t)(n_node_blocks(pc, nx) - drop));
    free(nx->ids);
    nx->ids = ids;
    const int parent = nx->parent;
    unlink_child(pc, x);
    link_child(pc, parent, y);
    nx->start = k;
    link_child(pc, y, x);
    return y;
}

/* A new leaf below x for ids[pos, len) with blocks from table; -1 on out of memory. */
static int add_leaf(PrefixCache *pc, int x, const int *ids, int pos, int len, const int *table) {
    const int y = node_new(pc);
    if (y < 0) return -1;
    Node *ny = &pc->nodes[y];
    ny->start = pos;
    ny->end = len;
    const int nb = n_node_blocks(pc, ny);
    ny->ids = malloc(sizeof(int) * (size_t)(len - pos));
    ny->blocks = malloc(sizeof(int) * (size_t)nb);
    if (!ny->ids || !ny->blocks) {
        free(ny->ids);
        free(ny->blocks);
        ny->parent = -2;
        ny->next = pc->free_node;
        pc->free_node = y;
        pc->n_live--;
        return -1;
    }
    memcpy(ny->ids, ids + pos, sizeof(int) * (size_t)(len - pos));
    for (int j = 0; j < nb; j++) {
        ny->blocks[j] = table[pos / pc->block + j];
        pool_hold(pc->pool, ny->blocks[j], 1, 1);
    }
    link_child(pc, x, y);
    return y;
}

int prefix_insert(PrefixCache *pc, const int *ids, int len, const int *table, SnapMove *mv) {
    *mv = (SnapMove){-1, -1};
    if (len <= 0 || pc->n_snaps <= 0) return -1;
    const unsigned long long now = ++pc->clock;
    int x = 0, pos = 0;
    while (pos < len) {
        const int c = child_for(pc, x, ids[pos]);
        if (c < 0) {
            x = add_leaf(pc, x, ids, pos, len, table);
            if (x < 0) return -1;
            pos = len;
            break;
        }
        const int k = common(&pc->nodes[c], ids, len);
        if (k < pc->nodes[c].end - pc->nodes[c].start) {
            const int y = split(pc, c, pc->nodes[c].start + k);
            if (y < 0) return -1;
            x = y;
            pos += k;
            continue; /* pos == len: x ends here; else a new leaf below x */
        }
        x = c;
        pos += k;
        pc->nodes[x].used = now;
    }
    pc->nodes[x].used = now;
    if (pc->nodes[x].snap >= 0) return -1;
    /* x has no snapshot yet: pinned, so evicting a leaf below it cannot take it along */
    pc->pin = x;
    while (pc->pool->n_cached > pc->max_blocks) { /* over the block budget: other entries go first, then this one */
        const int v = lru_leaf(pc, x);
        if (v < 0) break;
        evict_one(pc, v);
    }
    if (pc->pool->n_cached <= pc->max_blocks && pc->n_free_snaps == 0) free_device_snap(pc, mv);
    pc->pin = -1;
    if (pc->pool->n_cached > pc->max_blocks || pc->n_free_snaps == 0) {
        if (pc->nodes[x].child < 0) evict_one(pc, x);
        *mv = (SnapMove){-1, -1};
        return -1;
    }
    pc->nodes[x].snap = pc->free_snaps[--pc->n_free_snaps];
    return pc->nodes[x].snap;
}

void prefix_forget(PrefixCache *pc, int snap) {
    for (int i = 1; i < pc->cap; i++)
        if (pc->nodes[i].parent != -2 && pc->nodes[i].snap == snap) {
            if (pc->nodes[i].child < 0) {
                remove_leaf(pc, i);
            } else {
                release_snap(pc, snap);
                pc->nodes[i].snap = -1;
            }
            return;
        }
}

int prefix_promote(PrefixCache *pc, int snap) {
    if (snap < pc->n_snaps || pc->n_free_snaps == 0) return -1;
    for (int i = 1; i < pc->cap; i++)
        if (pc->nodes[i].parent != -2 && pc->nodes[i].snap == snap) {
            release_snap(pc, snap);
            pc->nodes[i].snap = pc->free_snaps[--pc->n_free_snaps];
            pc->promoted++;
            return pc->nodes[i].snap;
        }
    return -1;
}

void prefix_stats(const PrefixCache *pc, PrefixStats *st) {
    memset(st, 0, sizeof *st);
    if (!pc) return;
    st->nodes = pc->n_live - 1;
    st->snaps = pc->n_snaps - pc->n_free_snaps;
    st->max_snaps = pc->n_snaps;
    st->host_snaps = pc->n_host - pc->n_free_host;
    st->max_host_snaps = pc->n_host;
    st->blocks = pc->pool->n_cached;
    st->max_blocks = pc->max_blocks;
    st->evicted = pc->evicted;
    st->demoted = pc->demoted;
    st->promoted = pc->promoted;
}
