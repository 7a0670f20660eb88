/* prefix.c — the prefix cache (prefix.h): a radix tree over token ids.
 *   A node covers the token span [start, end) below its parent (root: the empty span) and holds the KV blocks of
 *   block indices start / B .. (end - 1) / B (B = block): the rows of its span, and in the first block (when
 *   start % B != 0) also its ancestors' rows, equal to theirs (the same ids before them). A node may hold the
 *   snapshot of the DeltaNet state after `end` tokens. Every leaf has a snapshot (a node without one and without
 *   children is removed), so eviction removes least-recently-used leaves, each giving back its snapshot and blocks.
 *   Blocks are never written through the cache: a sequence that resumes at r shares blocks [0, r / B) and copies
 *   the partly filled block r / B (serve.c), and a sequence only appends rows past what it recorded. */
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
    int snap;                /* snapshot id at `end`, -1: none */
    unsigned long long used; /* LRU stamp */
} Node;

struct PrefixCache {
    BlockPool *pool;
    int block, max_seq, n_snaps, max_blocks;
    Node *nodes; /* [cap]; node 0 is the root */
    int cap, n_live, free_node;
    int *free_snaps, n_free_snaps;
    unsigned long long clock;
    long long evicted;
};

static int first_block(const PrefixCache *pc, const Node *x) { return x->start / pc->block; }
static int n_node_blocks(const PrefixCache *pc, const Node *x) {
    return x->end > x->start ? (x->end - 1) / pc->block - x->start / pc->block + 1 : 0;
}

PrefixCache *prefix_open(BlockPool *pool, int block, int max_seq, int n_snaps, int max_blocks) {
    PrefixCache *pc = calloc(1, sizeof *pc);
    if (!pc) return NULL;
    pc->pool = pool;
    pc->block = block;
    pc->max_seq = max_seq;
    pc->n_snaps = n_snaps;
    pc->max_blocks = max_blocks;
    pc->cap = 64;
    pc->nodes = calloc((size_t)pc->cap, sizeof *pc->nodes);
    pc->free_snaps = malloc(sizeof(int) * (size_t)(n_snaps > 0 ? n_snaps : 1));
    if (!pc->nodes || !pc->free_snaps) {
        prefix_close(pc);
        return NULL;
    }
    for (int i = 0; i < n_snaps; i++) pc->free_snaps[i] = n_snaps - 1 - i;
    pc->n_free_snaps = n_snaps;
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

/* Removes leaf x and then each ancestor it leaves without children and without a snapshot. */
static void remove_leaf(PrefixCache *pc, int x) {
    while (x > 0 && pc->nodes[x].child < 0) {
        Node *n = &pc->nodes[x];
        if (n->snap >= 0) pc->free_snaps[pc->n_free_snaps++] = n->snap;
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

int prefix_insert(PrefixCache *pc, const int *ids, int len, const int *table) {
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
    Node *nx = &pc->nodes[x];
    nx->used = now;
    if (nx->snap >= 0) return -1;
    if (pc->n_free_snaps == 0) { /* the least recently used snapshot goes */
        int best = -1;
        for (int i = 1; i < pc->cap; i++)
            if (pc->nodes[i].parent != -2 && pc->nodes[i].snap >= 0 &&
                (best < 0 || pc->nodes[i].used < pc->nodes[best].used))
                best = i;
        if (best < 0) return -1;
        if (pc->nodes[best].child < 0) {
            evict_one(pc, best);
        } else {
            pc->free_snaps[pc->n_free_snaps++] = pc->nodes[best].snap;
            pc->nodes[best].snap = -1;
        }
    }
    nx = &pc->nodes[x];
    nx->snap = pc->free_snaps[--pc->n_free_snaps];
    while (pc->pool->n_cached > pc->max_blocks) { /* over the block budget: other entries go first, then this one */
        const int v = lru_leaf(pc, x);
        if (v < 0) {
            if (pc->nodes[x].child < 0) {
                evict_one(pc, x);
                return -1;
            }
            break;
        }
        evict_one(pc, v);
    }
    return pc->nodes[x].snap;
}

void prefix_forget(PrefixCache *pc, int snap) {
    for (int i = 1; i < pc->cap; i++)
        if (pc->nodes[i].parent != -2 && pc->nodes[i].snap == snap) {
            if (pc->nodes[i].child < 0) {
                remove_leaf(pc, i);
            } else {
                pc->free_snaps[pc->n_free_snaps++] = snap;
                pc->nodes[i].snap = -1;
            }
            return;
        }
}

void prefix_stats(const PrefixCache *pc, PrefixStats *st) {
    memset(st, 0, sizeof *st);
    if (!pc) return;
    st->nodes = pc->n_live - 1;
    st->snaps = pc->n_snaps - pc->n_free_snaps;
    st->max_snaps = pc->n_snaps;
    st->blocks = pc->pool->n_cached;
    st->max_blocks = pc->max_blocks;
    st->evicted = pc->evicted;
}
