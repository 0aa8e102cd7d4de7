/*
 * The public collective calls: validate the arguments, place the data the
 * algorithms expect (in-place rules, the rank's own block), run the
 * algorithm, finish averages. Blocking and non-blocking calls share all of
 * it; only dt_async_submit differs.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "comm/algo/algorithms.h"
#include "comm/async.h"
#include "comm/reduce_ops.h"

/* ---- validation ---------------------------------------------------------- */

int dt_comm_invalid(dt_comm *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&c->err_lock);
    if (!atomic_load(&c->failed)) vsnprintf(c->err, sizeof c->err, fmt, ap);
    pthread_mutex_unlock(&c->err_lock);
    va_end(ap);
    return DT_ERR_INVALID;
}

static int invalid(dt_comm *c, const char *fmt, const char *what, long long v)
{
    return dt_comm_invalid(c, fmt, what, v);
}

static int has_root(dt_coll_kind k)
{
    return k == DT_COLL_BROADCAST || k == DT_COLL_REDUCE || k == DT_COLL_GATHER ||
           k == DT_COLL_SCATTER || k == DT_COLL_SEND;
}

/* Elements the send and receive buffers must hold, on this rank. */
static void buffer_counts(const dt_comm *c, const dt_coll_args *a, size_t *ns, size_t *nr)
{
    size_t n = a->count, p = (size_t)c->size;
    int root = a->root == c->rank;
    switch (a->kind) {
    case DT_COLL_BROADCAST: *ns = root ? n : 0; *nr = n; break;
    case DT_COLL_REDUCE: *ns = n; *nr = root ? n : 0; break;
    case DT_COLL_GATHER: *ns = n; *nr = root ? n * p : 0; break;
    case DT_COLL_SCATTER: *ns = root ? n * p : 0; *nr = n; break;
    case DT_COLL_ALLGATHER: *ns = n; *nr = n * p; break;
    case DT_COLL_REDUCE_SCATTER: *ns = n * p; *nr = n; break;
    case DT_COLL_ALLTOALL: *ns = n * p; *nr = n * p; break;
    case DT_COLL_SEND: *ns = a->is_recv ? 0 : n; *nr = a->is_recv ? n : 0; break;
    default: *ns = n; *nr = n; break;
    }
}

static int validate(dt_comm *c, dt_coll_args *a)
{
    const char *name = dt_coll_name(a->kind);
    if (a->kind == DT_COLL_SEND) name = a->any_source ? "recv_any" : a->is_recv ? "recv" : "send";
    if ((unsigned)a->dtype >= DT_DTYPE_COUNT)
        return invalid(c, "dt_%s: dtype %lld is not a dt_dtype", name, a->dtype);
    if (dt_coll_reduces(a->kind) && (unsigned)a->op >= DT_OP_COUNT)
        return invalid(c, "dt_%s: op %lld is not a dt_op", name, a->op);
    const int bitwise = a->op == DT_BAND || a->op == DT_BOR || a->op == DT_BXOR;
    const int integer = a->dtype == DT_I32 || a->dtype == DT_I64 || a->dtype == DT_U8;
    if (dt_coll_reduces(a->kind) && bitwise && !integer)
        return dt_comm_invalid(c, "dt_%s: op %s needs an integer dtype (i32, i64, u8), not %s",
                               name, dt_op_name((dt_op)a->op),
                               dt_dtype_name((dt_dtype)a->dtype));
    if (a->any_source && c->size < 2)
        return dt_comm_invalid(c, "dt_%s: the communicator has no other rank to receive from "
                               "(it has 1 rank)", name);
    if (has_root(a->kind) && !a->any_source && (a->root < 0 || a->root >= c->size))
        return invalid(c, a->kind == DT_COLL_SEND ? "dt_%s: peer %lld is not a rank of the communicator"
                                                  : "dt_%s: root %lld is not a rank of the communicator",
                       name, a->root);
    if (a->kind == DT_COLL_SEND && a->root == c->rank)
        return invalid(c, "dt_%s: peer %lld is this rank itself", name, a->root);
    if (a->kind == DT_COLL_ALLTOALLV) return dt_alltoallv_check(c, a);
    size_t ns, nr;
    buffer_counts(c, a, &ns, &nr);
    size_t esz = dt_dtype_size(a->dtype);
    if (a->count > SIZE_MAX / esz / (size_t)c->size)
        return invalid(c, "dt_%s: count %lld overflows the address space", name,
                       (long long)a->count);
    if (ns && !a->send) return invalid(c, "dt_%s: send buffer is NULL with count %lld", name,
                                       (long long)a->count);
    if (nr && !a->recv) return invalid(c, "dt_%s: recv buffer is NULL with count %lld", name,
                                       (long long)a->count);
    return 0;
}

