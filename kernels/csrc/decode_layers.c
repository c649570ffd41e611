/* Every decoder layer of one decode step in one call: the per-layer Python loop of engine/model/llama.py
 * (DecoderModel.forward) for a step whose tokens are all single-token decodes, with no LoRA, on quantized
 * projections.
 *
 * Why: at one stream a SmolLM2-135M step is ~270 kernel calls (4 projections, 2 norms, rotary, the KV store,
 * attention and the gated product, for each of 30 layers), most of them a few microseconds of work behind
 * ~10 us of Python and ctypes; this walk makes them from C.
 *
 * Same request, same answer: the walk calls the very functions the Python path calls (their addresses, from
 * the libraries Python loaded: elementwise.c, paged_decode_attention.c, quant_matmul.c), in the same order,
 * with the same arguments and thread count, so a step's bits do not depend on which path ran it. The only
 * work done here is moving rows: the KV store (a copy into each token's cache slot, as store_kv's index_copy_)
 * and, for several rows, q gathered into one contiguous block (as the attention wrapper's .contiguous()).
 *
 * Per layer, with h the residual stream [m, hidden] (updated in place) and delta the previous layer's MLP
 * output (none before the first layer):
 *   x = add_rms_norm(h += delta, input_norm); qkv = x W_qkv^T; [per-head q/k norms]; rope(q and k heads of
 *   qkv); store k, v; a = attention(q); o = a W_o^T; x = add_rms_norm(h += o, post_norm) [sandwich norms:
 *   o = norm(o, post_norm), x = add_rms_norm(h += o, pre_ff_norm)]; gu = x W_gate_up^T;
 *   act = silu(gate) * up [or gelu_tanh(gate) * up]; delta = act W_down^T [then norm(delta, post_ff_norm)]
 * `delta` (the caller's [m, hidden] buffer) holds the last layer's output on return; the caller adds it and
 * applies the final norm, as the Python path does.
 *
 * Layouts: h, delta [m, hidden]; positions int64 [m]; per KV-cache group g (a model whose sliding-window
 * layers keep their own block tables has two; each layer names its group): slots int64 [m] (flat cache slots,
 * all valid: the caller checks), tables int32 [m, max_blocks[g]] and lens int32 [m] as the decode attention
 * kernel takes them (checked by the caller against the cache); every cache [num_blocks, block_size, kv_heads,
 * head_dim].
 * Elements are float32 or bfloat16 (elem_bytes 4 or 2), as the kernels' own variants.
 *
 * Returns 0; 1 when scratch could not be allocated; otherwise the first failing kernel's code: 100 + |code|
 * for attention (102: shapes refused), 200 + code for a matmul, so the caller can name it. A failure fails the
 * step (h is updated in place layer by layer), as a kernel failing on the Python path does.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int (*matmul_fn)(const void *x, int x_bf16, const void *blocks, int qtype, int64_t m, int64_t n,
                         int64_t k, void *y, int64_t ldy, int num_threads);
typedef void (*norm_fn)(void *residual, const void *delta, const void *weight, void *out, int64_t rows,
                        int64_t dim, float eps, int num_threads);
typedef void (*rope_fn)(void *qkv, int64_t rows, int64_t row_stride, int64_t heads, int64_t head_dim,
                        const void *cos_table, const void *sin_table, const int64_t *positions, int num_threads);
typedef void (*silu_mul_fn)(const void *gate_up, void *out, int64_t rows, int64_t inter, int num_threads);
typedef int (*attention_fn)(const void *q, const void *k_cache, const void *v_cache, const int32_t *tables,
                            const int32_t *lens, void *out, int64_t num_seqs, int64_t num_heads,
                            int64_t num_kv_heads, int64_t head_dim, int64_t block_size, int64_t max_blocks,
                            float scale, int64_t window, float softcap, int num_threads);

/* One stacked part of a projection: its rows land in columns [col, col + n) of the output. */
typedef struct {
    matmul_fn fn;
    const void *blocks;
    int64_t qtype, n, col;
} dl_part;

typedef struct {
    const dl_part *parts;
    int64_t num_parts, out_features;
} dl_projection;

typedef struct {
    const void *input_norm, *post_norm, *cos_table, *sin_table;
    /* NULL where the family has none: per-head q/k norms (Qwen3, Gemma 3), sandwich norms (Gemma 2 / 3: the
     * attention output normed by post_norm, then pre_ff_norm before the MLP, post_ff_norm after it) */
    const void *q_norm, *k_norm, *pre_ff_norm, *post_ff_norm;
    void *k_cache, *v_cache;
    dl_projection qkv, o, gate_up, down;
    int64_t window;   /* 0: full attention */
    int64_t kv_group; /* which of the step's slot / table / length arrays this layer's cache uses */
} dl_layer;

typedef struct {
    norm_fn norm;
    rope_fn rope;
    silu_mul_fn gated; /* silu_mul, or gelu_tanh_mul for GeGLU: the model's MLP activation */
    attention_fn attention;
    const dl_layer *layers;
    int64_t num_layers, hidden, q_size, kv_size, num_heads, num_kv_heads, head_dim, inter, block_size;
    int64_t elem_bytes, bf16;
    float eps, scale, softcap;
} dl_model;

