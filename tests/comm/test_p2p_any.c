/*
 * Receives from any source (dt_recv_any, dt_irecv_any) against known
 * senders and payloads, run by every rank of a job (`dtrain launch -n N`,
 * N >= 2; the tag case needs 3):
 *
 *  - races: each round one rank receives while every other sends it
 *    several messages at once. Every message must name its sender and
 *    hold what that sender's next message holds (a pair's messages in the
 *    order sent), and every sender's must all arrive; sizes from empty to
 *    past a shared-memory ring, received one at a time and several posted
 *    together;
 *  - tags: a message of another tag at the head of one peer's stream is
 *    passed over for another peer's, and stays for the receive that names
 *    it;
 *  - posting order: a receive from any source posted before a receive
 *    from a named peer takes that peer's first message;
 *  - peers that left the job, owing nothing, are passed over;
 *  - a communicator of one rank refuses the call, saying why.
 *
 * Exit 0 when every check passed; otherwise the first failures are printed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h" /* tests/check.h */
#include "draw.h"  /* tests/comm/draw.h */
#include "dtrain/comm.h"
#include "must.h" /* tests/comm/must.h */

#define ROUNDS 20
#define PER_SENDER 4 /* messages each sender sends in a round */
#define BATCH 3      /* receives posted together */
#define MAX_RANKS 64

static int rank, size;

/* Element e of sender src's k-th message of a round. */
static int32_t value(int round, int src, int k, size_t e)
{
    return (int32_t)(draw(round, src, k, e) & 0x7fffffff);
}

/* A round's message size, the same for every sender: empty, small, and
 * past a 256 KiB ring. */
static size_t count_of(int round)
{
    static const size_t counts[] = {0, 1, 100, 5000, 90000};
    return counts[round % 5];
}

static int tag_of(int round) { return round % 3; }

static void send_round(dt_comm *c, int round, int to)
{
    size_t n = count_of(round);
    int32_t *bufs[PER_SENDER];
    dt_request *req[PER_SENDER];
    for (int k = 0; k < PER_SENDER; k++) {
        bufs[k] = malloc((n + 1) * sizeof *bufs[k]);
        for (size_t e = 0; e < n; e++) bufs[k][e] = value(round, rank, k, e);
        must(c, dt_isend_tag(c, bufs[k], n, DT_I32, to, tag_of(round), &req[k]), "dt_isend_tag");
    }
    for (int k = 0; k < PER_SENDER; k++) {
        must(c, dt_wait(req[k]), "dt_wait(isend)");
        free(bufs[k]);
    }
}

/* A received message: its sender, and its payload against that sender's
 * next message (got[src] of them seen so far). */
static void expect(int round, int src, const int32_t *buf, int *got)
{
    CHECK(src >= 0 && src < size && src != rank, "round %d: sender %d", round, src);
    if (src < 0 || src >= size || src == rank) return;
    int k = got[src]++;
    size_t n = count_of(round), wrong = 0, first = 0;
    for (size_t e = 0; e < n; e++)
        if (buf[e] != value(round, src, k, e) && !wrong++) first = e;
    CHECK(!wrong, "round %d: message %d of rank %d: %zu of %zu elements wrong, the first at %zu "
          "(out of order, or another's)", round, k, src, wrong, n, first);
}

/* Every message of the round, one at a time (blocking) or BATCH posted
 * together, in turn. */
static void receive_round(dt_comm *c, int round)
{
    size_t n = count_of(round);
    int total = (size - 1) * PER_SENDER, got[MAX_RANKS] = {0};
    int32_t *bufs[BATCH];
    for (int b = 0; b < BATCH; b++) bufs[b] = malloc((n + 1) * sizeof *bufs[b]);
    for (int taken = 0, turn = 0; taken < total; turn++) {
        int src[BATCH], m = turn % 2 ? BATCH : 1;
        if (m > total - taken) m = total - taken;
        if (m == 1) {
            must(c, dt_recv_any(c, bufs[0], n, DT_I32, tag_of(round), &src[0]), "dt_recv_any");
        } else {
            dt_request *req[BATCH];
            for (int b = 0; b < m; b++)
                must(c, dt_irecv_any(c, bufs[b], n, DT_I32, tag_of(round), &src[b], &req[b]),
                     "dt_irecv_any");
            for (int b = 0; b < m; b++) must(c, dt_wait(req[b]), "dt_wait(irecv_any)");
        }
        for (int b = 0; b < m; b++) expect(round, src[b], bufs[b], got);
        taken += m;
    }
    for (int s = 0; s < size; s++)
        CHECK(s == rank || got[s] == PER_SENDER, "round %d: %d messages from rank %d, not %d",
              round, got[s], s, PER_SENDER);
    for (int b = 0; b < BATCH; b++) free(bufs[b]);
}

static void test_races(dt_comm *c)
{
    for (int round = 0; round < ROUNDS; round++) {
        int receiver = round % size;
        if (rank == receiver)
            receive_round(c, round);
        else
            send_round(c, round, receiver);
    }
}

/* Rank 1's message tagged 7 is at the head of its stream (sent before the
 * barrier, on another communicator, that rank 2 sends after): rank 0's
 * receive of tag 3 passes it over for rank 2's, then a receive naming
 * rank 1 and tag 7 takes it. */
