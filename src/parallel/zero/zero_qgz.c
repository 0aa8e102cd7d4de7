/* ZeRO++'s qgZ: stage 3's gradient reduce-scatter as block-quantized
 * all-to-alls (kernels/quant.h), in two hops when the data-parallel ranks
 * span hosts. Rank r = h K + j is local rank j of host h (K ranks a
 * host, H hosts, N = H K).
 *   Hop 1, over the host's K ranks: local rank j' is sent the H pieces of
 *   ranks h K + j' (h = 0..H-1); from each local rank arrive the H pieces
 *   of this rank's local index, summed over the host into H partial sums.
 *   Hop 2, over the H ranks of local index j (one a host): partial sum h
 *   is requantized and sent to host h; the H sums that arrive add up to
 *   this rank's piece (the mean: each rank weighed its share before).
 * Per rank and segment, (K - 1) H packets stay in the host and H - 1
 * leave it: one per other host, where a single all-to-all sends K. On one
 * host (H = 1), at one rank a host (K = 1), or with ranks not in
 * host-sized blocks, the single all-to-all over the group (K = N) is the
 * whole algorithm. The sums run in a fixed order, local rank then host,
 * so a run gives the same bits every time. */
#include <stdlib.h>

#include "core/str.h"
#include "parallel/zero/zero_internal.h"

/* Whether every rank sits in a block of K consecutive ranks of one host. */
static int host_blocks(zero *z, int k)
{
    int32_t ok = k > 1 && k < z->n && z->n % k == 0 && dt_comm_local_rank(z->comm) == z->me % k;
    if (dt_allreduce(z->comm, &ok, &ok, 1, DT_I32, DT_MIN)) return -1;
    return ok;
}

int dt_zero_qgz_setup(zero *z, char *err, size_t n)
{
    int k = dt_comm_local_size(z->comm), blocks = host_blocks(z, k);
    z->qgz_k = z->n;
    z->qgz_h = 1;
    if (blocks < 0) return dt_strf(err, n, "qgZ: %s", dt_comm_error(z->comm)), -1;
    if (!blocks) return 0;
    if (dt_comm_split(z->comm, z->me / k, z->me, &z->qgz_local) ||
        dt_comm_split(z->comm, z->me % k, z->me, &z->qgz_cross))
        return dt_strf(err, n, "qgZ: forming the host and cross-host groups: %s",
                       dt_comm_error(z->comm)), -1;
    z->qgz_k = k;
    z->qgz_h = z->n / k;
    return 0;
}

void dt_zero_qgz_free(zero *z)
{
    if (z->qgz_local) dt_comm_destroy(z->qgz_local);
    if (z->qgz_cross) dt_comm_destroy(z->qgz_cross);
    z->qgz_local = z->qgz_cross = NULL;
}

static dt_comm *hop1_comm(const zero *z) { return z->qgz_local ? z->qgz_local : z->comm; }

static size_t packet(const zero *z, int s) { return dt_zero_packet_bytes(z, s, z->o.grad_bits); }

static void quantize(const zero *z, unsigned char *out, const float *x, int s)
{
    dt_quant_pack(out, x, z->map.piece[s], (size_t)z->o.quant_block, z->o.grad_bits);
}

static void add(const zero *z, float *acc, const unsigned char *in, int s)
{
    dt_quant_unpack_add(acc, in, z->map.piece[s], (size_t)z->o.quant_block, z->o.grad_bits);
}

static int no_memory(zero *z)
{
    dt_strf(z->errmsg, sizeof z->errmsg, "qgZ: out of memory for the quantized gradients");
    dt_strf(z->m->error, sizeof z->m->error, "%s", z->errmsg);
    z->error = -1;
    return -1;
}

int dt_zero_qgz_start(zero *z, int s, const float *g)
{
    zero_seg *q = &z->seg[s];
    size_t k = (size_t)z->qgz_k, h = (size_t)z->qgz_h, len = packet(z, s), p = z->map.piece[s];
    size_t all = len * (size_t)z->n;
    q->qsend = malloc(all);
    q->qrecv = malloc(all);
    if (!q->qsend || !q->qrecv) {
        free(q->qsend), free(q->qrecv);
        q->qsend = q->qrecv = NULL;
        return no_memory(z);
    }
    dt_mem_account(DT_MEM_COMM, (long long)(2 * all));
    for (size_t d = 0; d < k; d++) /* to local rank d: the pieces of ranks i k + d */
        for (size_t i = 0; i < h; i++)
            quantize(z, q->qsend + (d * h + i) * len, g + (i * k + d) * p, s);
    int rc = dt_ialltoall(hop1_comm(z), q->qsend, q->qrecv, h * len, DT_U8, &q->rs);
    return rc ? dt_zero_fail_on(z, hop1_comm(z), rc, "qgZ gradient all-to-all") : 0;
}

static void release(zero *z, int s)
{
    zero_seg *q = &z->seg[s];
    free(q->qsend), free(q->qrecv);
    q->qsend = q->qrecv = NULL;
    dt_mem_account(DT_MEM_COMM, -(long long)(2 * packet(z, s) * (size_t)z->n));
}

/* Hop 2: the host's partial sums, one a host, to the hosts that own them;
 * out = what arrives, summed in host order. */
static int across_hosts(zero *z, int s, const float *partial, float *out)
{
    size_t h = (size_t)z->qgz_h, len = packet(z, s), p = z->map.piece[s];
    unsigned char *send = malloc(2 * h * len), *recv = send + h * len;
    if (!send) return no_memory(z);
    for (size_t i = 0; i < h; i++) quantize(z, send + i * len, partial + i * p, s);
    dt_request *r = NULL;
    int rc = dt_ialltoall(z->qgz_cross, send, recv, len, DT_U8, &r);
    if (!rc) rc = dt_zero_wait(z, &r, "alltoall_qgz_hosts", h * len);
    for (size_t i = 0; !rc && i < p; i++) out[i] = 0.0f;
    for (size_t i = 0; !rc && i < h; i++) add(z, out, recv + i * len, s);
    free(send);
    return rc ? dt_zero_fail_on(z, z->qgz_cross, rc, "qgZ cross-host all-to-all") : 0;
}

int dt_zero_qgz_finish(zero *z, int s, float *out)
{
    zero_seg *q = &z->seg[s];
    size_t k = (size_t)z->qgz_k, h = (size_t)z->qgz_h, len = packet(z, s), p = z->map.piece[s];
    int rc = dt_zero_wait(z, &q->rs, "alltoall_qgz", len * (size_t)z->n);
    if (rc) return release(z, s), dt_zero_fail_on(z, hop1_comm(z), rc, "qgZ gradient all-to-all");
    float *partial = h > 1 ? malloc(h * p * sizeof(float)) : out;
    if (!partial) return release(z, s), no_memory(z);
    for (size_t i = 0; i < h * p; i++) partial[i] = 0.0f;
    for (size_t j = 0; j < k; j++) /* from local rank j: its H pieces of this local index */
        for (size_t i = 0; i < h; i++) add(z, partial + i * p, q->qrecv + (j * h + i) * len, s);
    release(z, s);
    if (h > 1) {
        rc = across_hosts(z, s, partial, out);
        free(partial);
        if (rc) return -1;
    }
    return 0; /* the ranks' gradients were weighed before (dt_strategy.grad_ranks) */
}
