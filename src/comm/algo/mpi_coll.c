/*
 * MPI's own collectives as dtrain algorithms ("mpi" in the table, forced
 * with DTRAIN_<COLLECTIVE>_ALGO=mpi or dt_comm_set_algo): the call goes to
 * the MPI library on the communicator's MPI communicator, with the buffers
 * collectives.c placed (see algorithms.h).
 *
 * The blocking forms are called: they are what MPI programs use and what
 * MPI tunes (its non-blocking twins take other, slower code paths), so
 * this is MPI's own figure. A blocking MPI call cannot be interrupted, so
 * while one runs, a job abort (a peer lost, stopped or failed, seen by the
 * store's monitor) ends the job through MPI_Abort instead of a return:
 * MPI's own way, and never a hang. bf16 and f16 reduce through user ops that compute in
 * fp32 (dt_reduce_elems), like every other dtrain algorithm; DT_AVG is
 * reduced as a sum and divided by collectives.c.
 *
 * These calls carry no dtrain message header: ranks that disagree on the
 * call are MPI's to catch (often an error, not always).
 */
#include "comm/algo/algorithms.h"
#include "comm/mpi.h"

#ifndef DTRAIN_HAVE_MPI

int dt_have_mpi(void) { return 0; }
void dt_mpi_abort_if_blocked(const char *why) { (void)why; }

#define NO_MPI(fn)                                                                   \
    int fn(dt_comm *c, const void *send, void *recv, size_t n, int root)             \
    {                                                                                \
        (void)send, (void)recv, (void)n, (void)root;                                 \
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "dtrain was built without MPI"); \
    }
NO_MPI(dt_allreduce_mpi)
NO_MPI(dt_broadcast_mpi)
NO_MPI(dt_allgather_mpi)
NO_MPI(dt_reduce_scatter_mpi)
NO_MPI(dt_alltoall_mpi)
NO_MPI(dt_alltoallv_mpi)

#else /* DTRAIN_HAVE_MPI */

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/reduce_ops.h"
#include "core/timer.h"

int dt_have_mpi(void) { return 1; }

/* The most elements (or bytes) one MPI call takes: its counts are ints.
 * (A test build lowers it to exercise the paths for larger calls.) */
#ifndef DT_MPI_COUNT_MAX
#define DT_MPI_COUNT_MAX INT_MAX
#endif

/* ---- bf16 and f16 reductions -------------------------------------------------- */

/* MPI's user-function contract: inout[i] = in[i] op inout[i]. */
#define HALF_FN(name, T, OP)                                                 \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type)    \
    {                                                                        \
        (void)type;                                                          \
        dt_reduce_elems(T, OP, inout, in, inout, (size_t)*len);              \
    }
HALF_FN(bf16_sum, DT_BF16, DT_SUM)
HALF_FN(bf16_max, DT_BF16, DT_MAX)
HALF_FN(bf16_min, DT_BF16, DT_MIN)
HALF_FN(bf16_prod, DT_BF16, DT_PROD)
HALF_FN(f16_sum, DT_F16, DT_SUM)
HALF_FN(f16_max, DT_F16, DT_MAX)
HALF_FN(f16_min, DT_F16, DT_MIN)
HALF_FN(f16_prod, DT_F16, DT_PROD)

/* [bf16, f16][sum, max, min, prod] */
static MPI_User_function *const half_fns[2][4] = {{bf16_sum, bf16_max, bf16_min, bf16_prod},
                                                  {f16_sum, f16_max, f16_min, f16_prod}};
static MPI_Op half_ops[2][4];
static int half_ops_made;

int dt_mpi_ops_create(void)
{
    if (half_ops_made) return 0;
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 4; o++)
            if (MPI_Op_create(half_fns[t][o], 1, &half_ops[t][o]) != MPI_SUCCESS) return -1;
    half_ops_made = 1;
    return 0;
}