/* ---- per-collective data placement ---------------------------------------- */

/* A copy into the call's output: past the cache when it is large, or
 * when the call says so (stream_out). */
static void copy_out(void *dst, const void *src, size_t bytes, int stream)
{
    const char *d = dst, *s = src;
    if (dst == src || !bytes) return;
    if ((stream || bytes >= DT_STREAM_MIN) && (d + bytes <= s || s + bytes <= d))
        dt_copy_stream(dst, src, bytes);
    else
        memmove(dst, src, bytes);
}

static void copy_if_distinct(void *dst, const void *src, size_t bytes)
{
    copy_out(dst, src, bytes, 0);
}

/* The selectable collectives run whichever algorithm dt_algo_pick names. */
static int run_algo(dt_comm *c, const dt_coll_args *a, const void *send, void *recv)
{
    const dt_algo *al;
    int rc = dt_algo_pick(c, a, &al);
    if (rc < 0) return rc;
    return al->run(c, send, recv, dt_algo_arg_n(a), a->root);
}

static int run_allreduce(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    int rc = 0;
    if (c->size > 1)
        rc = run_algo(c, a, a->send, a->recv);
    else
        copy_if_distinct(a->recv, a->send, a->count * esz);
    if (rc == 0 && a->op == DT_AVG) dt_reduce_finish_avg(a->dtype, a->recv, a->count, c->size);
    return rc;
}

static int run_reduce(dt_comm *c, const dt_coll_args *a)
{
    int rc = dt_reduce_binomial(c, a->send, a->recv, a->count, a->root);
    if (rc == 0 && a->op == DT_AVG && c->rank == a->root)
        dt_reduce_finish_avg(a->dtype, a->recv, a->count, c->size);
    return rc;
}

static int run_broadcast(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    if (c->rank == a->root) copy_if_distinct(a->recv, a->send, a->count * esz);
    return c->size > 1 ? run_algo(c, a, NULL, a->recv) : 0;
}

/* Gather and all-gather: the rank's block goes to its slot unless the
 * caller already put it there (send == recv, or NCCL's send == slot). */
static void place_own_block(dt_comm *c, const dt_coll_args *a, size_t block)
{
    char *slot = (char *)a->recv + (size_t)c->rank * block;
    if (a->send != a->recv) copy_if_distinct(slot, a->send, block);
}

static int run_gather(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    size_t block = a->count * esz;
    if (c->rank == a->root) place_own_block(c, a, block);
    return c->size > 1 ? dt_gather_linear(c, a->send, a->recv, block, a->root) : 0;
}

static int run_scatter(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    size_t block = a->count * esz;
    if (c->rank == a->root && a->recv != a->send)
        copy_if_distinct(a->recv, (const char *)a->send + (size_t)c->rank * block, block);
    return c->size > 1 ? dt_scatter_linear(c, a->send, a->recv, block, a->root) : 0;
}

static int run_allgather(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    place_own_block(c, a, a->count * esz);
    return c->size > 1 ? run_algo(c, a, NULL, a->recv) : 0;
}

static int run_reduce_scatter(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    size_t bytes = a->count * esz;
    int rc = 0;
    if (c->size > 1)
        rc = run_algo(c, a, a->send, a->recv);
    else
        copy_if_distinct(a->recv, a->send, bytes);
    if (rc == 0 && a->op == DT_AVG) dt_reduce_finish_avg(a->dtype, a->recv, a->count, c->size);
    return rc;
}

static int run_alltoall(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    size_t block = a->count * esz, total = block * (size_t)c->size;
    const char *send = a->send;
    if (send == a->recv && total) { /* in place: every block is overwritten before sent */
        char *copy = dt_comm_scratch(c, total);
        if (!copy) return dt_comm_fail(c, DT_ERR_NOMEM, -1, "no memory for %zu bytes", total);
        memcpy(copy, send, total);
        send = copy;
    }
    copy_if_distinct((char *)a->recv + (size_t)c->rank * block, send + (size_t)c->rank * block,
                     block);
    return c->size > 1 ? run_algo(c, a, send, a->recv) : 0;
}

/* The rank's own block is copied here; the algorithms exchange the rest. */
static int run_alltoallv(dt_comm *c, const dt_coll_args *a, size_t esz)
{
    int r = c->rank;
    copy_out((char *)a->recv + dt_coll_v_displ(a, r, 0) * esz,
             (const char *)a->send + dt_coll_v_displ(a, r, 1) * esz,
             dt_coll_v_count(a, r, 1) * esz, a->stream_out);
    return c->size > 1 ? run_algo(c, a, a->send, a->recv) : 0;
}

