/* Every decoder layer of one decode step in one call: the per-layer Python loop of engine/model/llama.py
 * (DecoderModel.forward) for a step whose tokens are all single-token decodes, with no LoRA, on quantized
 * projections.
 *
 * Why: at one stream a SmolLM2-135M step is ~270 kernel calls (4 projections, 2 norms, rotary, the KV store,
 * attention and the gated product, for each of 30 layers), most of them a few microseconds of work behind
 * ~10 us of Python and ctypes; this walk makes them from C.
 *
 * Same request, same answer: the walk calls the very functions the Python path calls (their addresses, from
 * the libraries Python loaded: elementwise.c, paged_decode_attention.c, quant_matmul.c), in the same order, on
 * the same data, so a step's bits do not depend on which path ran it. The only work done here is moving rows:
 * the KV store (a copy into each token's cache slot, as store_kv's index_copy_) and, for several rows, q
 * gathered into one contiguous block (as the attention wrapper's .contiguous()). Below TEAM_MAX_M rows the
 * step runs as one OpenMP team that splits each projection into whole 32-row panels and attention by sequence
 * (every output element is still one call's arithmetic on one thread: the kernels' own split is by rows and
 * panels too); from it, each call gets all the threads, as from Python.
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
#include <omp.h>
#include <sched.h>
#include <stdatomic.h>
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
    int64_t qtype, n, col, row_bytes; /* row_bytes: bytes of one weight row (a panel of 16 is 16 rows' bytes) */
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

/* A barrier the walk's team spins at: the gaps it waits through are the microseconds of one thread's serial
 * steps (norms, rotary, the KV store, one sequence's attention), where libgomp's team, at the engine's
 * GOMP_SPINCOUNT of 1,000, would have gone to sleep and been woken by the kernel (tens of microseconds, 4-8 times
 * a layer). Past SPIN_LIMIT pauses a waiting thread yields its core at every check instead (a neighbour process
 * holding our other core gets it back: loraplex/engine/openmp.py says why that matters). */
#define SPIN_LIMIT 4000

#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

typedef struct {
    _Atomic int arrived, phase;
} spin_barrier;

static void barrier_wait(spin_barrier *b, int team)
{
    if (team < 2) return;
    const int phase = atomic_load_explicit(&b->phase, memory_order_acquire);
    if (atomic_fetch_add_explicit(&b->arrived, 1, memory_order_acq_rel) == team - 1) {
        atomic_store_explicit(&b->arrived, 0, memory_order_relaxed);
        atomic_store_explicit(&b->phase, phase + 1, memory_order_release);
        return;
    }
    for (int spins = 0; atomic_load_explicit(&b->phase, memory_order_acquire) == phase;)
        if (++spins < SPIN_LIMIT)
            cpu_relax();
        else
            sched_yield();
}

/* One step's walk: the model, the step's arrays and the scratch rows, shared by the team. */
typedef struct {
    const dl_model *model;
    char *h, *delta;
    const int64_t *positions;
    const int64_t *const *group_slots;
    const int32_t *const *group_tables;
    const int32_t *const *group_lens;
    const int64_t *group_max_blocks;
    int64_t m;
    char *x, *qkv, *q, *a, *o, *o2, *gu, *act;
    int kernel_threads; /* each kernel call's thread count: all of them (one caller), or 1 (the team splits) */
    spin_barrier barrier;
    _Atomic int rc;
} walk_state;

/* This thread's share of y = x W^T: per part, whole panels of PANEL_ROWS weight rows (the kernels' unit of work,
 * so every output element is computed by the same code on the same data as in one call over all rows). */
#define PANEL_ROWS 32

