/*
 * A job's identity, made one way wherever it is made: by `dtrain launch`,
 * by the library's bootstrap (bootstrap/env.c) and by rank 0 under mpirun
 * (bootstrap/mpi_job.c).
 *
 * The secret proves membership of the job: every connection, to the store
 * or between ranks, is authenticated with it (auth.h). A random one is 128
 * bits from the kernel. The job id names the job's shared-memory segments
 * (/dev/shm/dtrain-<id>-...), which every user can list, so it is a hash of
 * the secret and the rendezvous address, never the secret itself: every
 * host computes the same id without talking, and two jobs that share a
 * secret but not a store still get different ids.
 *
 * A job that restarts (`dtrain launch --max-restarts`) gives each attempt
 * a secret of its own, derived from the job's, so that a rank left over
 * from an earlier attempt cannot authenticate to the new attempt's store
 * or ranks; every node derives the same one without talking.
 */
#ifndef DT_COMM_BOOTSTRAP_IDENTITY_H
#define DT_COMM_BOOTSTRAP_IDENTITY_H

#include <stddef.h>

#define DT_SECRET_HEX 32   /* characters of a random secret */
#define DT_JOB_ID_MAX 63   /* characters of a job id */
#define DT_ATTEMPT_SECRET_HEX 64 /* characters of an attempt's secret */

/* A random secret of DT_SECRET_HEX hex digits (len > DT_SECRET_HEX): 0, or
 * -1 with errno set. */
int dt_ident_random_secret(char *out, size_t len);
/* The job id of a secret and a rendezvous address: 16 hex digits of
 * SHA-256 (len >= 17). */
void dt_ident_job_id(const char *secret, const char *master_addr, int master_port, char *out,
                     size_t len);
/* Attempt k's secret: HMAC-SHA256 keyed with the job's secret over the
 * text "dtrain attempt k", in DT_ATTEMPT_SECRET_HEX hex digits (len >
 * DT_ATTEMPT_SECRET_HEX). 0, or -1 when OpenSSL fails. */
int dt_ident_attempt_secret(const char *secret, long attempt, char *out, size_t len);
/* Whether s may be a job id: 1 to DT_JOB_ID_MAX letters and digits (no
 * '/', which would leave /dev/shm, nor '-', which would make id "a" a
 * prefix of job "a-b"'s names). */
int dt_ident_job_id_valid(const char *s);

#endif
