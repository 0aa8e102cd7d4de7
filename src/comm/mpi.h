/*
 * MPI underneath: what the rest of src/comm asks of it. The functions live
 * in bootstrap/mpi_job.c (joining the job, MPI communicators),
 * transport/mpi_link.c (links over MPI point-to-point, whose setup
 * transport/transport.h declares) and algo/mpi_coll.c (MPI's own
 * collectives). All of them exist in builds without MPI too
 * (DTRAIN_HAVE_MPI undefined), where they do nothing or fail with a
 * message that says so.
 *
 * A communicator's c->mpi, when set, points to a malloc'd MPI_Comm whose
 * ranks are the communicator's ranks: the world's is a dup of
 * MPI_COMM_WORLD, a split's is MPI_Comm_split of its parent's with the same
 * colour and key (both order members by key, then old rank).
 */
#ifndef DT_COMM_MPI_H
#define DT_COMM_MPI_H

#include <stddef.h>

#include "comm/bootstrap/bootstrap.h"
#include "dtrain/comm.h"

/* Whether this build has MPI underneath. */
int dt_have_mpi(void);
/* Whether Open MPI's mpirun started this process (its runtime's variables
 * are there, not only OMPI_COMM_WORLD_RANK, which tests set by hand). */
int dt_mpi_launched(void);

/* Job creation, right after dt_bootstrap_from_env. Under mpirun with MPI:
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) unless MPI is up already, then rank
 * 0's store address, port, secret and job id replace everyone's (one
 * MPI_Bcast), so a multi-host job needs no MASTER_ADDR. Also refuses
 * DTRAIN_TRANSPORT=mpi where it cannot work. 0, or DT_ERR_INVALID with
 * the reason in err. */
int dt_mpi_job_init(dt_bootstrap *b, char *err, size_t len);
/* The world communicator's destroy: MPI_Finalize, when dt_mpi_job_init
 * initialised MPI and the job did not fail (a failed job leaves MPI to
 * mpirun: finalizing waits for every rank, which may never come). */
void dt_mpi_job_fini(int job_failed);

/* The world communicator's c->mpi (a dup of MPI_COMM_WORLD) when the job
 * runs on MPI; nothing otherwise. 0, or fails c. */
int dt_mpi_comm_world(dt_comm *c);
/* MPI_Comm_split of c->mpi with dtrain's colour (DT_UNDEFINED too) and
 * key, collective over c; *out is the new handle for c->mpi of the split,
 * NULL when c has none or for DT_UNDEFINED. 0, or fails c. */
int dt_mpi_comm_split(dt_comm *c, int color, int key, void **out);
/* Frees a c->mpi handle (NULL is fine). */
void dt_mpi_comm_release(void *mpi);

/* Called on a job abort: if a blocking MPI collective is in flight in
 * this process, print why and MPI_Abort (it could never return). */
void dt_mpi_abort_if_blocked(const char *why);

#ifdef DTRAIN_HAVE_MPI
#include <mpi.h>

#include "comm/comm_internal.h"

static inline MPI_Comm dt_mpi_comm(const dt_comm *c) { return *(const MPI_Comm *)c->mpi; }
/* Fail c with MPI's text for error code mpi_rc: "<what>: <MPI's words>". */
int dt_mpi_fail(dt_comm *c, int mpi_rc, int peer, const char *what);
/* The user ops for bf16 and f16 reductions (mpi_coll.c), made after
 * MPI_Init and freed before MPI_Finalize. */
int dt_mpi_ops_create(void);
void dt_mpi_ops_free(void);
#endif

#endif
