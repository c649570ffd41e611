/* Grounded values' span automaton (grammar/span_automaton.py is the reference and says what the symbols are).
 *
 * A suffix automaton of the request's source symbols (every substring of the symbol string is a path from state 0),
 * built in O(n); and the mask of a grammar state: which tokens of the vocabulary can be read from it, by a walk of the
 * vocabulary's byte trie that stops where no state follows. The grammar state is (template state, span state,
 * decoder): the template is a byte DFA of the schema's regex with one "hole" (a grounded string's content) per hole
 * state; while in a hole, bytes are read by the span automaton until a closing quote at a character boundary returns
 * to the template. Edges live in one open-addressing hash table keyed by (state, symbol).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALPHABET 1024 /* symbols are below 513; keys are state * ALPHABET + symbol */

typedef struct {
    int64_t *keys; /* -1: empty */
    int32_t *values;
    int64_t mask;
    int32_t *len, *link;
    int32_t *first_edge, *edge_next, *edge_sym; /* each state's edges, for copying them to a clone */
    int64_t states, edges, capacity_states, capacity_edges;
} sam_t;

static inline uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static inline int32_t sam_get(const sam_t *a, int32_t s, int32_t sym)
{
    int64_t key = (int64_t)s * ALPHABET + sym;
    for (uint64_t i = mix((uint64_t)key) & (uint64_t)a->mask;; i = (i + 1) & (uint64_t)a->mask) {
        int64_t k = a->keys[i];
        if (k == key)
            return a->values[i];
        if (k < 0)
            return -1;
    }
}

static void sam_put(sam_t *a, int32_t s, int32_t sym, int32_t to)
{
    int64_t key = (int64_t)s * ALPHABET + sym;
    uint64_t i = mix((uint64_t)key) & (uint64_t)a->mask;
    while (a->keys[i] >= 0 && a->keys[i] != key)
        i = (i + 1) & (uint64_t)a->mask;
    if (a->keys[i] < 0) { /* a new edge: also on the state's list */
        a->keys[i] = key;
        int64_t e = a->edges++;
        a->edge_sym[e] = sym;
        a->edge_next[e] = a->first_edge[s];
        a->first_edge[s] = (int32_t)e;
    }
    a->values[i] = to;
}

void loraplex_sam_free(sam_t *a)
{
    if (!a)
        return;
    free(a->keys);
    free(a->values);
    free(a->len);
    free(a->link);
    free(a->first_edge);
    free(a->edge_next);
    free(a->edge_sym);
    free(a);
}

/* The suffix automaton of syms[0..n); a symbol of SEPARATOR (or above) is never read from, so no path crosses it.
 * Returns NULL when out of memory. */
sam_t *loraplex_sam_build(const int16_t *syms, int64_t n)
{
    sam_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->capacity_states = 2 * n + 2;
    a->capacity_edges = 3 * n + 4;
    int64_t slots = 1;
    while (slots < 2 * a->capacity_edges)
        slots <<= 1;
    a->mask = slots - 1;
    a->keys = malloc(slots * sizeof *a->keys);
    a->values = malloc(slots * sizeof *a->values);
    a->len = malloc(a->capacity_states * sizeof *a->len);
    a->link = malloc(a->capacity_states * sizeof *a->link);
    a->first_edge = malloc(a->capacity_states * sizeof *a->first_edge);
    a->edge_next = malloc(a->capacity_edges * sizeof *a->edge_next);
    a->edge_sym = malloc(a->capacity_edges * sizeof *a->edge_sym);
    if (!a->keys || !a->values || !a->len || !a->link || !a->first_edge || !a->edge_next || !a->edge_sym) {
        loraplex_sam_free(a);
        return NULL;
    }
    memset(a->keys, 0xff, slots * sizeof *a->keys);
    a->states = 1;
    a->len[0] = 0;
    a->link[0] = -1;
    a->first_edge[0] = -1;
    int32_t last = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t c = syms[i];
        int32_t cur = (int32_t)a->states++;
        a->len[cur] = a->len[last] + 1;
        a->first_edge[cur] = -1;
        int32_t p = last;
        while (p >= 0 && sam_get(a, p, c) < 0) {
            sam_put(a, p, c, cur);
            p = a->link[p];
        }
        if (p < 0) {
            a->link[cur] = 0;
        } else {
            int32_t q = sam_get(a, p, c);
            if (a->len[p] + 1 == a->len[q]) {
                a->link[cur] = q;
            } else {
                int32_t clone = (int32_t)a->states++;
                a->len[clone] = a->len[p] + 1;
                a->link[clone] = a->link[q];
                a->first_edge[clone] = -1;
                for (int32_t e = a->first_edge[q]; e >= 0; e = a->edge_next[e])
                    sam_put(a, clone, a->edge_sym[e], sam_get(a, q, a->edge_sym[e]));
                while (p >= 0 && sam_get(a, p, c) == q) {
                    sam_put(a, p, c, clone);
                    p = a->link[p];
                }
                a->link[q] = a->link[cur] = clone;
            }
        }
        last = cur;
    }
    return a;
}

