/* How a context-parallel attention call splits its sequences: the group,
 * the sizes every rank passes alike, and this rank's positions. Ring
 * attention and Ulysses both start from one (ring_attention.h,
 * ulysses.h). */
#ifndef DT_PARALLEL_SEQ_SPLIT_H
#define DT_PARALLEL_SEQ_SPLIT_H

#include <stddef.h>

#include "dtrain/comm.h"
#include "kernels/attention_ring.h"

typedef struct {
    dt_comm *comm;
    int rank, nranks;
    int B, T, C, NH;
    dt_shard_kind kind;
    int Tl;           /* rows per sequence on every rank: T / N */
    dt_seq_rows mine; /* this rank's positions */
} dt_seq_split;

/* Checks the sizes (dt_seq_shard_check, its message begun with `who`) and
 * fills s; no communication. 0, or -1 with err. */
int dt_seq_split_init(dt_seq_split *s, const char *who, dt_comm *cp, int B, int T, int C, int NH,
                      dt_shard_kind kind, char *err, size_t errlen);

#endif