void dt_mpi_ops_free(void)
{
    if (!half_ops_made) return;
    for (int t = 0; t < 2; t++)
        for (int o = 0; o < 4; o++) MPI_Op_free(&half_ops[t][o]);
    half_ops_made = 0;
}

static int op_index(dt_op op)
{
    switch (op) {
    case DT_SUM:
    case DT_AVG: return 0; /* collectives.c divides afterwards */
    case DT_MAX: return 1;
    case DT_MIN: return 2;
    case DT_PROD: return 3;
    case DT_BAND: return 4;
    case DT_BOR: return 5;
    case DT_BXOR: return 6;
    default: return -1;
    }
}

/* The MPI datatype and op of the current call. */
static int type_and_op(dt_comm *c, MPI_Datatype *t, MPI_Op *op)
{
    static const MPI_Op builtin[7] = {MPI_SUM, MPI_MAX, MPI_MIN, MPI_PROD,
                                      MPI_BAND, MPI_BOR, MPI_BXOR};
    int o = op_index(c->cur.op);
    if (o < 0) return dt_comm_fail(c, DT_ERR_INVALID, -1, "op %d has no MPI form", (int)c->cur.op);
    *op = builtin[o];
    switch (c->cur.dtype) {
    case DT_F32: *t = MPI_FLOAT; return 0;
    case DT_F64: *t = MPI_DOUBLE; return 0;
    case DT_I32: *t = MPI_INT32_T; return 0;
    case DT_I64: *t = MPI_INT64_T; return 0;
    case DT_U8: *t = MPI_UINT8_T; return 0;
    case DT_BF16:
    case DT_F16:
        *t = MPI_UINT16_T;
        if (o >= 4) return dt_comm_fail(c, DT_ERR_INVALID, -1, "no bitwise op on half types");
        *op = half_ops[c->cur.dtype == DT_F16][o];
        return half_ops_made ? 0 : dt_comm_fail(c, DT_ERR_INVALID, -1, "no MPI op for %s",
                                                dt_dtype_name(c->cur.dtype));
    default:
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "dtype %d has no MPI form", (int)c->cur.dtype);
    }
}

/* ---- calling MPI ------------------------------------------------------------- */

/* c's MPI communicator; its ranks must be c's (see mpi.h). */
static int comm_of(dt_comm *c, MPI_Comm *m)
{
    if (!c->mpi)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "%s algorithm 'mpi' needs ranks started by "
                            "mpirun", dt_coll_name(c->cur.kind));
    *m = dt_mpi_comm(c);
    return 0;
}

/* Blocking MPI calls in flight in this process (dt_mpi_abort_if_blocked). */
static _Atomic int blocking_calls;

