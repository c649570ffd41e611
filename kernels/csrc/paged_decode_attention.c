/* Paged attention for single-token decodes on the CPU, float32 or bfloat16 (q, caches and out of one type;
 * scores, softmax and sums in float32, the output rounded once).
 *
 * One task per sequence: it walks the sequence's blocks through the block table and reads the keys and
 * values straight from the paged cache (no gathered copy), in tiles of up to 16 tokens with an online
 * softmax (flash-decoding style), so every cache row is read exactly once per step and nothing but a
 * few vectors of scratch is written.
 *
 * Per tile, for the `group` query heads sharing the kv head:
 *   scores  each key row is multiplied into one 8-wide partial sum per query head; eight such partial
 *           sums are reduced together by a shuffle tree (7 adds for 8 scores rather than a horizontal
 *           sum per score);
 *   softmax running maximum and denominator per query head, rescaling the accumulators only when the
 *           maximum grows;
 *   values  in strips of PV_STRIP vectors whose accumulators (for every query head of the group) stay in
 *           registers over the tile: each value vector is loaded once for the whole group.
 * A sequence's kv heads are done one after the other inside each tile, so a block's key rows and then
 * its value rows are read front to back, and the next block is prefetched into L2 while this one is
 * worked on (software prefetch, spread a few lines per token: without it the loads and the arithmetic
 * hardly overlap; the figures are in bench/README.md).
 *
 * Layout (as kernels/attention.py documents it):
 *   q, out        [num_seqs, num_heads, head_dim]
 *   k/v_cache     [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables  [num_seqs, max_blocks] int32; seq_lens [num_seqs] int32 (context incl. the query)
 * All contiguous; head_dim a multiple of 8; the caller checks shapes and that every table entry read
 * lies inside the cache. Query heads h*group .. h*group+group-1 share kv head h.
 *
 * Sliding window: with window > 0 the query (at position len - 1) sees only the last `window` keys, and
 * the walk starts at the first of them (earlier blocks are never read). Soft-capping (Gemma 2): with
 * softcap > 0 every score becomes softcap * tanh(score / softcap) before the softmax.
 *
 * Vectors are the 8-float vectors of vec8.h. The GQA group (1..8) and head_dim (64, 128) are
 * compile-time constants in the specialised bodies (attention_common.h), so the accumulators are fixed-size
 * arrays the compiler keeps in registers; other shapes take the generic body.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_common.h"
#include "bf16.h"
#include "vec8.h"

#define TILE 16      /* tokens per softmax tile (two reductions of 8) */
#define MAX_GROUP 64 /* largest GQA group the generic body takes */
#define PV_STRIP 4   /* value vectors whose accumulators stay in registers across a tile */

#define ELEMENT_BODY "paged_decode_attention_impl.h"
#include "each_element_type.h"
