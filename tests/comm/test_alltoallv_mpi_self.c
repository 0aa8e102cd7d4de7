/*
 * The all-to-all-v's `mpi` algorithm hands MPI_Alltoallv only the other
 * ranks' blocks: dt_alltoallv copies the rank's own block itself, so a
 * non-zero count for it made MPI copy it a second time (a third of the
 * data at 2 ranks, and the benchmark's MPI column paid for it). This
 * program defines MPI_Alltoallv, which the library's calls reach instead
 * of Open MPI's: it records the counts it is given and calls
 * PMPI_Alltoallv. Run it under mpirun.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h" /* tests/check.h */
#include "dtrain/comm.h"

static int calls, self_send, self_recv, others;

int MPI_Alltoallv(const void *sb, const int sc[], const int sd[], MPI_Datatype st, void *rb,
                  const int rc[], const int rd[], MPI_Datatype rt, MPI_Comm comm)
{
    int me, p;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &p);
    calls++;
    self_send = sc[me];
    self_recv = rc[me];
    others = 0;
    for (int j = 0; j < p; j++)
        if (j != me) others += sc[j];
    return PMPI_Alltoallv(sb, sc, sd, st, rb, rc, rd, rt, comm);
}

int main(void)
{
    dt_comm *c;
    if (dt_comm_init(&c) != 0) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_comm_rank(c), p = dt_comm_size(c);
    check_set_label("rank %d: ", rank);
    /* Rank i sends rank j 3 + i + 2j elements, valued 1000 i + 100 j + k. */
    size_t *v = calloc(4 * (size_t)p, sizeof *v), *sc = v, *sd = v + p, *rc = v + 2 * p,
           *rd = v + 3 * p, sn = 0, rn = 0;
    for (int j = 0; j < p; j++) {
        sc[j] = 3 + (size_t)rank + 2 * (size_t)j, sd[j] = sn, sn += sc[j];
        rc[j] = 3 + (size_t)j + 2 * (size_t)rank, rd[j] = rn, rn += rc[j];
    }
    int32_t *s = malloc(sn * sizeof *s), *r = malloc(rn * sizeof *r);
    for (int j = 0; j < p; j++)
        for (size_t k = 0; k < sc[j]; k++) s[sd[j] + k] = 1000 * rank + 100 * j + (int32_t)k;
    for (size_t k = 0; k < rn; k++) r[k] = -1;
    CHECK(dt_comm_set_algo(c, "alltoallv", "mpi") == 0, "dt_comm_set_algo(mpi): %s",
          dt_comm_error(c));
    int rc_call = dt_alltoallv(c, s, sc, sd, r, rc, rd, DT_I32);
    CHECK(rc_call == 0, "dt_alltoallv: %s", dt_comm_error(c));
    CHECK(calls == 1, "MPI_Alltoallv called %d times, expected once", calls);
    CHECK(self_send == 0 && self_recv == 0,
          "MPI_Alltoallv was given our own block (send %d, receive %d elements): MPI copies "
          "it again after dt_alltoallv did", self_send, self_recv);
    CHECK(others == (int)(sn - sc[rank]), "MPI_Alltoallv moves %d elements to the others, "
          "expected %zu", others, sn - sc[rank]);
    for (int j = 0; j < p; j++)
        for (size_t k = 0; k < rc[j]; k++)
            CHECK(r[rd[j] + k] == 1000 * j + 100 * rank + (int32_t)k,
                  "element %zu from rank %d: %d", k, j, r[rd[j] + k]);
    free(s);
    free(r);
    free(v);
    dt_comm_destroy(c);
    return finish("test_alltoallv_mpi_self");
}