static void test_tags(dt_comm *c, dt_comm *sync)
{
    if (size < 3) return;
    int32_t x = 1000 + rank, y = -1;
    dt_request *r;
    if (rank == 1) {
        must(c, dt_isend_tag(c, &x, 1, DT_I32, 0, 7, &r), "dt_isend_tag");
        must(c, dt_wait(r), "dt_wait");
    }
    must(sync, dt_barrier(sync), "dt_barrier");
    if (rank == 2) {
        must(c, dt_isend_tag(c, &x, 1, DT_I32, 0, 3, &r), "dt_isend_tag");
        must(c, dt_wait(r), "dt_wait");
    }
    if (rank != 0) return;
    int src = -2;
    must(c, dt_recv_any(c, &y, 1, DT_I32, 3, &src), "dt_recv_any(tag 3)");
    CHECK(src == 2 && y == 1002, "tag 3 from any rank: rank %d's %d, expected rank 2's 1002",
          src, y);
    must(c, dt_irecv_tag(c, &y, 1, DT_I32, 1, 7, &r), "dt_irecv_tag(rank 1, tag 7)");
    must(c, dt_wait(r), "dt_wait");
    CHECK(y == 1001, "tag 7 from rank 1: %d, expected 1001", y);
}

/* Rank 0 posts a receive from any source, then one from rank 1, and only
 * then (the barrier) rank 1 sends 11 and 22: the first posted takes the
 * first message, though the second may start first. */
static void test_posting_order(dt_comm *c, dt_comm *sync)
{
    int32_t m[2] = {11, 22}, got[2] = {0, 0};
    dt_request *r[2];
    int src = -2;
    if (rank == 0) {
        must(c, dt_irecv_any(c, &got[0], 1, DT_I32, 0, &src, &r[0]), "dt_irecv_any");
        must(c, dt_irecv(c, &got[1], 1, DT_I32, 1, &r[1]), "dt_irecv");
    }
    must(sync, dt_barrier(sync), "dt_barrier");
    if (rank == 1) {
        must(c, dt_isend(c, &m[0], 1, DT_I32, 0, &r[0]), "dt_isend");
        must(c, dt_isend(c, &m[1], 1, DT_I32, 0, &r[1]), "dt_isend");
    }
    if (rank > 1) return;
    must(c, dt_wait(r[0]), "dt_wait");
    must(c, dt_wait(r[1]), "dt_wait");
    if (rank == 0)
        CHECK(src == 1 && got[0] == 11 && got[1] == 22, "any source then rank 1: rank %d's %d, "
              "then %d; expected rank 1's 11, then 22", src, got[0], got[1]);
}

/* Ranks from 2 up leave the job (dt_comm_destroy, once the caller
 * returns), having sent nothing more; rank 1 sends after their goodbye has
 * had the time to arrive everywhere. Rank 0's receive from any source
 * takes rank 1's message: a peer that left and owes nothing is not one it
 * waits for (over TCP, its closed connection). */
static void test_peer_left(dt_comm *c)
{
    int32_t x = 77, y = -1;
    int src = -2;
    if (size < 3 || rank >= 2) return;
    if (rank == 1) {
        struct timespec ts = {1, 500000000}; /* past the 1 s a closed socket waits for word */
        nanosleep(&ts, NULL);
        must(c, dt_send(c, &x, 1, DT_I32, 0), "dt_send");
        return;
    }
    must(c, dt_recv_any(c, &y, 1, DT_I32, 0, &src), "dt_recv_any with peers gone");
    CHECK(src == 1 && y == 77, "with ranks 2 and up gone: rank %d's %d, expected rank 1's 77",
          src, y);
}

static void test_alone(dt_comm *c)
{
    dt_comm *self;
    must(c, dt_comm_split(c, rank, 0, &self), "dt_comm_split");
    int32_t y;
    int src = 5;
    dt_request *r = NULL;
    int rc = dt_recv_any(self, &y, 1, DT_I32, 0, &src);
    CHECK(rc == DT_ERR_INVALID, "dt_recv_any alone returned %d", rc);
    CHECK_ERR(rc, dt_comm_error(self), "dt_recv_any", "no other rank to receive from");
    CHECK(src == -1, "dt_recv_any alone: source %d, expected -1", src);
    rc = dt_irecv_any(self, &y, 1, DT_I32, 0, NULL, &r);
    CHECK(rc == DT_ERR_INVALID && !r, "dt_irecv_any alone returned %d", rc);
    y = 3;
    must(self, dt_allreduce(self, &y, &y, 1, DT_I32, DT_SUM), "dt_allreduce after the refusal");
    dt_comm_destroy(self);
}

int main(void)
{
    dt_comm *c, *sync;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    rank = dt_comm_rank(c);
    size = dt_comm_size(c);
    if (size < 2 || size > MAX_RANKS) {
        fprintf(stderr, "test_p2p_any: needs 2 to %d ranks, not %d\n", MAX_RANKS, size);
        return 2;
    }
    check_set_label("rank %d: ", rank);
    must(c, dt_comm_split(c, 0, rank, &sync), "dt_comm_split");
    test_races(c);
    test_tags(c, sync);
    test_posting_order(c, sync);
    test_alone(c);
    must(c, dt_barrier(c), "dt_barrier");
    dt_comm_destroy(sync);
    test_peer_left(c);
    if (rank == 0)
        printf("test_p2p_any: %d ranks over %s: %ld checks, %d failed on rank 0\n", size,
               dt_comm_transport(c), checks, failures);
    dt_comm_destroy(c);
    return failures ? 1 : 0;
}
