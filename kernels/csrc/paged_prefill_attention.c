/* Paged causal attention for prefill chunks on the CPU, float32 or bfloat16 (q, caches and out of one
 * type; scores, softmax and sums in float32, the output rounded once).
 *
 * A chunk's queries attend to everything cached before them plus the chunk itself, causally. The keys
 * and values are read straight from the paged cache (this step's K/V already stored), so a chunk that
 * continues a cached prefix costs the same as one that starts at position 0: no gathered copy of its
 * blocks, no [queries x keys] mask tensor, no padding to the batch's longest chunk, and key tiles past
 * a query tile's last position are never visited (the masked path computed the whole rectangle).
 *
 * Work is split into tasks of (sequence, kv head, tile of QT query tokens): the tile's rows are its
 * tokens times the GQA group's query heads (~32 rows), which share every key and value row read. Per
 * key tile of up to KT tokens (flash-attention style, online softmax):
 *   scores  two query rows against four key rows at a time, eight 8-wide partial sums reduced by the
 *           shuffle tree of reduce8 (each key vector loaded once for both rows);
 *   mask    keys past a row's own position get -inf (only on the tile at the diagonal);
 *   softmax running maximum and denominator per row, accumulators rescaled when the maximum grows;
 *   values  one row at a time, up to PV_STRIP of its vectors (all of a 64-wide head) in registers
 *           over the tile.
 * The blocking keeps every loop's accumulators and operands within AVX2's sixteen vector registers:
 * larger blocks (4 rows x 4 vectors of values, 2 x 8 keys of scores) spill (bench/README.md).
 *
 * Layout (as kernels/attention.py documents it):
 *   q       [num_tokens, num_heads, head_dim], token rows q_stride floats apart, heads contiguous
 *   out     [num_tokens, num_heads, head_dim] contiguous; rows of skipped sequences are not written
 *   k/v_cache [num_blocks, block_size, num_kv_heads, head_dim]; block_tables [num_seqs, max_blocks]
 *   seq_lens [num_seqs] (context incl. the chunk); query_start_loc [num_seqs + 1]
 * Sliding window (window > 0): the query at position p sees keys p - window + 1 .. p; key tiles before the
 * task's first visible key are never read, and lanes before a row's first key are masked like those past
 * its last. Soft-capping (softcap > 0): scores become softcap * tanh(score / softcap) before the mask.
 * Sequences with fewer than min_q_len query rows are skipped (the engine gives decodes to the decode
 * kernel). head_dim a multiple of 8; the caller checks shapes and that every table entry read lies
 * inside the cache.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_common.h"
#include "bf16.h"
#include "vec8.h"

#define KT 16         /* keys per softmax tile (two reductions of 8) */
#define TARGET_ROWS 32 /* query rows (tokens x group) per task */
#define MAX_GROUP 64  /* largest GQA group taken (one token per task then) */
#define PV_STRIP 8    /* value vectors of a row kept in registers across a tile */

#define ELEMENT_BODY "paged_prefill_attention_impl.h"
#include "each_element_type.h"