static int project(const dl_projection *p, const void *x, int bf16, int64_t m, int64_t k, char *y,
                   int64_t elem_bytes, int num_threads)
{
    for (int64_t i = 0; i < p->num_parts; ++i) {
        const dl_part *part = &p->parts[i];
        const int rc = part->fn(x, bf16, part->blocks, (int)part->qtype, m, part->n, k, y + part->col * elem_bytes,
                                p->out_features, num_threads);
        if (rc != 0) return 200 + rc;
    }
    return 0;
}

int loraplex_decode_layers(const dl_model *model, void *h, void *delta, const int64_t *positions,
                           const int64_t *const *group_slots, const int32_t *const *group_tables,
                           const int32_t *const *group_lens, const int64_t *group_max_blocks, int64_t m,
                           int num_threads)
{
    const int64_t eb = model->elem_bytes, hidden = model->hidden, q_size = model->q_size;
    const int64_t kv_size = model->kv_size, inter = model->inter;
    const int64_t qkv_width = q_size + 2 * kv_size;
    const int bf16 = (int)model->bf16;
    /* scratch: x [m, hidden], qkv [m, qkv_width], q [m, q_size] (several rows, or q/k norms), a [m, q_size],
     * o and o2 [m, hidden] (o2: the normed attention output, or the MLP output before its norm), gu [m, 2 inter],
     * act [m, inter] */
    const int64_t floats = m * (3 * hidden + qkv_width + 2 * q_size + 3 * inter);
    char *scratch = malloc((size_t)(floats * eb));
    if (scratch == NULL) return 1;
    char *x = scratch, *qkv = x + m * hidden * eb, *q = qkv + m * qkv_width * eb, *a = q + m * q_size * eb;
    char *o = a + m * q_size * eb, *o2 = o + m * hidden * eb, *gu = o2 + m * hidden * eb;
    char *act = gu + m * 2 * inter * eb;
    const int64_t d = model->head_dim;
    int rc = 0;
    for (int64_t l = 0; l < model->num_layers && rc == 0; ++l) {
        const dl_layer *layer = &model->layers[l];
        const int64_t g = layer->kv_group;
        const int64_t *slots = group_slots[g];
        model->norm(h, l == 0 ? NULL : delta, layer->input_norm, x, m, hidden, model->eps, num_threads);
        if ((rc = project(&layer->qkv, x, bf16, m, hidden, qkv, eb, num_threads)) != 0) break;
        if (layer->q_norm != NULL) {
            /* each head's row normed (as the Python path's [m * heads, head_dim] copies), written back */
            for (int64_t r = 0; r < m; ++r) {
                char *row = qkv + r * qkv_width * eb;
                model->norm(row, NULL, layer->q_norm, q, model->num_heads, d, model->eps, num_threads);
                memcpy(row, q, (size_t)(q_size * eb));
                model->norm(row + q_size * eb, NULL, layer->k_norm, q, model->num_kv_heads, d, model->eps,
                            num_threads);
                memcpy(row + q_size * eb, q, (size_t)(kv_size * eb));
            }
        }
        model->rope(qkv, m, qkv_width, model->num_heads + model->num_kv_heads, model->head_dim, layer->cos_table,
                    layer->sin_table, positions, num_threads);
        for (int64_t r = 0; r < m; ++r) {
            const char *row = qkv + r * qkv_width * eb;
            memcpy((char *)layer->k_cache + slots[r] * kv_size * eb, row + q_size * eb, (size_t)(kv_size * eb));
            memcpy((char *)layer->v_cache + slots[r] * kv_size * eb, row + (q_size + kv_size) * eb,
                   (size_t)(kv_size * eb));
        }
        const char *q_rows = qkv; /* one row: q is already contiguous at the front of it */
        if (m > 1) {
            for (int64_t r = 0; r < m; ++r)
                memcpy(q + r * q_size * eb, qkv + r * qkv_width * eb, (size_t)(q_size * eb));
            q_rows = q;
        }
        rc = model->attention(q_rows, layer->k_cache, layer->v_cache, group_tables[g], group_lens[g], a, m,
                              model->num_heads, model->num_kv_heads, model->head_dim, model->block_size,
                              group_max_blocks[g], model->scale, layer->window, model->softcap, num_threads);
        if (rc != 0) {
            rc = 100 + (rc < 0 ? -rc : rc);
            break;
        }
        if ((rc = project(&layer->o, a, bf16, m, q_size, o, eb, num_threads)) != 0) break;
        if (layer->pre_ff_norm != NULL) {
            model->norm(o, NULL, layer->post_norm, o2, m, hidden, model->eps, num_threads);
            model->norm(h, o2, layer->pre_ff_norm, x, m, hidden, model->eps, num_threads);
        } else {
            model->norm(h, o, layer->post_norm, x, m, hidden, model->eps, num_threads);
        }
        if ((rc = project(&layer->gate_up, x, bf16, m, hidden, gu, eb, num_threads)) != 0) break;
        model->gated(gu, act, m, inter, num_threads);
        if (layer->post_ff_norm == NULL) {
            rc = project(&layer->down, act, bf16, m, inter, delta, eb, num_threads);
        } else if ((rc = project(&layer->down, act, bf16, m, inter, o2, eb, num_threads)) == 0) {
            model->norm(o2, NULL, layer->post_ff_norm, delta, m, hidden, model->eps, num_threads);
        }
    }
    free(scratch);
    return rc;
}
