/* Grounded values' span automaton (grammar/span_automaton.py is the reference and says what the symbols are).
 *
 * A suffix automaton of the request's source symbols (every substring of the symbol string is a path from state 0),
 * built in O(n); and the mask of a grammar state: which tokens of the vocabulary can be read from it, by a walk of the
 * vocabulary's byte trie that stops where no state follows. The grammar state is (template state, span state,
 * decoder): the template is a byte DFA of the schema's regex with one "hole" (a grounded string's content) per hole
 * state; while in a hole, bytes are read by the span automaton until a closing quote at a character boundary returns
 * to the template. Edges live in one open-addressing hash table keyed by (state, symbol), the start state's in an
 * array.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALPHABET 1024 /* symbols are below 513; keys are state * ALPHABET + symbol */

#define STATE_BITS 27 /* states below 2^27: a source of up to 2^26 symbols (the service accepts 1,000,000 characters) */
#define STATE_MASK ((UINT64_C(1) << STATE_BITS) - 1)

typedef struct {
    /* edges: one open-addressing table of words (key + 1) << STATE_BITS | target, key = state * ALPHABET + symbol,
     * 0: empty (a probe reads one word: a hole's first mask probes hundreds of edges, each a likely cache miss) */
    uint64_t *slots;
    int64_t mask;
    int32_t root[ALPHABET]; /* state 0's edges, where every span starts (-1: none) */
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

/* The slot of key in an open-addressing table of keys (-1: empty), linear probing: where the key is, else the empty
 * slot where it goes (the liveness memo's table). */
static inline uint64_t find_slot(const int64_t *keys, int64_t mask, int64_t key)
{
    uint64_t i = mix((uint64_t)key) & (uint64_t)mask;
    while (keys[i] >= 0 && keys[i] != key)
        i = (i + 1) & (uint64_t)mask;
    return i;
}

static inline uint64_t sam_slot(const sam_t *a, uint64_t key)
{
    const uint64_t tag = (key + 1) << STATE_BITS;
    uint64_t i = mix(key) & (uint64_t)a->mask;
    while (a->slots[i] && (a->slots[i] & ~STATE_MASK) != tag)
        i = (i + 1) & (uint64_t)a->mask;
    return i;
}

static inline int32_t sam_get(const sam_t *a, int32_t s, int32_t sym)
{
    if (s == 0)
        return a->root[sym];
    uint64_t word = a->slots[sam_slot(a, (uint64_t)s * ALPHABET + sym)];
    return word ? (int32_t)(word & STATE_MASK) : -1;
}

static void sam_put(sam_t *a, int32_t s, int32_t sym, int32_t to)
{
    uint64_t key = (uint64_t)s * ALPHABET + sym, i = 0;
    int fresh;
    if (s == 0) {
        fresh = a->root[sym] < 0;
        a->root[sym] = to;
    } else {
        i = sam_slot(a, key);
        fresh = !a->slots[i];
        a->slots[i] = (key + 1) << STATE_BITS | (uint64_t)to;
    }
    if (fresh) { /* a new edge: also on the state's list */
        int64_t e = a->edges++;
        a->edge_sym[e] = sym;
        a->edge_next[e] = a->first_edge[s];
        a->first_edge[s] = (int32_t)e;
    }
}

void loraplex_sam_free(sam_t *a)
{
    if (!a)
        return;
    free(a->slots);
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
    if (a->capacity_states > (int64_t)STATE_MASK) {
        free(a);
        return NULL;
    }
    int64_t slots = 1;
    while (slots < 2 * a->capacity_edges)
        slots <<= 1;
    a->mask = slots - 1;
    a->slots = calloc(slots, sizeof *a->slots);
    for (int i = 0; i < ALPHABET; i++)
        a->root[i] = -1;
    a->len = malloc(a->capacity_states * sizeof *a->len);
    a->link = malloc(a->capacity_states * sizeof *a->link);
    a->first_edge = malloc(a->capacity_states * sizeof *a->first_edge);
    a->edge_next = malloc(a->capacity_edges * sizeof *a->edge_next);
    a->edge_sym = malloc(a->capacity_edges * sizeof *a->edge_sym);
    if (!a->slots || !a->len || !a->link || !a->first_edge || !a->edge_next || !a->edge_sym) {
        loraplex_sam_free(a);
        return NULL;
    }
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
#define SEPARATOR 512

/* What one request's grammar reads with: the template (a byte DFA of the schema, one hole per grounded string), the
 * content DFAs of the grounded strings' other keywords (their intersection, one DFA per string, all in one table),
 * and the memo of which (span state, content state, decoder) can still end a value. */
typedef struct {
    const sam_t *a;
    const int32_t *table;        /* [T, 256]: next template state, -1: none */
    const int32_t *hole;         /* [T]: the state after the hole that starts at t, -1: none */
    const int32_t *hole_content; /* [T]: the content DFA's start state for the hole at t, -1: no other keyword */
    const uint8_t *dead;         /* [T]: 1 where this request's sources leave no way to the end */
    const int32_t *ctable;       /* [Q, 256]: next content state, -1: none */
    const uint8_t *caccept;      /* [Q] */
    int64_t q_states;
    int64_t fuel; /* product states one liveness question may expand before it is answered "no" (narrowing) */
    /* memo: key (s, q, d) -> 1 live, 2 dead */
    int64_t *keys;
    uint8_t *values;
    int64_t mask, used;
    /* scratch of the liveness search */
    int32_t *stack;
    int64_t stack_cap;
    /* the greedy walk's record of each state's mask signature (see loraplex_span_greedy), and its scratch */
    struct signature *sigs;
    int64_t sig_mask, sig_used;
    uint32_t *words;
    int64_t words_cap;
    struct mask_key *seen;
    int64_t seen_cap;
} grammar_t;

typedef struct {
    int32_t t, s, d, q; /* template state; span state (-1: not in a hole); decoder; content state (-1: none) */
} gstate_t;

static inline int next_decoder(int d, int b)
{
    if (d == 0)
        return b == BACKSLASH ? 1 : (b >= 0xf0 ? 8 : b >= 0xe0 ? 7 : b >= 0xc0 ? 6 : 0);
    if (d == 1)
        return b == 'u' ? 5 : 0;
    if (d == 2 || d == 6)
        return 0;
    return d - 1;
}

static inline int64_t live_key(const grammar_t *g, int32_t s, int32_t q, int d)
{
    return ((int64_t)s * g->q_states + q) * 9 + d;
}

static int memo_get(const grammar_t *g, int64_t key)
{
    uint64_t i = find_slot(g->keys, g->mask, key);
    return g->keys[i] == key ? g->values[i] : 0;
}

static void memo_put(grammar_t *g, int64_t key, uint8_t value)
{
    if (2 * (g->used + 1) > g->mask + 1) { /* grow: keep the load under a half */
        int64_t old_slots = g->mask + 1, slots = 2 * old_slots;
        int64_t *keys = malloc(slots * sizeof *keys);
        uint8_t *values = malloc(slots);
        if (!keys || !values) { /* out of memory: forget this answer (it is found again when asked) */
            free(keys);
            free(values);
            return;
        }
        memset(keys, 0xff, slots * sizeof *keys);
        for (int64_t j = 0; j < old_slots; j++) {
            if (g->keys[j] < 0)
                continue;
            uint64_t i = find_slot(keys, slots - 1, g->keys[j]);
            keys[i] = g->keys[j];
            values[i] = g->values[j];
        }
        free(g->keys);
        free(g->values);
        g->keys = keys;
        g->values = values;
        g->mask = slots - 1;
    }
    uint64_t i = find_slot(g->keys, g->mask, key);
    if (g->keys[i] < 0)
        g->used++;
    g->keys[i] = key;
    g->values[i] = value;
}

/* Whether a value in (span state s, content state q, decoder d) can still end: some continuation the span
 * automaton reads leaves the decoder at a character boundary with the content DFA accepting. The span automaton
 * is acyclic, so a depth-first search over the product ends; answers are memoised for the request. A search that
 * expands more than the fuel answers no (the value is narrowed, never widened). */
static int live(grammar_t *g, int32_t s, int32_t q, int d)
{
    if (q < 0 || (d == 0 && g->caccept[q]))
        return 1;
    int64_t root = live_key(g, s, q, d);
    int known = memo_get(g, root);
    if (known)
        return known == 1;
    const sam_t *a = g->a;
    int64_t top = 0, fuel = g->fuel;
    /* frames: s, q, d, the next edge of s to try */
#define PUSH(S, Q, D)                                                                                                  \
    do {                                                                                                               \
        if (4 * (top + 1) > g->stack_cap) {                                                                            \
            int64_t cap = 2 * g->stack_cap + 64;                                                                       \
            int32_t *grown = realloc(g->stack, cap * sizeof *grown);                                                   \
            if (!grown)                                                                                                \
                return 0;                                                                                              \
            g->stack = grown;                                                                                          \
            g->stack_cap = cap;                                                                                        \
        }                                                                                                              \
        g->stack[4 * top] = (S);                                                                                       \
        g->stack[4 * top + 1] = (Q);                                                                                   \
        g->stack[4 * top + 2] = (D);                                                                                   \
        g->stack[4 * top + 3] = a->first_edge[(S)];                                                                    \
        top++;                                                                                                         \
    } while (0)
    PUSH(s, q, d);
    while (top > 0) {
        int32_t *f = g->stack + 4 * (top - 1);
        int32_t e = f[3];
        if (e < 0) { /* every edge tried: no way to the end from here */
            memo_put(g, live_key(g, f[0], f[1], f[2]), 2);
            top--;
            continue;
        }
        f[3] = a->edge_next[e];
        int sym = a->edge_sym[e];
        if (sym >= SEPARATOR)
            continue;
        int b = sym & 255, fd = f[2];
        int escaped = fd >= 1 && fd <= 5;
        if ((escaped ? b + 256 : b) != sym || (fd == 0 && b >= 0x80 && b < 0xc0))
            continue;
        int32_t q2 = g->ctable[(int64_t)f[1] * 256 + b];
        if (q2 < 0)
            continue;
        int d2 = next_decoder(fd, b);
        int32_t s2 = sam_get(a, f[0], sym);
        int found = (d2 == 0 && g->caccept[q2]) ? 1 : memo_get(g, live_key(g, s2, q2, d2));
        if (found == 1) { /* a way to the end: from every state on the stack */
            for (int64_t i = 0; i < top; i++)
                memo_put(g, live_key(g, g->stack[4 * i], g->stack[4 * i + 1], g->stack[4 * i + 2]), 1);
            return 1;
        }
        if (found == 2)
            continue;
        if (--fuel < 0) { /* out of fuel: the question is answered no, and remembered so */
            memo_put(g, root, 2);
            return 0;
        }
        PUSH(s2, q2, d2);
    }
#undef PUSH
    return 0;
}

static inline int enter(grammar_t *g, gstate_t *st, int32_t t)
{
    if (g->dead[t])
        return 0;
    st->t = t;
    st->s = -1;
    st->d = 0;
    st->q = -1;
    if (g->hole[t] >= 0) { /* a hole starts: its content is read by the span automaton */
        st->s = 0;
        st->q = g->hole_content[t];
        return live(g, 0, st->q, 0);
    }
    return 1;
}

static inline int step(grammar_t *g, gstate_t *st, int b)
{
    if (st->s < 0) {
        int32_t t = g->table[(int64_t)st->t * 256 + b];
        return t >= 0 && enter(g, st, t);
    }
    int d = st->d;
    if (d == 0 && b >= 0x80 && b < 0xc0) /* a continuation byte where a character starts: never a span's start */
        return 0;
    if (d == 0 && b == QUOTE) { /* the content ends: back to the template after the hole */
        if (st->q >= 0 && !g->caccept[st->q])
            return 0;
        int32_t t = g->table[(int64_t)g->hole[st->t] * 256 + b];
        return t >= 0 && enter(g, st, t);
    }
    int sym = (d >= 1 && d <= 5) ? b + 256 : b;
    int32_t s = sam_get(g->a, st->s, sym);
    if (s < 0)
        return 0;
    int32_t q = st->q;
    if (q >= 0) {
        q = g->ctable[(int64_t)q * 256 + b];
        if (q < 0)
            return 0;
    }
    int nd = next_decoder(d, b);
    if (q >= 0 && !live(g, s, q, nd))
        return 0;
    st->s = s;
    st->d = nd;
    st->q = q;
    return 1;
}

grammar_t *loraplex_span_grammar_new(const sam_t *a, const int32_t *table, const int32_t *hole,
                                     const int32_t *hole_content, const uint8_t *dead, const int32_t *ctable,
                                     const uint8_t *caccept, int64_t q_states, int64_t fuel)
{
    grammar_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    *g = (grammar_t){a, table, hole, hole_content, dead, ctable, caccept, q_states > 0 ? q_states : 1, fuel};
    g->mask = 63;
    g->keys = malloc(64 * sizeof *g->keys);
    g->values = malloc(64);
    if (!g->keys || !g->values) {
        free(g->keys);
        free(g->values);
        free(g);
        return NULL;
    }
    memset(g->keys, 0xff, 64 * sizeof *g->keys);
    return g;
}

void loraplex_span_grammar_free(grammar_t *g)
{
    if (!g)
        return;
    free(g->keys);
    free(g->values);
    free(g->stack);
    free(g->sigs);
    free(g->words);
    free(g->seen);
    free(g);
}

/* Whether a value can start and end in the hole at template state t (its content DFA's start, from the span
 * automaton's start): 0 where no span of the sources satisfies the string's other keywords. */
int64_t loraplex_span_hole_live(grammar_t *g, int32_t t) { return live(g, 0, g->hole_content[t], 0); }

/* Reads bytes[0..n) from state[4] (t, s, d, q); returns how many bytes were read, and writes the state reached only
 * when that is all of them (else state is left as it was). */
int64_t loraplex_span_consume(grammar_t *g, int32_t *state, const uint8_t *bytes, int64_t n)
{
    gstate_t st = {state[0], state[1], state[2], state[3]};
    int64_t i = 0;
    for (; i < n; i++)
        if (!step(g, &st, bytes[i]))
            return i;
    state[0] = st.t;
    state[1] = st.s;
    state[2] = st.d;
    state[3] = st.q;
    return n;
}

/* ---- masks: the vocabulary's byte trie walked from a state --------------------------------------------------- */
/* Trie nodes in breadth-first order, node 0 the root; node i's children are child_node[child_start[i] ..
 * child_start[i + 1]) on bytes child_byte[...]; the tokens whose bytes end at node i are
 * token_ids[token_start[i] .. token_start[i + 1]). */

/* Sets the bit of every token readable from state[4] in mask (uint32 words, LSB first; not cleared first).
 * stack: int32 scratch of 5 x the trie's nodes (a node is pushed at most once). Returns the trie nodes reached. */
int64_t loraplex_span_mask(grammar_t *g, const int32_t *state, const int32_t *child_start, const int32_t *child_node,
                           const uint8_t *child_byte, const int32_t *token_start, const int32_t *token_ids,
                           uint32_t *mask, int32_t *stack)
{
    int64_t top = 1, visited = 0;
    stack[0] = 0;
    memcpy(stack + 1, state, 4 * sizeof *stack);
    while (top > 0) {
        top--;
        int32_t node = stack[5 * top];
        gstate_t from = {stack[5 * top + 1], stack[5 * top + 2], stack[5 * top + 3], stack[5 * top + 4]};
        for (int32_t c = child_start[node]; c < child_start[node + 1]; c++) {
            gstate_t st = from;
            if (!step(g, &st, child_byte[c]))
                continue;
            int32_t child = child_node[c];
            visited++;
            for (int32_t k = token_start[child]; k < token_start[child + 1]; k++) {
                uint32_t id = (uint32_t)token_ids[k];
                mask[id >> 5] |= 1u << (id & 31);
            }
            if (child_start[child] < child_start[child + 1]) {
                int32_t *f = stack + 5 * top;
                f[0] = child;
                f[1] = st.t;
                f[2] = st.s;
                f[3] = st.d;
                f[4] = st.q;
                top++;
            }
        }
    }
    return visited;
}

/* Which bytes can be read from state[4]: out[b] = 1 or 0; returns how many can. */
int64_t loraplex_span_next_bytes(grammar_t *g, const int32_t *state, uint8_t *out)
{
    int64_t count = 0;
    for (int b = 0; b < 256; b++) {
        gstate_t st = {state[0], state[1], state[2], state[3]};
        out[b] = (uint8_t)step(g, &st, b);
        count += out[b];
    }
    return count;
}

static inline int accepting_at(const uint8_t *accepting, const gstate_t *st) { return st->s < 0 && accepting[st->t]; }

/* The bytes every continuation from st starts with, up to limit, into out (none where the output may end). */
static int64_t forced_run(grammar_t *g, const uint8_t *accepting, gstate_t st, uint8_t *out, int64_t limit)
{
    int64_t n = 0;
    while (n < limit && !accepting_at(accepting, &st)) {
        int only = -1, count = 0;
        for (int b = 0; b < 256 && count < 2; b++) {
            gstate_t probe = st;
            if (step(g, &probe, b)) {
                only = b;
                count++;
            }
        }
        if (count != 1)
            break;
        step(g, &st, only);
        out[n++] = (uint8_t)only;
    }
    return n;
}

/* The bytes every continuation from state[4] starts with, up to limit (none where the output may end: the
 * template's accepting[t] outside a hole); returns how many were written to out. */
int64_t loraplex_span_forced(grammar_t *g, const uint8_t *accepting, const int32_t *state, uint8_t *out,
                             int64_t limit)
{
    gstate_t st = {state[0], state[1], state[2], state[3]};
    return forced_run(g, accepting, st, out, limit);
}

/* ---- the completion search's greedy walk, for span grammars ----------------------------------------------------- */
/* grammar/search.py's CompletionSearch._greedy is the budget logic every backend follows, and its docstring says what
 * the walk does; this is the same walk over this grammar's states (a span grammar's plans are made per request, where
 * the token automaton's are shared by all of a schema's requests, so their cost is on every request's masks). It
 * must choose exactly the bytes the Python walk chooses (tests/grammar/test_span_greedy.py compares them). The
 * walk tells masks apart as Python does by a hash of the normalised mask (here 64 bits), but only where the states
 * differ and their one-byte tokens agree (masks that differ there differ); a state's hash is computed once per
 * request (a request's grammar is always walked with its one search's tables). */

/* What the walk reads besides the grammar: the vocabulary's trie, and the search's tables. */
typedef struct {
    const int32_t *child_start, *child_node;
    const uint8_t *child_byte;
    const int32_t *token_start, *token_ids;
    const int32_t *byte_token; /* [256]: the byte's one-byte token, -1: none (the search's byte_token) */
    const uint8_t *usable;     /* [256]: 1 where the byte's token may be in a normalised mask of a state that does not
                                  accept (a token the vocabulary filter keeps, not EOS) */
    const uint8_t *order;      /* [256]: the bytes in the walk's order of preference (CLOSING_ORDER, then the rest) */
    const uint32_t *kept;      /* [words]: the tokens a normalised mask of a state that does not accept may hold */
    int64_t words, max_bytes, forced_limit, repeat;
} walk_tables_t;

struct signature {
    int32_t t, s, d, q; /* t = -1: an empty slot */
    uint64_t hash;
};

static inline uint64_t state_slot(const grammar_t *g, const gstate_t *st)
{
    uint64_t k = ((uint64_t)(uint32_t)st->t << 32 | (uint32_t)st->s) ^ mix((uint64_t)(uint32_t)st->q << 8 | st->d);
    uint64_t i = mix(k) & (uint64_t)g->sig_mask;
    while (g->sigs[i].t >= 0 && !(g->sigs[i].t == st->t && g->sigs[i].s == st->s && g->sigs[i].d == st->d &&
                                  g->sigs[i].q == st->q))
        i = (i + 1) & (uint64_t)g->sig_mask;
    return i;
}

#define SIGNATURES_KEPT (1 << 16) /* a request's record of signatures is forgotten past this many states */

/* Makes room for one more signature; 0 when out of memory. */
static int signatures_room(grammar_t *g)
{
    if (g->sigs && 2 * (g->sig_used + 1) <= g->sig_mask + 1)
        return 1;
    int64_t slots = g->sigs ? 2 * (g->sig_mask + 1) : 256;
    if (g->sig_used + 1 > SIGNATURES_KEPT) { /* forget them all: each is computed again when asked */
        slots = 256;
        g->sig_used = 0;
        free(g->sigs);
        g->sigs = NULL;
    }
    struct signature *old = g->sigs, *sigs = malloc(slots * sizeof *sigs);
    if (!sigs)
        return 0;
    for (int64_t i = 0; i < slots; i++)
        sigs[i].t = -1;
    int64_t old_slots = old ? g->sig_mask + 1 : 0;
    g->sigs = sigs;
    g->sig_mask = slots - 1;
    for (int64_t j = 0; j < old_slots; j++) {
        if (old[j].t < 0)
            continue;
        gstate_t st = {old[j].t, old[j].s, old[j].d, old[j].q};
        g->sigs[state_slot(g, &st)] = old[j];
    }
    free(old);
    return 1;
}

/* The hash of the normalised mask of st (a state that does not accept), or 0 when out of memory (and *ok = 0). */
static uint64_t signature_of(grammar_t *g, const gstate_t *st, const walk_tables_t *w, int32_t *stack, int *ok)
{
    if (g->sigs) {
        uint64_t i = state_slot(g, st);
        if (g->sigs[i].t >= 0)
            return g->sigs[i].hash;
    }
    if (g->words_cap < w->words) {
        uint32_t *words = realloc(g->words, w->words * sizeof *words);
        if (!words) {
            *ok = 0;
            return 0;
        }
        g->words = words;
        g->words_cap = w->words;
    }
    memset(g->words, 0, w->words * sizeof *g->words);
    int32_t state[4] = {st->t, st->s, st->d, st->q};
    loraplex_span_mask(g, state, w->child_start, w->child_node, w->child_byte, w->token_start, w->token_ids,
                       g->words, stack);
    uint64_t h = 0x243f6a8885a308d3ULL;
    for (int64_t i = 0; i < w->words; i++)
        h = mix((h ^ (g->words[i] & w->kept[i])) + 0x9e3779b97f4a7c15ULL);
    if (!signatures_room(g)) {
        *ok = 0;
        return 0;
    }
    uint64_t i = state_slot(g, st);
    g->sigs[i] = (struct signature){st->t, st->s, st->d, st->q, h};
    g->sig_used++;
    return h;
}

/* A state's mask as the walk compares it: the state, and the bytes whose one-byte tokens the mask holds. Two masks
 * with different bytes differ; two with the same bytes are compared by their signatures, computed only then (a
 * signature is a walk of the vocabulary's trie, which where a grounded string opens reads the whole source). */
typedef struct mask_key {
    gstate_t st;
    uint64_t bytes[4];
} mask_key_t;

static void key_of(grammar_t *g, const gstate_t *st, const walk_tables_t *w, mask_key_t *key, uint8_t allowed[256])
{
    key->st = *st;
    memset(key->bytes, 0, sizeof key->bytes);
    for (int b = 0; b < 256; b++) {
        gstate_t probe = *st;
        allowed[b] = w->usable[b] && step(g, &probe, b);
        key->bytes[b >> 6] |= (uint64_t)allowed[b] << (b & 63);
    }
}

/* Whether the normalised masks of a and b are equal (*ok = 0: out of memory) */
static int same_mask(grammar_t *g, const mask_key_t *a, const mask_key_t *b, const walk_tables_t *w, int32_t *stack,
                     int *ok)
{
    if (a->st.t == b->st.t && a->st.s == b->st.s && a->st.d == b->st.d && a->st.q == b->st.q)
        return 1;
    if (memcmp(a->bytes, b->bytes, sizeof a->bytes) != 0)
        return 0;
    uint64_t x = signature_of(g, &a->st, w, stack, ok);
    return *ok && x == signature_of(g, &b->st, w, stack, ok);
}

static int seen_has(grammar_t *g, int64_t n, const mask_key_t *key, const walk_tables_t *w, int32_t *stack, int *ok)
{
    for (int64_t i = 0; i < n && *ok; i++)
        if (same_mask(g, &g->seen[i], key, w, stack, ok))
            return 1;
    return 0;
}

#define WALK_NONE (-1)         /* the walk found no completion (Python: None) */
#define WALK_OUT_OF_MASKS (-2) /* the walk needed more masks than masks_left (Python: _OutOfMasks) */
#define WALK_NO_MEMORY (-3)

/* Walks greedily from state[4] to a state where the output may end; the bytes go to out (room for max_bytes +
 * forced_limit), their count is returned (or WALK_*). loop_exits: how many searches for a way out of a loop the walk
 * may make (-1: no bound); masks_left: how many masks it may compute (-1: no bound); *masks: how many it computed.
 * stack: the mask walk's scratch (loraplex_span_mask). */
int64_t loraplex_span_greedy(grammar_t *g, const uint8_t *accepting, const int32_t *state, const walk_tables_t *w,
                             int32_t *stack, int64_t loop_exits, int64_t masks_left, uint8_t *out, int64_t *masks)
{
    gstate_t st = {state[0], state[1], state[2], state[3]};
    int64_t n = 0, computed = 0, seen_n = 0;
    int32_t used[256];
    uint8_t allowed[256], child_allowed[256];
    mask_key_t here, last, child;
    int has_last = 0, trapped = 0, ok = 1;
    int64_t result = WALK_NONE;
    memset(used, 0, sizeof used);
    if (g->seen_cap < w->max_bytes + 1) {
        mask_key_t *seen = realloc(g->seen, (w->max_bytes + 1) * sizeof *seen);
        if (!seen)
            return WALK_NO_MEMORY;
        g->seen = seen;
        g->seen_cap = w->max_bytes + 1;
    }
    while (!accepting_at(accepting, &st)) {
        if (n >= w->max_bytes)
            goto done;
        int64_t f = forced_run(g, accepting, st, out + n, w->forced_limit);
        if (f > 0) {
            for (int64_t i = 0; i < f; i++)
                if (w->byte_token[out[n + i]] < 0 || !step(g, &st, out[n + i]))
                    goto done;
            n += f;
            seen_n = 0;
            continue;
        }
        if (masks_left >= 0 && computed >= masks_left) {
            result = WALK_OUT_OF_MASKS;
            goto done;
        }
        computed++;
        key_of(g, &st, w, &here, allowed);
        if (!has_last || !same_mask(g, &here, &last, w, stack, &ok)) { /* repeats count within one run of a mask */
            memset(used, 0, sizeof used);
            trapped = 0;
        }
        last = here;
        has_last = 1;
        int in_seen = seen_has(g, seen_n, &here, w, stack, &ok), b = -1;
        if (!ok)
            goto no_memory;
        if (in_seen && !trapped) { /* looping: the first byte that accepts or reaches an unseen mask, else the first
                                      that leaves this mask (CompletionSearch._leave_loop) */
            if (loop_exits >= 0) {
                if (loop_exits == 0)
                    goto done;
                loop_exits--;
            }
            int other = -1;
            for (int k = 0; k < 256 && b < 0; k++) {
                int c = w->order[k];
                if (!allowed[c])
                    continue;
                gstate_t next = st;
                if (!step(g, &next, c))
                    continue;
                if (masks_left >= 0 && computed >= masks_left) {
                    result = WALK_OUT_OF_MASKS;
                    goto done;
                }
                computed++;
                if (accepting_at(accepting, &next)) {
                    b = c;
                    break;
                }
                key_of(g, &next, w, &child, child_allowed);
                if (!seen_has(g, seen_n, &child, w, stack, &ok))
                    b = c;
                else if (other < 0 && !same_mask(g, &child, &here, w, stack, &ok))
                    other = c;
                if (!ok)
                    goto no_memory;
            }
            if (b < 0)
                b = other;
        }
        trapped = b < 0 && in_seen; /* no way out of this mask yet: not looked for again in this run */
        if (!in_seen)
            g->seen[seen_n++] = here;
        if (b < 0)
            for (int k = 0; k < 256; k++)
                if (allowed[w->order[k]] && used[w->order[k]] < w->repeat) {
                    b = w->order[k];
                    break;
                }
        if (b < 0 || !step(g, &st, b))
            goto done;
        used[b]++;
        out[n++] = (uint8_t)b;
    }
    result = n;
    goto done;
no_memory:
    result = WALK_NO_MEMORY;
done:
    *masks = computed;
    return result;
}
