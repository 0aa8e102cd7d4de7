#include "parallel/context/ring_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Requests in flight during one call, by role, so that an error path can
 * wait for every one before the buffers under them are freed. */
enum { KV_SEND, KV_RECV, G_SEND, G_RECV, NREQ };

typedef struct {
    dt_ring_attention *ra;
    dt_request *req[NREQ];
    size_t n;   /* floats in one [B, Tl, 2C] block */
    int failed; /* first failing step, or -1 */
} ring;

int dt_ring_attention_init(dt_ring_attention *ra, dt_comm *cp, int B, int T, int C, int NH,
                           dt_shard_kind kind)
{
    memset(ra, 0, sizeof *ra);
    return dt_seq_split_init(&ra->split, "ring attention", cp, B, T, C, NH, kind, ra->error,
                             sizeof ra->error);
}

/* The positions of the block that rank `owner` started with. */
static dt_seq_rows rows_of(const dt_ring_attention *ra, int owner)
{
    dt_seq_rows rows;
    dt_seq_shard(&rows, ra->split.T, owner, ra->split.nranks, ra->split.kind);
    return rows;
}

static int next_rank(const dt_ring_attention *ra)
{
    return (ra->split.rank + 1) % ra->split.nranks;
}
static int prev_rank(const dt_ring_attention *ra)
{
    return (ra->split.rank + ra->split.nranks - 1) % ra->split.nranks;
}

static int post(ring *g, int slot, float *buf, int step)
{
    dt_ring_attention *ra = g->ra;
    int send = slot == KV_SEND || slot == G_SEND;
    int rc = send ? dt_isend(ra->split.comm, buf, g->n, DT_F32, next_rank(ra), &g->req[slot])
                  : dt_irecv(ra->split.comm, buf, g->n, DT_F32, prev_rank(ra), &g->req[slot]);
    if (rc) {
        g->req[slot] = NULL;
        if (g->failed < 0) g->failed = step;
    }
    return rc;
}

/* Waits for one request (none posted is success). */
static int finish_req(ring *g, int slot, int step)
{
    if (!g->req[slot]) return 0;
    int rc = dt_wait(g->req[slot]);
    g->req[slot] = NULL;
    if (rc && g->failed < 0) g->failed = step;
    return rc;
}

/* Waits for everything still in flight; returns -1 with the message set
 * when anything failed. */
static int drain(ring *g, const char *what)
{
    for (int s = 0; s < NREQ; s++) finish_req(g, s, g->failed);
    if (g->failed < 0) return 0;
    snprintf(g->ra->error, sizeof g->ra->error, "ring attention %s, hop %d of %d: %s", what,
             g->failed, g->ra->split.nranks, dt_comm_error(g->ra->split.comm));
    return -1;
}

/* kv [B, Tl, 2C] = the k and v thirds of qkv [B, Tl, 3C]. */
static void pack_kv(float *kv, const float *qkv, size_t rows, size_t C)
{
    for (size_t i = 0; i < rows; i++)
        memcpy(kv + i * 2 * C, qkv + i * 3 * C + C, 2 * C * sizeof *kv);
}

static float *alloc_or_fail(dt_ring_attention *ra, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) snprintf(ra->error, sizeof ra->error, "ring attention: out of memory (%zu floats)", n);
    return p;
}

int dt_ring_attention_forward(dt_ring_attention *ra, float *out, float *lse, const float *qkv)
{
    size_t rows = (size_t)ra->split.B * ra->split.Tl, C = ra->split.C, nlse = rows * ra->split.NH;
    ring g = {.ra = ra, .n = rows * 2 * C, .failed = -1};
    float *kv = alloc_or_fail(ra, 2 * g.n), *part = kv ? alloc_or_fail(ra, rows * C + nlse) : NULL;
    if (!part) {
        free(kv);
        return -1;
    }
    float *buf[2] = {kv, kv + g.n}, *part_lse = part + rows * C;
    pack_kv(buf[0], qkv, rows, C);
    memset(out, 0, rows * C * sizeof *out);
    for (size_t i = 0; i < nlse; i++) lse[i] = -INFINITY;
    const dt_seq_split *sp = &ra->split;
    int N = sp->nranks;
    for (int s = 0; s < N && g.failed < 0; s++) {
        float *cur = buf[s & 1];
        /* The next block is on its way while this one is computed on. */
        if (s < N - 1 && post(&g, KV_SEND, cur, s) == 0) post(&g, KV_RECV, buf[~s & 1], s);
        dt_seq_rows src = rows_of(ra, (sp->rank - s + N) % N);
        if (dt_attention_block_forward(part, part_lse, qkv, 3 * C, cur, cur + C, 2 * C, &sp->mine,
                                       &src, sp->B, sp->C, sp->NH))
            dt_attention_merge(out, lse, part, part_lse, sp->B, sp->Tl, sp->C, sp->NH);
        finish_req(&g, KV_SEND, s);
        finish_req(&g, KV_RECV, s);
    }
    free(kv);
    free(part);
    return drain(&g, "forward");
}

