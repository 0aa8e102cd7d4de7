/*
 * The job's rendezvous: a key-value store served by rank 0 over TCP, and
 * the control channel through which ranks learn that the job failed.
 *
 * Server (rank 0 only): a thread that accepts authenticated connections of
 * two kinds. Request connections carry SET / GET (waits until the key
 * exists) / ADD (an integer counter). Control connections, one per rank,
 * carry HELLO, periodic HEARTBEATs, FAIL reports and a final BYE; the
 * server answers with ABORT broadcasts. The server aborts the job when a
 * control connection closes without BYE (the rank died), when a rank's
 * heartbeats stop for longer than the heartbeat timeout (stopped or hung
 * process), or when a rank reports FAIL. For a FAIL that is a timeout, the
 * server first looks for a rank whose heartbeats are late and names that
 * rank as the cause instead, so every rank reports the same culprit.
 * Every length read from the wire is checked against a limit before use.
 *
 * Its files: store_wire.c (the messages), store_server.c, store_accept.c,
 * store_keys.c and store_control.c (the server), store_client.c (request
 * connections), monitor.c (the control connection).
 *
 * A job joined through the caller's store (dt_comm_init_external) has no
 * server and no control channel: its dt_store hands SET, GET and ADD to
 * the caller's callbacks (store_external.c), and failures travel as keys
 * of that store (dt_kv_publish_abort, dt_kv_poll_abort).
 */
#ifndef DT_COMM_STORE_H
#define DT_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/comm.h"

#define DT_STORE_MAX_KEY 1024
#define DT_STORE_MAX_VALUE (64u << 20)
#define DT_STORE_MAX_MSG 1024

typedef struct dt_store_server dt_store_server;
typedef struct dt_store dt_store;
typedef struct dt_monitor dt_monitor;

/* Start serving on port for world_size ranks, where clients that dial
 * addr arrive (dt_net_listen_for: addr itself when it is this host's, so a
 * job on the loopback is not reachable from elsewhere; NULL: every
 * interface). */
int dt_store_server_start(const char *addr, int port, int world_size, const char *secret,
                          double heartbeat_timeout_s, dt_store_server **out, char *err,
                          size_t errlen);
/* Waits (until the deadline) for every rank's BYE, then stops the thread
 * and closes everything. */
void dt_store_server_stop(dt_store_server *s, uint64_t deadline_ns);

/* Who serves the store, as the errors name it when it cannot be reached
 * or stops answering: "rank 0" unless set (under `dtrain launch
 * --max-restarts`, "node 0's launcher"). Set it before connecting. */
void dt_store_set_server_name(const char *who);
const char *dt_store_server_name(void);

/* Request connection. Calls return 0 or DT_ERR_*; dt_store_error says why.
 * Not thread-safe: one caller at a time. */
int dt_store_connect(const char *host, int port, const char *secret, uint64_t deadline_ns,
                     dt_store **out, char *err, size_t errlen);
int dt_store_set(dt_store *s, const char *key, const void *val, size_t len);
/* Waits until key exists (or the deadline); *val is malloc'd, NUL-terminated
 * one byte past *len for convenience. */
int dt_store_get(dt_store *s, const char *key, void **val, size_t *len, uint64_t deadline_ns);
int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result);
/* n callers passing the same key all return once the last has arrived. */
int dt_store_barrier(dt_store *s, const char *key, int n, uint64_t deadline_ns);
/* Waits also end, with DT_ERR_ABORTED, once fd is readable (the job's
 * abort eventfd), so that no rank waits out its deadline in the store for
 * a job that has failed. */
void dt_store_set_abort_fd(dt_store *s, int fd);
const char *dt_store_error(const dt_store *s);
void dt_store_close(dt_store *s);

/* A request "connection" whose calls go to the caller's callbacks; the
 * barrier is made of them as over TCP. ops and ctx must outlive it. */
int dt_store_external(const dt_kv_ops *ops, void *ctx, dt_store **out);

/* The callbacks behind it (store_external.c), each 0 or a DT_ERR_* code
 * with a message in err. A get waits in slices, and ends early with
 * DT_ERR_ABORTED once abort_fd is readable (-1: none) or a failure was
 * published in the store. */
int dt_kv_set(const dt_kv_ops *ops, void *ctx, const char *key, const void *val, size_t len,
              char *err, size_t errlen);
int dt_kv_get(const dt_kv_ops *ops, void *ctx, const char *key, void **val, size_t *len,
              uint64_t deadline_ns, int abort_fd, char *err, size_t errlen);
int dt_kv_add(const dt_kv_ops *ops, void *ctx, const char *key, int64_t delta, int64_t *result,
              char *err, size_t errlen);
/* A job's failure, told to every rank through the store: the first
 * report's message is the one every rank reads. */
int dt_kv_publish_abort(const dt_kv_ops *ops, void *ctx, const char *msg, char *err,
                        size_t errlen);
/* 1 with the message when a failure was published, 0 when none, or a
 * DT_ERR_* code when the store cannot say. */
int dt_kv_poll_abort(const dt_kv_ops *ops, void *ctx, char *msg, size_t msglen, char *err,
                     size_t errlen);

/*
 * Control connection with its own thread: says HELLO(rank), sends a
 * heartbeat every interval, and calls on_abort(arg, code, message) once
 * when the server broadcasts ABORT or the connection to the server is lost
 * (then with DT_ERR_PEER and a message saying rank 0 / the store is gone),
 * and on_left(arg, rank) when another rank says BYE while the job runs
 * (on_left may be NULL). Both run on the monitor's thread.
 */
typedef struct {
    void (*on_abort)(void *arg, int code, const char *msg);
    void (*on_left)(void *arg, int rank);
} dt_monitor_events;
int dt_monitor_start(const char *host, int port, int rank, const char *secret,
                     double heartbeat_interval_s, uint64_t deadline_ns,
                     const dt_monitor_events *events, void *arg, dt_monitor **out, char *err,
                     size_t errlen);
/* Report this rank's failure. suspect is the rank the failure points at (-1
 * if none); is_timeout lets the server look for a late rank first. */
int dt_monitor_report(dt_monitor *m, int code, int suspect, int is_timeout, const char *msg);
/* Say BYE (clean exit), stop the thread, close. */
void dt_monitor_stop(dt_monitor *m);

#endif
