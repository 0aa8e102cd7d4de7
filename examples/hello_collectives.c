/*
 * The communicator from a user's program: every rank contributes its rank
 * number, all-reduces, all-gathers, and rank 0 prints what it got.
 *
 *   dtrain launch -n 4 build/examples/hello_collectives
 *   mpirun -np 4 build/examples/hello_collectives
 */
#include <stdio.h>
#include <stdlib.h>

#include <dtrain/comm.h>

static void check(dt_comm *c, int rc, const char *what)
{
    if (rc == DT_OK) return;
    fprintf(stderr, "%s failed (%s): %s\n", what, dt_strerror(rc), dt_comm_error(c));
    exit(1);
}

int main(void)
{
    dt_comm *world;
    if (dt_comm_init(&world) != DT_OK) {
        fprintf(stderr, "dt_comm_init: %s\n", dt_last_error());
        return 1;
    }
    int rank = dt_comm_rank(world), size = dt_comm_size(world);

    float mine[4] = {(float)rank, 1, 2, 3}, sum[4];
    check(world, dt_allreduce(world, mine, sum, 4, DT_F32, DT_SUM), "dt_allreduce");

    int *ranks = malloc((size_t)size * sizeof *ranks);
    check(world, dt_allgather(world, &rank, ranks, 1, DT_I32), "dt_allgather");

    /* Even and odd ranks in sub-communicators, as data-parallel groups would be. */
    dt_comm *half;
    check(world, dt_comm_split(world, rank % 2, rank, &half), "dt_comm_split");
    int half_sum = 0;
    check(half, dt_allreduce(half, &rank, &half_sum, 1, DT_I32, DT_SUM), "dt_allreduce (half)");

    if (rank == 0) {
        printf("%d ranks over %s\n", size, dt_comm_transport(world));
        printf("allreduce: sum of ranks = %g (expected %d)\n", sum[0], size * (size - 1) / 2);
        printf("allgather:");
        for (int r = 0; r < size; r++) printf(" %d", ranks[r]);
        printf("\nsplit: sum of even ranks = %d\n", half_sum);
    }
    free(ranks);
    dt_comm_destroy(half);
    dt_comm_destroy(world);
    return 0;
}
