/* The fewest tokens spelling a byte string (grammar/search.py's CompletionSearch._fewest_tokens without a matcher,
 * which is the reference: tests/grammar/test_span_greedy.py compares them). Dynamic programming over positions, as
 * there: from each reachable position in order, the tokens starting there are found by walking a trie of the
 * vocabulary's byte strings, shortest first, and a token is taken where it makes its end strictly cheaper, so ties
 * go to the same token as in Python.
 *
 * The trie's edges live in one open-addressing table keyed by node * 256 + byte (built in a few milliseconds: the
 * same trie built in Python took half a second, inside the compile worker's first deadline). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t *keys; /* node * 256 + byte, -1: empty */
    int32_t *child;
    int64_t mask;
    int32_t *token; /* [nodes]: the token spelling the bytes that lead to the node, -1: none */
    int64_t nodes;
} split_trie_t;

static inline uint64_t slot_of(const split_trie_t *t, int64_t key)
{
    uint64_t k = (uint64_t)key;
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    uint64_t i = k & (uint64_t)t->mask;
    while (t->keys[i] >= 0 && t->keys[i] != key)
        i = (i + 1) & (uint64_t)t->mask;
    return i;
}

void loraplex_split_trie_free(split_trie_t *t)
{
    if (!t)
        return;
    free(t->keys);
    free(t->child);
    free(t->token);
    free(t);
}

/* The trie of n byte strings: string i is bytes[offsets[i] .. offsets[i + 1]), spelled by token tokens[i] (each
 * string once). NULL when out of memory. */
split_trie_t *loraplex_split_trie_new(const uint8_t *bytes, const int64_t *offsets, const int32_t *tokens, int64_t n)
{
    int64_t total = offsets[n], slots = 64;
    while (slots < 2 * total + 2)
        slots *= 2;
    split_trie_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->keys = malloc(slots * sizeof *t->keys);
    t->child = malloc(slots * sizeof *t->child);
    t->token = malloc((total + 1) * sizeof *t->token);
    if (!t->keys || !t->child || !t->token) {
        loraplex_split_trie_free(t);
        return NULL;
    }
    memset(t->keys, 0xff, slots * sizeof *t->keys);
    t->mask = slots - 1;
    t->token[0] = -1;
    t->nodes = 1;
    for (int64_t i = 0; i < n; i++) {
        int32_t node = 0;
        for (int64_t j = offsets[i]; j < offsets[i + 1]; j++) {
            int64_t key = (int64_t)node * 256 + bytes[j];
            uint64_t s = slot_of(t, key);
            if (t->keys[s] < 0) {
                t->keys[s] = key;
                t->child[s] = (int32_t)t->nodes;
                t->token[t->nodes++] = -1;
            }
            node = t->child[s];
        }
        t->token[node] = tokens[i];
    }
    return t;
}

/* Writes the tokens to out (room for n) and returns how many, or -1 where some position has no way on (a byte
 * without a token) or memory ran out. */
int64_t loraplex_fewest_tokens(const split_trie_t *t, int64_t max_token_bytes, const uint8_t *data, int64_t n,
                               int32_t *out)
{
    int64_t *best = malloc((n + 1) * sizeof *best), *from = malloc((n + 1) * sizeof *from);
    int32_t *token = malloc((n + 1) * sizeof *token);
    int64_t count = -1;
    if (!best || !from || !token)
        goto done;
    best[0] = 0;
    for (int64_t i = 1; i <= n; i++)
        best[i] = n + 1;
    for (int64_t i = 0; i < n; i++) {
        if (best[i] > n)
            continue;
        int32_t node = 0;
        for (int64_t len = 1; len <= max_token_bytes && i + len <= n; len++) {
            int64_t key = (int64_t)node * 256 + data[i + len - 1];
            uint64_t s = slot_of(t, key);
            if (t->keys[s] != key)
                break; /* no token starts with these bytes */
            node = t->child[s];
            if (t->token[node] >= 0 && best[i] + 1 < best[i + len]) {
                best[i + len] = best[i] + 1;
                from[i + len] = i;
                token[i + len] = t->token[node];
            }
        }
    }
    if (best[n] > n)
        goto done;
    count = best[n];
    for (int64_t pos = n, k = count - 1; pos > 0; pos = from[pos], k--)
        out[k] = token[pos];
done:
    free(best);
    free(from);
    free(token);
    return count;
}