void dt_mpi_abort_if_blocked(const char *why)
{
    if (atomic_load(&blocking_calls) == 0) return;
    fprintf(stderr, "dtrain: %s; a blocking MPI collective cannot be interrupted, so the job "
            "ends by MPI_Abort\n", why);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Around each blocking call: counted in flight (an abort from here on
 * ends the job by MPI_Abort), and not started at all once the job has
 * aborted. */
static int enter_blocking(dt_comm *c)
{
    atomic_fetch_add(&blocking_calls, 1);
    if (!atomic_load(&c->job->aborted)) return 0;
    atomic_fetch_sub(&blocking_calls, 1);
    return dt_comm_fail_from_abort(c, "");
}

static int leave_blocking(dt_comm *c, int mpi_rc, const char *what)
{
    atomic_fetch_sub(&blocking_calls, 1);
    return mpi_rc == MPI_SUCCESS ? 0 : dt_mpi_fail(c, mpi_rc, -1, what);
}

#define BLOCKING(rc, c, what, call) \
    if (((rc) = enter_blocking(c)) == 0) (rc) = leave_blocking((c), (call), (what))

/* n bytes as (count, type): MPI_BYTE while n fits MPI's int count, else
 * one derived type of exactly n bytes (*made: free it after). */
static int bytes_type(dt_comm *c, size_t n, int *count, MPI_Datatype *t, int *made)
{
    *made = 0;
    if (n <= (size_t)DT_MPI_COUNT_MAX) {
        *count = (int)n;
        *t = MPI_BYTE;
        return 0;
    }
    /* unit-byte pieces, then the rest */
    const size_t unit = DT_MPI_COUNT_MAX < (1 << 20) ? 64 : (size_t)1 << 20;
    MPI_Datatype chunk;
    int rc = MPI_Type_contiguous((int)unit, MPI_BYTE, &chunk);
    if (rc == MPI_SUCCESS) {
        int lens[2] = {(int)(n / unit), (int)(n % unit)};
        MPI_Aint disps[2] = {0, (MPI_Aint)(n - n % unit)};
        MPI_Datatype types[2] = {chunk, MPI_BYTE};
        rc = MPI_Type_create_struct(lens[1] ? 2 : 1, lens, disps, types, t);
        MPI_Type_free(&chunk);
    }
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(t);
    if (rc != MPI_SUCCESS) return dt_mpi_fail(c, rc, -1, "a datatype for a large block");
    *count = 1;
    *made = 1;
    return 0;
}

static int ranges_overlap(const void *a, size_t an, const void *b, size_t bn)
{
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

/* ---- the collectives ----------------------------------------------------------- */

int dt_allreduce_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    MPI_Comm m = MPI_COMM_NULL;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    int rc = comm_of(c, &m);
    if (rc == 0) rc = type_and_op(c, &t, &op);
    size_t esz = dt_dtype_size(c->cur.dtype);
    /* Element-wise, so calls of at most DT_MPI_COUNT_MAX elements do. */
    for (size_t off = 0; rc == 0 && off < n; off += (size_t)DT_MPI_COUNT_MAX) {
        size_t k = n - off < (size_t)DT_MPI_COUNT_MAX ? n - off : (size_t)DT_MPI_COUNT_MAX;
        char *r = (char *)recv + off * esz;
        const void *s = send == recv ? MPI_IN_PLACE : (const char *)send + off * esz;
        BLOCKING(rc, c, "MPI_Allreduce", MPI_Allreduce(s, r, (int)k, t, op, m));
    }
    return rc;
}

/* The byte collectives' common part: c's MPI communicator and n bytes as
 * (count, type); byte_call_end frees a type made for a large block. */
typedef struct {
    MPI_Comm comm;
    MPI_Datatype type;
    int count, made;
} byte_call;

static int byte_call_begin(dt_comm *c, size_t n, byte_call *b)
{
    *b = (byte_call){MPI_COMM_NULL, MPI_DATATYPE_NULL, 0, 0};
    int rc = comm_of(c, &b->comm);
    return rc ? rc : bytes_type(c, n, &b->count, &b->type, &b->made);
}

static int byte_call_end(byte_call *b, int rc)
{
    if (b->made) MPI_Type_free(&b->type);
    return rc;
}

int dt_broadcast_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send;
    byte_call b;
    int rc = byte_call_begin(c, n, &b);
    if (rc < 0) return rc;
    BLOCKING(rc, c, "MPI_Bcast", MPI_Bcast(recv, b.count, b.type, root, b.comm));
    return byte_call_end(&b, rc);
}

int dt_allgather_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)send, (void)root;
    byte_call b;
    int rc = byte_call_begin(c, n, &b);
    if (rc < 0) return rc;
    /* Our block is in its slot already. */
    BLOCKING(rc, c, "MPI_Allgather",
             MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, b.count, b.type, b.comm));
    return byte_call_end(&b, rc);
}