/* Buffers of one backward call, each [B, Tl, 2C] but D. */
typedef struct {
    float *kv[2];   /* the travelling block, double-buffered */
    float *grad[2]; /* its dk, dv so far, double-buffered */
    float *acc;     /* this rank's contribution at this hop */
    float *D;       /* [B, NH, Tl] */
} bwd_bufs;

/* Hop s: this rank holds the block rank - s started with. Its gradient
 * from the ranks before (hop >= 1) arrives while this rank computes its
 * own share into acc; the sum then goes on to the next rank. */
static void backward_hop(ring *g, bwd_bufs *w, int s, float *dqkv, const float *dout,
                         const float *qkv, const float *lse)
{
    dt_ring_attention *ra = g->ra;
    int N = ra->split.nranks;
    size_t C = ra->split.C;
    float *cur = w->kv[s & 1], *grad = w->grad[s & 1];
    if (s > 0) post(g, G_RECV, grad, s);
    if (s < N - 1 && post(g, KV_SEND, cur, s) == 0) post(g, KV_RECV, w->kv[~s & 1], s);
    memset(w->acc, 0, g->n * sizeof(float));
    const dt_seq_split *sp = &ra->split;
    dt_seq_rows src = rows_of(ra, (sp->rank - s + N) % N);
    dt_attention_block_backward(dqkv, w->acc, w->acc + C, dout, lse, w->D, qkv, 3 * C, cur,
                                cur + C, 2 * C, &sp->mine, &src, sp->B, sp->C, sp->NH);
    if (s == 0) memset(grad, 0, g->n * sizeof(float));
    if (finish_req(g, G_RECV, s)) return;
    for (size_t i = 0; i < g->n; i++) grad[i] += w->acc[i];
    finish_req(g, KV_SEND, s);
    finish_req(g, KV_RECV, s);
    finish_req(g, G_SEND, s); /* the previous hop's, from the other grad buffer */
    if (N > 1 && g->failed < 0) post(g, G_SEND, grad, s);
}

int dt_ring_attention_backward(dt_ring_attention *ra, float *dqkv, const float *dout,
                               const float *qkv, const float *out, const float *lse)
{
    size_t rows = (size_t)ra->split.B * ra->split.Tl, C = ra->split.C, n = rows * 2 * C;
    ring g = {.ra = ra, .n = n, .failed = -1};
    float *mem = alloc_or_fail(ra, 5 * n + rows * ra->split.NH);
    if (!mem) return -1;
    bwd_bufs w = {{mem, mem + n}, {mem + 2 * n, mem + 3 * n}, mem + 4 * n, mem + 5 * n};
    pack_kv(w.kv[0], qkv, rows, C);
    memset(dqkv, 0, rows * 3 * C * sizeof *dqkv);
    dt_attention_row_dots(w.D, dout, out, ra->split.B, ra->split.Tl, ra->split.C, ra->split.NH);
    int N = ra->split.nranks;
    for (int s = 0; s < N && g.failed < 0; s++) backward_hop(&g, &w, s, dqkv, dout, qkv, lse);
    /* The last hop brings this rank's own rows' dk, dv home. */
    float *mine = w.grad[N > 1 ? N & 1 : 0];
    if (N > 1 && g.failed < 0 && post(&g, G_RECV, mine, N) == 0) finish_req(&g, G_RECV, N);
    int rc = drain(&g, "backward");
    if (rc == 0)
        for (size_t i = 0; i < rows; i++)
            memcpy(dqkv + i * 3 * C + C, mine + i * 2 * C, 2 * C * sizeof *mine);
    free(mem);
    return rc;
}