static int project(const dl_projection *p, const void *x, int bf16, int64_t m, int64_t k, char *y,
                   int64_t elem_bytes, int tid, int team, int kernel_threads)
{
    for (int64_t i = 0; i < p->num_parts; ++i) {
        const dl_part *part = &p->parts[i];
        const int64_t panels = (part->n + PANEL_ROWS - 1) / PANEL_ROWS;
        const int64_t lo = panels * tid / team * PANEL_ROWS;
        int64_t hi = panels * (tid + 1) / team * PANEL_ROWS;
        if (hi > part->n) hi = part->n;
        if (hi <= lo) continue;
        const int rc = part->fn(x, bf16, (const char *)part->blocks + lo * part->row_bytes, (int)part->qtype, m,
                                hi - lo, k, y + (part->col + lo) * elem_bytes, p->out_features, kernel_threads);
        if (rc != 0) return 200 + rc;
    }
    return 0;
}

/* The layers, run by thread tid of a team of `team` (1: the caller alone, each kernel with all the threads).
 * Serial steps run on thread 0; projections split by panels, attention by sequences; a barrier between steps.
 * A failure is published before the barrier, so every thread leaves at the same point. */
static void walk_layers(walk_state *w, int tid, int team)
{
    const dl_model *model = w->model;
    const int64_t eb = model->elem_bytes, hidden = model->hidden, q_size = model->q_size, m = w->m;
    const int64_t kv_size = model->kv_size, inter = model->inter, d = model->head_dim;
    const int64_t qkv_width = q_size + 2 * kv_size;
    const int bf16 = (int)model->bf16, kt = w->kernel_threads;
    const float eps = model->eps;
    char *x = w->x, *qkv = w->qkv, *q = w->q, *a = w->a, *o = w->o, *o2 = w->o2, *gu = w->gu, *act = w->act;
#define STEP_DONE(rc_expr)                                                            \
    do {                                                                              \
        const int rc_ = (rc_expr);                                                    \
        if (rc_ != 0) atomic_store_explicit(&w->rc, rc_, memory_order_relaxed);       \
        barrier_wait(&w->barrier, team);                                              \
        if (atomic_load_explicit(&w->rc, memory_order_relaxed) != 0) return;          \
    } while (0)
    for (int64_t l = 0; l < model->num_layers; ++l) {
        const dl_layer *layer = &model->layers[l];
        const int64_t g = layer->kv_group, max_blocks = w->group_max_blocks[g];
        if (tid == 0) model->norm(w->h, l == 0 ? NULL : w->delta, layer->input_norm, x, m, hidden, eps, kt);
        STEP_DONE(0);
        STEP_DONE(project(&layer->qkv, x, bf16, m, hidden, qkv, eb, tid, team, kt));
        const char *q_rows = qkv; /* one row: q is already contiguous at the front of it */
        if (m > 1) q_rows = q;
        if (tid == 0) {
            if (layer->q_norm != NULL) {
                /* each head's row normed (as the Python path's [m * heads, head_dim] copies), written back */
                for (int64_t r = 0; r < m; ++r) {
                    char *row = qkv + r * qkv_width * eb;
                    model->norm(row, NULL, layer->q_norm, a, model->num_heads, d, eps, kt);
                    memcpy(row, a, (size_t)(q_size * eb));
                    model->norm(row + q_size * eb, NULL, layer->k_norm, a, model->num_kv_heads, d, eps, kt);
                    memcpy(row + q_size * eb, a, (size_t)(kv_size * eb));
                }
            }
            model->rope(qkv, m, qkv_width, model->num_heads + model->num_kv_heads, d, layer->cos_table,
                        layer->sin_table, w->positions, kt);
            const int64_t *slots = w->group_slots[g];
            for (int64_t r = 0; r < m; ++r) {
                const char *row = qkv + r * qkv_width * eb;
                memcpy((char *)layer->k_cache + slots[r] * kv_size * eb, row + q_size * eb, (size_t)(kv_size * eb));
                memcpy((char *)layer->v_cache + slots[r] * kv_size * eb, row + (q_size + kv_size) * eb,
                       (size_t)(kv_size * eb));
                if (m > 1) memcpy(q + r * q_size * eb, row, (size_t)(q_size * eb));
            }
        }
        STEP_DONE(0);
        const int64_t s0 = m * tid / team, s1 = m * (tid + 1) / team; /* this thread's sequences */
        int rc = 0;
        if (s1 > s0) {
            rc = model->attention(q_rows + s0 * q_size * eb, layer->k_cache, layer->v_cache,
                                  w->group_tables[g] + s0 * max_blocks, w->group_lens[g] + s0, a + s0 * q_size * eb,
                                  s1 - s0, model->num_heads, model->num_kv_heads, d, model->block_size, max_blocks,
                                  model->scale, layer->window, model->softcap, kt);
            if (rc != 0) rc = 100 + (rc < 0 ? -rc : rc);
        }
        STEP_DONE(rc);
        STEP_DONE(project(&layer->o, a, bf16, m, q_size, o, eb, tid, team, kt));
        if (tid == 0) {
            if (layer->pre_ff_norm != NULL) {
                model->norm(o, NULL, layer->post_norm, o2, m, hidden, eps, kt);
                model->norm(w->h, o2, layer->pre_ff_norm, x, m, hidden, eps, kt);
            } else {
                model->norm(w->h, o, layer->post_norm, x, m, hidden, eps, kt);
            }
        }
        STEP_DONE(0);
        STEP_DONE(project(&layer->gate_up, x, bf16, m, hidden, gu, eb, tid, team, kt));
        if (tid == 0) model->gated(gu, act, m, inter, kt);
        STEP_DONE(0);
        char *down_out = layer->post_ff_norm == NULL ? w->delta : o2;
        STEP_DONE(project(&layer->down, act, bf16, m, inter, down_out, eb, tid, team, kt));
        if (tid == 0 && layer->post_ff_norm != NULL)
            model->norm(o2, NULL, layer->post_ff_norm, w->delta, m, hidden, eps, kt);
    }
#undef STEP_DONE
}