int dt_reduce_scatter_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    MPI_Comm m = MPI_COMM_NULL;
    MPI_Datatype t = MPI_DATATYPE_NULL;
    MPI_Op op = MPI_OP_NULL;
    int rc = comm_of(c, &m);
    if (rc == 0) rc = type_and_op(c, &t, &op);
    if (rc < 0) return rc;
    if (n > (size_t)DT_MPI_COUNT_MAX)
        return dt_comm_fail(c, DT_ERR_INVALID, -1, "reduce_scatter algorithm 'mpi' takes at most "
                            "%d elements per rank (MPI's int counts), not %zu", DT_MPI_COUNT_MAX,
                            n);
    size_t bytes = n * dt_dtype_size(c->cur.dtype);
    if (send == recv) { /* MPI's in-place form: the input in recv, the result at its start */
        BLOCKING(rc, c, "MPI_Reduce_scatter_block",
                 MPI_Reduce_scatter_block(MPI_IN_PLACE, recv, (int)n, t, op, m));
        return rc;
    }
    /* recv may overlap the input elsewhere (NCCL's layout): land beside it. */
    void *out = recv;
    if (ranges_overlap(send, bytes * (size_t)c->size, recv, bytes)) {
        out = dt_comm_scratch(c, bytes);
        if (!out) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", bytes);
    }
    BLOCKING(rc, c, "MPI_Reduce_scatter_block", MPI_Reduce_scatter_block(send, out, (int)n, t, op, m));
    if (rc == 0 && out != recv) memcpy(recv, out, bytes);
    return rc;
}

int dt_alltoall_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)root;
    byte_call b;
    int rc = byte_call_begin(c, n, &b);
    if (rc < 0) return rc;
    BLOCKING(rc, c, "MPI_Alltoall",
             MPI_Alltoall(send, b.count, b.type, recv, b.count, b.type, b.comm));
    return byte_call_end(&b, rc);
}

/* An element of the current call's size: the variable all-to-all moves
 * elements unread, so the unsigned integer of its width is as good as its
 * own type. */
static MPI_Datatype element_type(dt_comm *c)
{
    switch (dt_dtype_size(c->cur.dtype)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
    }
}

/* The call's counts and displacements as MPI's ints: out[0..4p) holds send
 * counts, send displacements, receive counts, receive displacements. Our
 * own block counts zero: collectives.c copied it already, and MPI would
 * copy it a second time. */
static int v_ints(dt_comm *c, int *out)
{
    int p = c->size;
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < p; j++) {
            int send = k < 2;
            size_t v = k % 2 ? dt_coll_v_displ(&c->cur, j, send)
                      : j == c->rank ? 0 : dt_coll_v_count(&c->cur, j, send);
            if (v > (size_t)DT_MPI_COUNT_MAX)
                return dt_comm_fail(c, DT_ERR_INVALID, -1, "alltoallv algorithm 'mpi' takes "
                                    "counts and displacements of at most %d elements (MPI's int "
                                    "counts); %s_%s[%d] is %zu: use another algorithm",
                                    DT_MPI_COUNT_MAX, send ? "send" : "recv",
                                    k % 2 ? "displs" : "counts", j, v);
            out[k * p + j] = (int)v;
        }
    return 0;
}

int dt_alltoallv_mpi(dt_comm *c, const void *send, void *recv, size_t n, int root)
{
    (void)n, (void)root;
    MPI_Comm m = MPI_COMM_NULL;
    int rc = comm_of(c, &m);
    if (rc < 0) return rc;
    int p = c->size, *v = malloc(4 * (size_t)p * sizeof *v);
    if (!v) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %d ranks' counts", p);
    rc = v_ints(c, v);
    MPI_Datatype t = element_type(c);
    if (rc == 0)
        BLOCKING(rc, c, "MPI_Alltoallv",
                 MPI_Alltoallv(send, v, v + p, t, recv, v + 2 * p, v + 3 * p, t, m));
    free(v);
    return rc;
}

#endif /* DTRAIN_HAVE_MPI */