int64_t loraplex_sam_states(const sam_t *a) { return a->states; }

/* ---- the grammar state and one byte -------------------------------------------------------------------------- */
/* decoder: 0 at a character boundary; 1 after a backslash; 2..5: 1..4 hex digits of \uXXXX to come; 6..8: 1..3
 * UTF-8 continuation bytes to come. In an escape (1..5) a byte is read as symbol byte + 256. */
#define QUOTE 34
#define BACKSLASH 92

typedef struct {
    const int32_t *table; /* [template states, 256]: next template state, -1: none */
    const int32_t *hole;  /* [template states]: the state after the hole (a grounded string's content), -1: none */
} template_t;

typedef struct {
    int32_t t, s, d; /* template state; span state (-1: not in a hole); decoder */
} gstate_t;

static inline int step(const sam_t *a, const template_t *tp, gstate_t *g, int b)
{
    if (g->s < 0) {
        int32_t t = tp->table[(int64_t)g->t * 256 + b];
        if (t < 0)
            return 0;
        g->t = t;
        if (tp->hole[t] >= 0) { /* a hole starts: its content is read by the span automaton */
            g->s = 0;
            g->d = 0;
        }
        return 1;
    }
    int d = g->d;
    if (d == 0 && b >= 0x80 && b < 0xc0) /* a continuation byte where a character starts: never a span's start */
        return 0;
    if (d == 0 && b == QUOTE) { /* the content ends: back to the template after the hole */
        int32_t t = tp->table[(int64_t)tp->hole[g->t] * 256 + b];
        if (t < 0)
            return 0;
        g->t = t;
        g->s = -1;
        if (tp->hole[t] >= 0) {
            g->s = 0;
            g->d = 0;
        }
        return 1;
    }
    int sym = (d >= 1 && d <= 5) ? b + 256 : b;
    int32_t s = sam_get(a, g->s, sym);
    if (s < 0)
        return 0;
    int nd;
    if (d == 0)
        nd = b == BACKSLASH ? 1 : (b >= 0xf0 ? 8 : b >= 0xe0 ? 7 : b >= 0xc0 ? 6 : 0);
    else if (d == 1)
        nd = b == 'u' ? 5 : 0;
    else if (d == 2 || d == 6)
        nd = 0;
    else
        nd = d - 1;
    g->s = s;
    g->d = nd;
    return 1;
}

/* Reads bytes[0..n) from state[3] (t, s, d), writing the state reached; returns how many bytes were read (n: all). */
int64_t loraplex_span_consume(const sam_t *a, const int32_t *table, const int32_t *hole, int32_t *state,
                              const uint8_t *bytes, int64_t n)
{
    template_t tp = {table, hole};
    gstate_t g = {state[0], state[1], state[2]};
    int64_t i = 0;
    for (; i < n; i++)
        if (!step(a, &tp, &g, bytes[i]))
            break;
    state[0] = g.t;
    state[1] = g.s;
    state[2] = g.d;
    return i;
}