/* Up to this many rows a step runs as one team (its per-call thread wake-ups dominate at one row); from it, each
 * kernel call runs with all the threads, as from Python (larger calls, whose own thread split is tuned). */
#define TEAM_MAX_M 8

int loraplex_decode_layers(const dl_model *model, void *h, void *delta, const int64_t *positions,
                           const int64_t *const *group_slots, const int32_t *const *group_tables,
                           const int32_t *const *group_lens, const int64_t *group_max_blocks, int64_t m,
                           int num_threads)
{
    const int64_t eb = model->elem_bytes, hidden = model->hidden, q_size = model->q_size;
    const int64_t qkv_width = q_size + 2 * model->kv_size, inter = model->inter;
    /* scratch: x [m, hidden], qkv [m, qkv_width], q [m, q_size] (several rows), a [m, q_size] (also the q/k
     * norms' rows), o and o2 [m, hidden] (o2: the normed attention output, or the MLP output before its norm),
     * gu [m, 2 inter], act [m, inter] */
    const int64_t floats = m * (3 * hidden + qkv_width + 2 * q_size + 3 * inter);
    char *scratch = malloc((size_t)(floats * eb));
    if (scratch == NULL) return 1;
    walk_state w = {
        .model = model,
        .h = h,
        .delta = delta,
        .positions = positions,
        .group_slots = group_slots,
        .group_tables = group_tables,
        .group_lens = group_lens,
        .group_max_blocks = group_max_blocks,
        .m = m,
    };
    w.x = scratch;
    w.qkv = w.x + m * hidden * eb;
    w.q = w.qkv + m * qkv_width * eb;
    w.a = w.q + m * q_size * eb;
    w.o = w.a + m * q_size * eb;
    w.o2 = w.o + m * hidden * eb;
    w.gu = w.o2 + m * hidden * eb;
    w.act = w.gu + m * 2 * inter * eb;
    atomic_init(&w.barrier.arrived, 0);
    atomic_init(&w.barrier.phase, 0);
    atomic_init(&w.rc, 0);
    if (num_threads > 1 && m < TEAM_MAX_M) {
        w.kernel_threads = 1;
#pragma omp parallel num_threads(num_threads)
        walk_layers(&w, omp_get_thread_num(), omp_get_num_threads());
    } else {
        w.kernel_threads = num_threads;
        walk_layers(&w, 0, 1);
    }
    free(scratch);
    return atomic_load(&w.rc);
}
