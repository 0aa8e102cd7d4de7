#include "parallel/context/ulysses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "kernels/attention.h"

static int refuse_heads(dt_ulysses *u, int NH, int N)
{
    char ok[128];
    dt_str_divisors(ok, sizeof ok, NH);
    snprintf(u->error, sizeof u->error,
             "ulysses attention needs the heads (NH = %d) divisible by the context-parallel "
             "size (N = %d); N = %s would work", NH, N, ok);
    return -1;
}

int dt_ulysses_init(dt_ulysses *u, dt_comm *cp, int B, int T, int C, int NH, dt_shard_kind kind)
{
    memset(u, 0, sizeof *u);
    if (dt_seq_split_init(&u->split, "ulysses attention", cp, B, T, C, NH, kind, u->error,
                          sizeof u->error))
        return -1;
    if (NH % u->split.nranks) return refuse_heads(u, NH, u->split.nranks);
    return 0;
}

/* Floats of a head-sharded [B, T, parts * C / N] buffer; the same as a
 * rank's sequence-sharded [B, Tl, parts * C] one. */
static size_t head_floats(const dt_ulysses *u, int parts)
{
    return (size_t)u->split.B * u->split.T * parts * (u->split.C / u->split.nranks);
}

size_t dt_ulysses_saved_floats(const dt_ulysses *u)
{
    return head_floats(u, 4) + (size_t)u->split.B * (u->split.NH / u->split.nranks) * u->split.T;
}

/*
 * The all-to-all buffers hold N blocks, block d being what goes to (or
 * came from) rank d: [B, Tl, parts * Cn], rows in the sequence-sharded
 * rank's order, each row `parts` groups (q, k, v or just one) of rank d's
 * Cn = C / N columns. The two functions below copy between that and the
 * two layouts proper, either way (into_blocks picks), so that the packing
 * of one direction is visibly the unpacking of the other.
 */

/* local [B, Tl, parts * C]: rank d's columns of each group go to block d. */
static void seq_layout(const dt_ulysses *u, float *dst, const float *src, int parts,
                       int into_blocks)
{
    const dt_seq_split *sp = &u->split;
    size_t N = (size_t)sp->nranks, C = (size_t)sp->C, Cn = C / N, rows = (size_t)sp->B * sp->Tl;
    for (size_t d = 0; d < N; d++)
        for (size_t row = 0; row < rows; row++)
            for (size_t g = 0; g < (size_t)parts; g++) {
                size_t loc = (row * parts + g) * C + d * Cn;
                size_t blk = ((d * rows + row) * parts + g) * Cn;
                if (into_blocks)
                    memcpy(dst + blk, src + loc, Cn * sizeof *dst);
                else
                    memcpy(dst + loc, src + blk, Cn * sizeof *dst);
            }
}

/* head [B, T, parts * Cn]: block s holds rank s's positions, so each of
 * its chunks of consecutive positions is one copy per sequence. */
static void head_layout(const dt_ulysses *u, float *dst, const float *src, int parts,
                        int into_blocks)
{
    const dt_seq_split *sp = &u->split;
    size_t w = (size_t)parts * (sp->C / sp->nranks), Tl = (size_t)sp->Tl, T = (size_t)sp->T;
    for (int s = 0; s < u->split.nranks; s++) {
        dt_seq_rows pos;
        dt_seq_shard(&pos, u->split.T, s, u->split.nranks, u->split.kind);
        for (size_t b = 0; b < (size_t)u->split.B; b++)
            for (int c = 0, i = 0; c < pos.count; i += pos.len[c], c++) {
                size_t blk = (((size_t)s * u->split.B + b) * Tl + i) * w;
                size_t head = (b * T + pos.begin[c]) * w, n = pos.len[c] * w;
                if (into_blocks)
                    memcpy(dst + blk, src + head, n * sizeof *dst);
                else
                    memcpy(dst + head, src + blk, n * sizeof *dst);
            }
    }
}

/* One all-to-all of the packed blocks, counted in bytes_sent: the block a
 * rank keeps is copied, not sent. */
static int exchange(dt_ulysses *u, const float *send, float *recv, int parts, const char *what)
{
    size_t count = head_floats(u, parts) / u->split.nranks;
    if (dt_alltoall(u->split.comm, send, recv, count, DT_F32)) {
        snprintf(u->error, sizeof u->error, "ulysses attention %s all-to-all: %s", what,
                 dt_comm_error(u->split.comm));
        return -1;
    }
    u->bytes_sent += (size_t)(u->split.nranks - 1) * count * sizeof *send;
    return 0;
}

static float *alloc_or_fail(dt_ulysses *u, size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) snprintf(u->error, sizeof u->error, "ulysses attention: out of memory (%zu floats)", n);
    return p;
}

int dt_ulysses_forward(dt_ulysses *u, float *out, const float *qkv, float *saved)
{
    size_t n = head_floats(u, 3);
    int N = u->split.nranks;
    float *send = alloc_or_fail(u, 2 * n), *recv = send + n;
    if (!send) return -1;
    float *qkv_h = saved, *out_h = qkv_h + n, *lse_h = out_h + head_floats(u, 1);
    u->bytes_sent = 0;
    seq_layout(u, send, qkv, 3, 1);
    int rc = exchange(u, send, recv, 3, "forward qkv");
    if (rc == 0) {
        head_layout(u, qkv_h, recv, 3, 0);
        const dt_seq_split *sp = &u->split;
        dt_attention_forward(out_h, lse_h, qkv_h, sp->B, sp->T, sp->C / N, sp->NH / N);
        head_layout(u, send, out_h, 1, 1);
        rc = exchange(u, send, recv, 1, "forward out");
    }
    if (rc == 0) seq_layout(u, out, recv, 1, 0);
    free(send);
    return rc;
}

int dt_ulysses_backward(dt_ulysses *u, float *dqkv, const float *dout, const float *saved)
{
    size_t n = head_floats(u, 3);
    int N = u->split.nranks;
    float *send = alloc_or_fail(u, 2 * n + head_floats(u, 1));
    if (!send) return -1;
    /* dqkv_h is as big as recv, and recv is free again once dout_h is
     * unpacked from it, before dqkv_h is computed. */
    float *recv = send + n, *dout_h = recv + n, *dqkv_h = recv;
    const float *qkv_h = saved, *out_h = qkv_h + n, *lse_h = out_h + head_floats(u, 1);
    seq_layout(u, send, dout, 1, 1);
    int rc = exchange(u, send, recv, 1, "backward dout");
    if (rc == 0) {
        head_layout(u, dout_h, recv, 1, 0);
        const dt_seq_split *sp = &u->split;
        dt_attention_backward(dqkv_h, dout_h, qkv_h, out_h, lse_h, sp->B, sp->T, sp->C / N,
                              sp->NH / N);
        head_layout(u, send, dqkv_h, 3, 1);
        rc = exchange(u, send, recv, 3, "backward dqkv");
    }
    if (rc == 0) seq_layout(u, dqkv, recv, 3, 0);
    free(send);
    return rc;
}
