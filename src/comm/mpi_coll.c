/* Placeholder until MPI lands. */
#include "comm/algorithms.h"

int dt_have_mpi(void) { return 0; }

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