/* ---- masks: the vocabulary's byte trie walked from a state --------------------------------------------------- */
/* Trie nodes in breadth-first order, node 0 the root; node i's children are child_node[child_start[i] ..
 * child_start[i + 1]) on bytes child_byte[...]; the tokens whose bytes end at node i are
 * token_ids[token_start[i] .. token_start[i + 1]). */
typedef struct {
    const int32_t *child_start, *child_node, *token_start, *token_ids;
    const uint8_t *child_byte;
} trie_t;

/* Sets the bit of every token readable from state[3] in mask (uint32 words, LSB first; not cleared first).
 * stack: int32 scratch of 4 x the trie's nodes (a node is pushed at most once). Returns the trie nodes reached. */
int64_t loraplex_span_mask(const sam_t *a, const int32_t *table, const int32_t *hole, const int32_t *state,
                           const int32_t *child_start, const int32_t *child_node, const uint8_t *child_byte,
                           const int32_t *token_start, const int32_t *token_ids, uint32_t *mask, int32_t *stack)
{
    template_t tp = {table, hole};
    trie_t tr = {child_start, child_node, token_start, token_ids, child_byte};
    int64_t top = 0, visited = 0;
    stack[0] = 0;
    stack[1] = state[0];
    stack[2] = state[1];
    stack[3] = state[2];
    top = 1;
    while (top > 0) {
        top--;
        int32_t node = stack[4 * top];
        gstate_t from = {stack[4 * top + 1], stack[4 * top + 2], stack[4 * top + 3]};
        for (int32_t c = tr.child_start[node]; c < tr.child_start[node + 1]; c++) {
            gstate_t g = from;
            if (!step(a, &tp, &g, tr.child_byte[c]))
                continue;
            int32_t child = tr.child_node[c];
            visited++;
            for (int32_t k = tr.token_start[child]; k < tr.token_start[child + 1]; k++) {
                uint32_t id = (uint32_t)tr.token_ids[k];
                mask[id >> 5] |= 1u << (id & 31);
            }
            if (tr.child_start[child] < tr.child_start[child + 1]) {
                stack[4 * top] = child;
                stack[4 * top + 1] = g.t;
                stack[4 * top + 2] = g.s;
                stack[4 * top + 3] = g.d;
                top++;
            }
        }
    }
    return visited;
}

/* Which bytes can be read from state[3]: out[b] = 1 or 0; returns how many can. */
int64_t loraplex_span_next_bytes(const sam_t *a, const int32_t *table, const int32_t *hole, const int32_t *state,
                                 uint8_t *out)
{
    template_t tp = {table, hole};
    int64_t count = 0;
    for (int b = 0; b < 256; b++) {
        gstate_t g = {state[0], state[1], state[2]};
        out[b] = (uint8_t)step(a, &tp, &g, b);
        count += out[b];
    }
    return count;
}

/* The bytes every continuation from state[3] starts with, up to limit (none where the output may end: the
 * template's accepting[t] outside a hole); returns how many were written to out. */
int64_t loraplex_span_forced(const sam_t *a, const int32_t *table, const int32_t *hole, const uint8_t *accepting,
                             const int32_t *state, uint8_t *out, int64_t limit)
{
    template_t tp = {table, hole};
    gstate_t g = {state[0], state[1], state[2]};
    int64_t n = 0;
    while (n < limit && !(g.s < 0 && accepting[g.t])) {
        int only = -1, count = 0;
        for (int b = 0; b < 256 && count < 2; b++) {
            gstate_t probe = g;
            if (step(a, &tp, &probe, b)) {
                only = b;
                count++;
            }
        }
        if (count != 1)
            break;
        step(a, &tp, &g, only);
        out[n++] = (uint8_t)only;
    }
    return n;
}
