/* Dispatch to an attention body with the GQA group and head_dim as compile-time constants.
 *
 * The bodies are always_inline functions whose per-row arrays are sized by (group, head_dim); with both
 * known at compile time the compiler keeps them in registers and unrolls the vector loops. The caller
 * defines ATTEND(G, D) as the call of its body and writes LORAPLEX_SPECIALISED(group, head_dim): groups
 * 1-8 with heads of 64 or 128 get their own copy, any other shape the generic one. */
#ifndef LORAPLEX_SPECIALISE_H
#define LORAPLEX_SPECIALISE_H

#define LORAPLEX_BY_GROUP(group, D)                                                                           \
    switch (group) {                                                                                          \
    case 1: ATTEND(1, D); break;                                                                              \
    case 2: ATTEND(2, D); break;                                                                              \
    case 3: ATTEND(3, D); break;                                                                              \
    case 4: ATTEND(4, D); break;                                                                              \
    case 5: ATTEND(5, D); break;                                                                              \
    case 6: ATTEND(6, D); break;                                                                              \
    case 7: ATTEND(7, D); break;                                                                              \
    case 8: ATTEND(8, D); break;                                                                              \
    default: ATTEND(group, D); break;                                                                         \
    }

#define LORAPLEX_SPECIALISED(group, head_dim)                                                                 \
    if ((head_dim) == 64) {                                                                                   \
        LORAPLEX_BY_GROUP(group, 64)                                                                          \
    } else if ((head_dim) == 128) {                                                                           \
        LORAPLEX_BY_GROUP(group, 128)                                                                         \
    } else {                                                                                                  \
        ATTEND(group, head_dim);                                                                              \
    }

#endif
