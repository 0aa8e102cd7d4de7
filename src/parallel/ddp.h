/* Distributed data parallelism (PyTorch DDP's design): every rank holds the
 * whole model; gradients are grouped into buckets of contiguous segments in
 * the order backward finishes them (last layer first), and each bucket's
 * all-reduce (a sum of shares each rank weighed by 1 / the ranks' tokens,
 * dt_strategy.grad_ranks: the mean) starts on the communicator's progress
 * thread as soon as its last segment is final, while backward goes on. The
 * optimizer then runs replicated on identical averaged gradients. */
#ifndef DT_PARALLEL_DDP_H
#define DT_PARALLEL_DDP_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"
#include "model/gpt.h"
#include "model/ranges.h"
#include "parallel/wire.h"

typedef struct {
    size_t lo, hi;      /* floats of the flat gradient buffer */
    int segments;       /* segments it holds */
    int ready;          /* of those, final in this backward */
    dt_request *req;    /* in flight, or NULL */
    dt_wire wire;       /* what is being reduced: the bucket, or its copy in the wire's type */
    /* When the progress thread started and finished its all-reduce, as read
     * right after backward ended (0: not yet then); start_ns != 0 means
     * the bucket's communication overlapped backward. */
    uint64_t start_ns, end_ns;
} dt_ddp_bucket;

typedef struct {
    dt_comm *comm;
    dt_gpt *model;
    int nbuckets;
    dt_ddp_bucket *buckets; /* in launch order: buckets[0] holds the last layers */
    const dt_flat_ranges *held; /* the parts of the model this rank holds; NULL: all */
    int communicate;        /* this backward reduces (the last micro-batch of a step) */
    int step_open;          /* a backward of this step reduced: dt_ddp_finish waits */
    dt_dtype wire;          /* gradients travel as DT_F32 (dt_ddp_init's) or DT_BF16 (wire.h) */
    int error;              /* first failure of a launch inside backward */
    /* Measured over the last step. */
    double wait_ms;         /* time blocked in dt_ddp_finish: communication not hidden */
    uint64_t bytes_sent;    /* payload this rank sent */
    uint64_t backward_end_ns;
} dt_ddp;

/* Buckets of about bucket_bytes each over m's segments, hooked into m's
 * backward; only over the segments inside `held` when it is given (a
 * pipeline stage's), a bucket never spanning a gap between them. 0, or a
 * negative DT_ERR_* code. */
int dt_ddp_init(dt_ddp *d, dt_comm *c, dt_gpt *m, size_t bucket_bytes,
                const dt_flat_ranges *held);
void dt_ddp_free(dt_ddp *d);

/* Before each backward: whether it reduces (only the last micro-batch of an
 * optimizer step does; the others accumulate locally, as no_sync() does).
 * Several backwards of a step may reduce, each the last of its segments (a
 * pipeline rank with several model chunks): a bucket goes once all its
 * segments were final in a reducing backward. */
void dt_ddp_begin_backward(dt_ddp *d, int communicate);
/* After backward: waits for every bucket. The gradients are then the mean
 * over ranks, bit-identical everywhere. 0 or a negative DT_ERR_* code. */
int dt_ddp_finish(dt_ddp *d);

/* Rank 0's parameters (the held ranges) to every rank. */
int dt_ddp_broadcast_params(dt_ddp *d);
/* Whether every rank holds bit-identical parameters: 1 yes, 0 no, < 0 error. */
int dt_ddp_replicas_identical(dt_ddp *d, uint64_t *hash_out);

#endif
