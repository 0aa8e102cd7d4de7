/*
 * The shared-memory rings under a long stream of messages of mixed sizes,
 * every element checked against the value its sender wrote: all-to-all-v
 * exchanges, broadcasts whose root runs ahead of the others, several
 * point-to-point messages queued to one peer, and reductions, from empty
 * messages to ones larger than a ring. A sender shows its head, and a
 * receiver its tail, once a message (shm.c): a header left unpublished
 * (an empty message, or one whose payload found no room) hangs here, and
 * a position published off the line grid or past the data fails a header
 * check or an element. Run with `dtrain launch -n 4` (small rings that
 * wrap often, and cross-memory attach forced, by the environment:
 * CMakeLists.txt).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h" /* tests/check.h */
#include "draw.h" /* tests/comm/draw.h */
#include "dtrain/comm.h"
#include "must.h" /* tests/comm/must.h */

#define ROUNDS 600
#define QUEUED 3 /* point-to-point messages each rank sends its next one per round */

static int rank, size;

/* Elements of int32 (4 bytes): empty, tiny, around the rewind point
 * (16 KiB), and past a 256 KiB ring, in about the proportions of a
 * training step's mix. */
static size_t count_of(int round, int a, int b, int what)
{
    uint64_t h = draw(round, a, b, what);
    unsigned band = (unsigned)(h % 20);
    h >>= 8;
    if (band < 2) return 0;
    if (band < 8) return 1 + h % 64;
    if (band < 14) return 64 + h % 2048;
    if (band < 18) return 2048 + h % 14336;
    return 16384 + h % 81920;
}

/* What rank src puts at element e of its message `what` of a round:
 * small enough that a sum over the ranks stays exact. */
static int32_t value(int round, int src, int dst, int what, size_t e)
{
    return (int32_t)(draw(round, src, dst, what) ^ mix(e + 1)) & 0x0fffffff;
}

static void fill(int32_t *buf, size_t n, int round, int src, int dst, int what)
{
    for (size_t e = 0; e < n; e++) buf[e] = value(round, src, dst, what, e);
}

static void expect(const int32_t *buf, size_t n, int round, int src, int dst, int what,
                   const char *name)
{
    size_t wrong = 0, first = 0;
    for (size_t e = 0; e < n; e++)
        if (buf[e] != value(round, src, dst, what, e) && !wrong++) first = e;
    CHECK(!wrong, "round %d, %s from rank %d: %zu of %zu elements wrong, the first at %zu",
          round, name, src, wrong, n, first);
}

static void alltoallv(dt_comm *c, int round)
{
    size_t sc[64], sd[64], rc[64], rd[64], ns = 0, nr = 0;
    for (int j = 0; j < size; j++) {
        sc[j] = count_of(round, rank, j, 0), sd[j] = ns, ns += sc[j];
        rc[j] = count_of(round, j, rank, 0), rd[j] = nr, nr += rc[j];
    }
    int32_t *s = malloc((ns + 1) * 4), *r = malloc((nr + 1) * 4);
    for (int j = 0; j < size; j++) fill(s + sd[j], sc[j], round, rank, j, 0);
    must(c, dt_alltoallv(c, s, sc, sd, r, rc, rd, DT_I32), "dt_alltoallv");
    for (int j = 0; j < size; j++) expect(r + rd[j], rc[j], round, j, rank, 0, "alltoallv");
    free(s), free(r);
}

/* The root's broadcasts complete once the rings hold them: it is a few
 * messages ahead of ranks still reading the first. */
static void broadcasts(dt_comm *c, int round)
{
    int root = round % size;
    for (int k = 1; k <= 3; k++) {
        size_t n = count_of(round, root, -1, k);
        int32_t *b = malloc((n + 1) * 4);
        if (rank == root) fill(b, n, round, root, -1, k);
        must(c, dt_broadcast(c, b, b, n, DT_I32, root), "dt_broadcast");
        expect(b, n, round, root, -1, k, "broadcast");
        free(b);
    }
}

static void queued(dt_comm *c, int round)
{
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    int32_t *s[QUEUED], *r[QUEUED];
    size_t ns[QUEUED], nr[QUEUED];
    dt_request *req[2 * QUEUED];
    for (int k = 0; k < QUEUED; k++) {
        ns[k] = count_of(round, rank, to, 10 + k), nr[k] = count_of(round, from, rank, 10 + k);
        s[k] = malloc((ns[k] + 1) * 4), r[k] = malloc((nr[k] + 1) * 4);
        fill(s[k], ns[k], round, rank, to, 10 + k);
        must(c, dt_isend(c, s[k], ns[k], DT_I32, to, &req[k]), "dt_isend");
    }
    for (int k = 0; k < QUEUED; k++)
        must(c, dt_irecv(c, r[k], nr[k], DT_I32, from, &req[QUEUED + k]), "dt_irecv");
    for (int k = 0; k < 2 * QUEUED; k++) must(c, dt_wait(req[k]), "dt_wait");
    for (int k = 0; k < QUEUED; k++) {
        expect(r[k], nr[k], round, from, rank, 10 + k, "send");
        free(s[k]), free(r[k]);
    }
}

static void allreduce(dt_comm *c, int round)
{
    size_t n = count_of(round, -1, -1, 20);
    int32_t *s = malloc((n + 1) * 4), *r = malloc((n + 1) * 4);
    fill(s, n, round, rank, -1, 20);
    must(c, dt_allreduce(c, s, r, n, DT_I32, DT_SUM), "dt_allreduce");
    size_t wrong = 0;
    for (size_t e = 0; e < n; e++) {
        int64_t want = 0;
        for (int j = 0; j < size; j++) want += value(round, j, -1, 20, e);
        wrong += r[e] != (int32_t)want;
    }
    CHECK(!wrong, "round %d, allreduce of %zu: %zu elements wrong", round, n, wrong);
    free(s), free(r);
}

int main(void)
{
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    if (size > 64) {
        fprintf(stderr, "test_shm_ring: at most 64 ranks, not %d\n", size);
        return 2;
    }
    check_set_label("rank %d: ", rank);
    for (int round = 0; round < ROUNDS; round++) {
        alltoallv(c, round);
        broadcasts(c, round);
        queued(c, round);
        allreduce(c, round);
    }
    if (rank == 0)
        printf("test_shm_ring: %d ranks over %s: %ld checks, %d failed on rank 0\n", size,
               dt_comm_transport(c), checks, failures);
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