dt_p2p dt_p2p_from_call(const dt_coll_args *a)
{
    size_t bytes = a->count * dt_dtype_size(a->dtype);
    int peer = a->any_source ? DT_P2P_ANY : a->root;
    dt_p2p op = a->is_recv ? dt_p2p_recv(peer, a->recv, bytes) : dt_p2p_send(peer, a->send, bytes);
    op.call = a;
    return op;
}

static int run_p2p(dt_comm *c, const dt_coll_args *a)
{
    dt_p2p op = dt_p2p_from_call(a);
    return dt_p2p_run(c, &op, 1);
}

int dt_coll_execute(dt_comm *c, const dt_coll_args *a)
{
    if (atomic_load(&c->failed)) return c->failed_code;
    c->cur = *a;
    c->cur_seq = a->kind == DT_COLL_SEND ? 0 : c->seq++;
    c->cur_step = NULL;
    size_t esz = dt_dtype_size(a->dtype);
    int rc;
    switch (a->kind) {
    case DT_COLL_ALLREDUCE: rc = run_allreduce(c, a, esz); break;
    case DT_COLL_REDUCE: rc = run_reduce(c, a); break;
    case DT_COLL_BROADCAST: rc = run_broadcast(c, a, esz); break;
    case DT_COLL_GATHER: rc = run_gather(c, a, esz); break;
    case DT_COLL_SCATTER: rc = run_scatter(c, a, esz); break;
    case DT_COLL_ALLGATHER: rc = run_allgather(c, a, esz); break;
    case DT_COLL_REDUCE_SCATTER: rc = run_reduce_scatter(c, a, esz); break;
    case DT_COLL_ALLTOALL: rc = run_alltoall(c, a, esz); break;
    case DT_COLL_ALLTOALLV: rc = run_alltoallv(c, a, esz); break;
    case DT_COLL_BARRIER: rc = c->size > 1 ? dt_barrier_dissemination(c) : 0; break;
    case DT_COLL_SEND: rc = run_p2p(c, a); break;
    default: rc = dt_comm_fail(c, DT_ERR_INVALID, -1, "unknown collective %d", (int)a->kind);
    }
    c->cur.kind = DT_COLL_NONE;
    return rc;
}

/* ---- public calls ---------------------------------------------------------- */

static int submit(dt_comm *c, dt_coll_args a, dt_request **req)
{
    if (!c) return DT_ERR_INVALID;
    if (req) *req = NULL;
    if (atomic_load(&c->failed)) return c->failed_code;
    int rc = validate(c, &a);
    if (rc < 0) return rc;
    a.algo = c->algo_forced[a.kind]; /* fixed now: a later dt_comm_set_algo does not move it */
    return dt_async_submit(c, &a, req);
}

#define ARGS(k, s, r, n, t, o, rt) \
    ((dt_coll_args){.kind = (k), .send = (s), .recv = (r), .count = (n), .dtype = (t), .op = (o), .root = (rt)})

