/* Parameter server: the split of ranks, shards and pieces, and what both
 * sides share. See ps.h. */
#include "parallel/ps.h"

#include <stdlib.h>
#include <string.h>

#include "core/hash.h"
#include "core/sum.h"
#include "core/str.h"
#include "parallel/fingerprint.h"

/* Shard bounds fall on 16-float (64-byte) boundaries, like the tensors. */
static void split_shards(dt_ps *ps, size_t n)
{
    ps->shard_lo[0] = 0;
    for (int s = 1; s < ps->servers; s++)
        ps->shard_lo[s] = (n / (size_t)ps->servers * (size_t)s) & ~(size_t)15;
    ps->shard_lo[ps->servers] = n;
}

/* Each backward segment, last first, cut at the shard bounds. */
static int plan_pieces(dt_ps *ps, const dt_gpt *m)
{
    int nseg = dt_gpt_segments(m);
    ps->pieces = calloc((size_t)(nseg * ps->servers + nseg), sizeof *ps->pieces);
    if (!ps->pieces) return -1;
    for (int seg = nseg - 1; seg >= 0; seg--) {
        size_t lo = dt_gpt_segment_start(m, seg), hi = dt_gpt_segment_start(m, seg + 1);
        for (int s = 0; s < ps->servers; s++) {
            size_t a = lo > ps->shard_lo[s] ? lo : ps->shard_lo[s];
            size_t b = hi < ps->shard_lo[s + 1] ? hi : ps->shard_lo[s + 1];
            if (a < b) ps->pieces[ps->npieces++] = (dt_ps_piece){s, a, b};
        }
    }
    return 0;
}

/* One communicator per worker holding it and every server: colour 0 for
 * them, none for the other workers; ordered by world rank, so the worker is
 * 0 and server s is 1 + s. */
static int split_links(dt_ps *ps, dt_comm *world)
{
    int rank = dt_comm_rank(world);
    for (int w = 0; w < ps->workers; w++) {
        int member = ps->is_server || rank == w;
        dt_comm *link = NULL;
        int rc = dt_comm_split(world, member ? 0 : DT_UNDEFINED, rank, &link);
        if (rc != 0) return rc;
        if (ps->is_server)
            ps->links[w] = link;
        else if (link)
            ps->links[0] = link;
    }
    return 0;
}

int dt_ps_join(dt_ps *ps, dt_comm *world, int servers, const dt_gpt *layout,
               const dt_compress_spec *compress, const dt_ps_mode *mode, char *err,
               size_t errlen)
{
    memset(ps, 0, sizeof *ps);
    int rank = dt_comm_rank(world), size = dt_comm_size(world);
    ps->servers = servers;
    ps->workers = size - servers;
    ps->is_server = rank >= ps->workers;
    ps->index = ps->is_server ? rank - ps->workers : rank;
    ps->compress = *compress;
    ps->async = mode->async;
    ps->staleness = mode->staleness;
    ps->fixed = mode->async && mode->fixed;
    ps->shard_lo = calloc((size_t)servers + 1, sizeof *ps->shard_lo);
    ps->links = calloc((size_t)ps->workers, sizeof *ps->links);
    if (!ps->shard_lo || !ps->links) {
        dt_strf(err, errlen, "parameter server: out of memory");
        dt_ps_leave(ps);
        return -1;
    }
    split_shards(ps, layout->n_floats);
    int empty = 0;
    for (int s = 0; s < servers; s++) empty |= dt_ps_shard_len(ps, s) == 0;
    if (empty) {
        dt_strf(err, errlen, "parameter server: %zu parameters are too few for %d servers",
                layout->n_params, servers);
        dt_ps_leave(ps);
        return -1;
    }
    if (plan_pieces(ps, layout)) {
        dt_strf(err, errlen, "parameter server: out of memory");
        dt_ps_leave(ps);
        return -1;
    }
    int rc = dt_comm_split(world, ps->is_server, rank, &ps->role);
    if (rc == 0) rc = split_links(ps, world);
    if (rc != 0) {
        dt_strf(err, errlen, "parameter server: forming its communicators: %s",
                dt_comm_error(world));
        dt_ps_leave(ps);
        return -1;
    }
    return 0;
}

/* Destroying a communicator is collective over its members: every rank
 * goes through the links in worker order, then the role communicators. */
void dt_ps_leave(dt_ps *ps)
{
    int nlinks = ps->is_server ? ps->workers : 1;
    for (int i = 0; ps->links && i < nlinks; i++)
        if (ps->links[i]) dt_comm_destroy(ps->links[i]);
    if (ps->role) dt_comm_destroy(ps->role);
    free(ps->links);
    free(ps->shard_lo);
    free(ps->pieces);
    memset(ps, 0, sizeof *ps);
}

int dt_ps_wait_all(dt_request **reqs, int n)
{
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        int r = dt_wait(reqs[i]);
        reqs[i] = NULL;
        if (rc == 0) rc = r;
    }
    return rc;
}

int dt_ps_send_ctrl(dt_comm *link, int peer, int64_t kind, int64_t step, int64_t arg)
{
    int64_t msg[DT_PS_CTRL_COUNT] = {kind, step, arg};
    return dt_send(link, msg, DT_PS_CTRL_COUNT, DT_I64, peer);
}

int dt_ps_recv_ctrl(dt_comm *link, int peer, dt_ps_ctrl *out)
{
    int64_t msg[DT_PS_CTRL_COUNT];
    int rc = dt_recv(link, msg, DT_PS_CTRL_COUNT, DT_I64, peer);
    if (rc == 0) *out = (dt_ps_ctrl){msg[0], msg[1], msg[2]};
    return rc;
}

int dt_ps_params_identical(dt_ps *ps, dt_comm *world, const float *params, uint64_t *hash_out)
{
    int S = ps->servers, rc = DT_ERR_NOMEM;
    int64_t *lo = malloc((size_t)S * sizeof *lo), *hi = malloc((size_t)S * sizeof *hi);
    if (!lo || !hi) goto out;
    for (int s = 0; s < S; s++) {
        int64_t h = 0;
        int have = !ps->is_server || ps->index == s;
        if (have) {
            const float *p = ps->is_server ? params : params + ps->shard_lo[s];
            h = (int64_t)dt_sum64(p, dt_ps_shard_len(ps, s) * sizeof(float));
        }
        lo[s] = have ? h : INT64_MAX; /* neutral for the side that lacks it */
        hi[s] = have ? h : INT64_MIN;
    }
    rc = dt_fingerprints_agree(world, lo, hi, S);
    if (rc >= 0 && hash_out) *hash_out = dt_fnv1a64(lo, (size_t)S * sizeof *lo);
out:
    free(lo);
    free(hi);
    return rc;
}