int dt_allreduce(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op)
{
    return submit(c, ARGS(DT_COLL_ALLREDUCE, s, r, n, t, op, 0), NULL);
}
int dt_iallreduce(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op,
                  dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_ALLREDUCE, s, r, n, t, op, 0), q) : DT_ERR_INVALID;
}
int dt_broadcast(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root)
{
    return submit(c, ARGS(DT_COLL_BROADCAST, s, r, n, t, DT_SUM, root), NULL);
}
int dt_ibroadcast(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root,
                  dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_BROADCAST, s, r, n, t, DT_SUM, root), q) : DT_ERR_INVALID;
}
int dt_reduce(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op, int root)
{
    return submit(c, ARGS(DT_COLL_REDUCE, s, r, n, t, op, root), NULL);
}
int dt_ireduce(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op, int root,
               dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_REDUCE, s, r, n, t, op, root), q) : DT_ERR_INVALID;
}
int dt_gather(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root)
{
    return submit(c, ARGS(DT_COLL_GATHER, s, r, n, t, DT_SUM, root), NULL);
}
int dt_igather(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root,
               dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_GATHER, s, r, n, t, DT_SUM, root), q) : DT_ERR_INVALID;
}
int dt_scatter(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root)
{
    return submit(c, ARGS(DT_COLL_SCATTER, s, r, n, t, DT_SUM, root), NULL);
}
int dt_iscatter(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, int root,
                dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_SCATTER, s, r, n, t, DT_SUM, root), q) : DT_ERR_INVALID;
}
int dt_allgather(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t)
{
    return submit(c, ARGS(DT_COLL_ALLGATHER, s, r, n, t, DT_SUM, 0), NULL);
}
int dt_iallgather(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_ALLGATHER, s, r, n, t, DT_SUM, 0), q) : DT_ERR_INVALID;
}
int dt_reduce_scatter(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op)
{
    return submit(c, ARGS(DT_COLL_REDUCE_SCATTER, s, r, n, t, op, 0), NULL);
}
int dt_ireduce_scatter(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_op op,
                       dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_REDUCE_SCATTER, s, r, n, t, op, 0), q) : DT_ERR_INVALID;
}
int dt_alltoall(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t)
{
    return submit(c, ARGS(DT_COLL_ALLTOALL, s, r, n, t, DT_SUM, 0), NULL);
}
int dt_ialltoall(dt_comm *c, const void *s, void *r, size_t n, dt_dtype t, dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_ALLTOALL, s, r, n, t, DT_SUM, 0), q) : DT_ERR_INVALID;
}
static dt_coll_args v_args(const void *s, const size_t *sc, const size_t *sd, void *r,
                           const size_t *rc, const size_t *rd, dt_dtype t)
{
    dt_coll_args a = ARGS(DT_COLL_ALLTOALLV, s, r, 0, t, DT_SUM, 0);
    a.v = (dt_coll_v){sc, sd, rc, rd};
    return a;
}
int dt_alltoallv(dt_comm *c, const void *s, const size_t *sc, const size_t *sd, void *r,
                 const size_t *rc, const size_t *rd, dt_dtype t)
{
    return submit(c, v_args(s, sc, sd, r, rc, rd, t), NULL);
}
int dt_ialltoallv(dt_comm *c, const void *s, const size_t *sc, const size_t *sd, void *r,
                  const size_t *rc, const size_t *rd, dt_dtype t, dt_request **q)
{
    return q ? submit(c, v_args(s, sc, sd, r, rc, rd, t), q) : DT_ERR_INVALID;
}
int dt_barrier(dt_comm *c) { return submit(c, ARGS(DT_COLL_BARRIER, 0, 0, 0, DT_U8, DT_SUM, 0), NULL); }
int dt_ibarrier(dt_comm *c, dt_request **q)
{
    return q ? submit(c, ARGS(DT_COLL_BARRIER, 0, 0, 0, DT_U8, DT_SUM, 0), q) : DT_ERR_INVALID;
}

static dt_coll_args p2p_args(const void *s, void *r, size_t n, dt_dtype t, int peer, int is_recv,
                             int tag)
{
    dt_coll_args a = ARGS(DT_COLL_SEND, s, r, n, t, DT_SUM, peer);
    a.is_recv = is_recv;
    a.tag = tag;
    return a;
}
int dt_send(dt_comm *c, const void *b, size_t n, dt_dtype t, int peer)
{
    return submit(c, p2p_args(b, NULL, n, t, peer, 0, 0), NULL);
}
int dt_isend(dt_comm *c, const void *b, size_t n, dt_dtype t, int peer, dt_request **q)
{
    return dt_isend_tag(c, b, n, t, peer, 0, q);
}
int dt_recv(dt_comm *c, void *b, size_t n, dt_dtype t, int peer)
{
    return submit(c, p2p_args(NULL, b, n, t, peer, 1, 0), NULL);
}
int dt_irecv(dt_comm *c, void *b, size_t n, dt_dtype t, int peer, dt_request **q)
{
    return dt_irecv_tag(c, b, n, t, peer, 0, q);
}
int dt_isend_tag(dt_comm *c, const void *b, size_t n, dt_dtype t, int peer, int tag,
                 dt_request **q)
{
    return q ? submit(c, p2p_args(b, NULL, n, t, peer, 0, tag), q) : DT_ERR_INVALID;
}
int dt_irecv_tag(dt_comm *c, void *b, size_t n, dt_dtype t, int peer, int tag, dt_request **q)
{
    return q ? submit(c, p2p_args(NULL, b, n, t, peer, 1, tag), q) : DT_ERR_INVALID;
}
/* The sender is unknown until the progress thread chooses it: -1 till then. */
static dt_coll_args any_args(void *b, size_t n, dt_dtype t, int tag, int *source)
{
    dt_coll_args a = p2p_args(NULL, b, n, t, DT_P2P_ANY, 1, tag);
    a.any_source = 1;
    a.source = source;
    if (source) *source = -1;
    return a;
}
int dt_recv_any(dt_comm *c, void *b, size_t n, dt_dtype t, int tag, int *source)
{
    return submit(c, any_args(b, n, t, tag, source), NULL);
}
int dt_irecv_any(dt_comm *c, void *b, size_t n, dt_dtype t, int tag, int *source,
                 dt_request **q)
{
    return q ? submit(c, any_args(b, n, t, tag, source), q) : DT_ERR_INVALID;
}
