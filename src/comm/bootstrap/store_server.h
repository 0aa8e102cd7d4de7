/*
 * The store's server, inside: its state and what its files share. The
 * server is one thread around poll() with non-blocking sockets and an
 * output queue per connection, so no client can stall it
 * (store_server.c); the handshake of a new connection runs in a
 * short-lived thread of its own, bounded in number and in time, and hands
 * the socket over once it has passed (store_accept.c). Request
 * connections read and write keys (store_keys.c); control connections,
 * one per rank, carry heartbeats and failures, from which the server
 * gives the job's verdict (store_control.c).
 */
#ifndef DT_COMM_BOOTSTRAP_STORE_SERVER_H
#define DT_COMM_BOOTSTRAP_STORE_SERVER_H

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/bootstrap/store.h"
#include "comm/bootstrap/store_wire.h"

#define NS_PER_S 1000000000ull
#define HANDSHAKE_NS (5 * NS_PER_S) /* a legitimate client needs milliseconds */
#define MAX_HANDSHAKES 128          /* handshake threads at once; the rest wait in the backlog */
#define HANDSHAKE_STACK (256 * 1024)
#define TICK_MS 50                  /* heartbeat and stop checks */
#define MAX_MSGS_PER_TURN 256       /* fairness between busy connections */
#define MAX_WAITERS_PER_CONN 1024
#define MAX_QUEUED_BYTES (256u << 20)
#define FIRST_BUCKETS 256

enum { CONN_NEW = 0, CONN_REQUEST, CONN_CONTROL };

typedef struct conn {
    int fd;
    int kind;
    int rank;     /* CONN_CONTROL */
    int nwaiters; /* GETs of this connection waiting for their key */
    int dead;     /* to be closed at the end of this turn */
    int dead_by_error;
    int out_broken; /* a send failed: what is queued for it is dropped */
    char why[192];
    char peer[80];
    /* Input: the header, then the body (key and value, plus a NUL). */
    unsigned char raw[DT_WIRE_HDR_SIZE];
    size_t raw_got;
    dt_wire_hdr hdr;
    unsigned char *body;
    size_t body_len, body_got;
    /* Output not yet accepted by the socket. */
    unsigned char *out;
    size_t out_off, out_len, out_cap;
} conn;

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    unsigned char *key;
    uint32_t key_len;
    unsigned char *val; /* NUL-terminated one past val_len */
    uint32_t val_len;
} entry;

typedef struct {
    conn *c;
    uint32_t id;
    uint32_t key_len;
    unsigned char *key;
} waiter;

typedef struct {
    conn *ctl; /* live control connection, or NULL */
    int seen;  /* said HELLO at some point */
    int bye;
    int reported; /* sent a FAIL */
    uint64_t last_beat_ns;
    uint32_t interval_ms;
} rank_state;

/* A FAIL waits for the end of the turn, so that other events read in the
 * same turn (a lost rank, a heartbeat) count before it is judged. */
typedef struct {
    int set;
    int rank, code, suspect, is_timeout;
    char msg[DT_STORE_MAX_MSG + 1];
} fail_report;

struct dt_store_server {
    int listen_fd;
    int wake_fd;
    int world_size;
    char *secret;
    double beat_timeout_s;
    pthread_t thread;
    int thread_started;

    /* Owned by the server thread. */
    conn **conns;
    int nconns, conns_cap;
    struct pollfd *pfds;
    int pfds_cap;
    rank_state *ranks;
    entry **buckets;
    size_t nbuckets, nentries;
    waiter *waiters;
    int nwaiters, waiters_cap;
    int aborted;
    int abort_code;
    char abort_msg[DT_STORE_MAX_MSG + 1]; /* also told to ranks that say HELLO later */
    fail_report fail;

    /* Shared with handshake threads and dt_store_server_stop: under lock. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int handshake_fd[MAX_HANDSHAKES]; /* -1 when the slot is free */
    int nhandshakes;
    int ready[MAX_HANDSHAKES]; /* authenticated sockets to adopt */
    int nready;
    int closing;
    int stop_requested;
    uint64_t stop_deadline_ns;
};

/* store_server.c: connections. */
void dt_srv_wake(dt_store_server *s);
/* Mark c for closing at the end of the turn; the first reason wins. */
void dt_srv_drop(conn *c, int is_error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Queue one message and send what the socket takes now. */
void dt_srv_send(conn *c, const dt_wire_hdr *h, const void *val);
void dt_srv_reply(conn *c, uint32_t id, int status, const void *val, size_t len);
void dt_srv_reply_error(conn *c, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dt_srv_send_abort(conn *c, int code, const char *msg);
/* Take an authenticated socket as a new connection. */
void dt_srv_adopt(dt_store_server *s, int fd);

/* store_accept.c: new connections and their handshakes. */
int dt_srv_handshake_room(dt_store_server *s);
void dt_srv_accept(dt_store_server *s);
void dt_srv_adopt_ready(dt_store_server *s);
/* After the server thread has ended: cut short the handshakes still
 * running and wait for their threads. */
void dt_srv_end_handshakes(dt_store_server *s);

/* store_keys.c: SET, GET, ADD, CANCEL on request connections. */
int dt_srv_keys_init(dt_store_server *s);
void dt_srv_keys_free(dt_store_server *s);
void dt_srv_on_set(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body);
void dt_srv_on_get(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body);
void dt_srv_on_add(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body);
void dt_srv_on_cancel(dt_store_server *s, conn *c, const dt_wire_hdr *h);
/* Forget the GETs that c was waiting on (c is going away). */
void dt_srv_forget_waiters(dt_store_server *s, conn *c);

/* store_control.c: control connections and the job's verdict. */
void dt_srv_on_hello(dt_store_server *s, conn *c, const dt_wire_hdr *h);
void dt_srv_on_heartbeat(dt_store_server *s, conn *c);
void dt_srv_on_fail(dt_store_server *s, conn *c, const dt_wire_hdr *h, const unsigned char *body);
void dt_srv_on_bye(dt_store_server *s, conn *c);
/* A control connection is gone. */
void dt_srv_rank_gone(dt_store_server *s, conn *c);
/* End of a turn: judge the FAIL reported in it, and look for silent ranks. */
void dt_srv_resolve_fail(dt_store_server *s);
void dt_srv_check_heartbeats(dt_store_server *s);
/* Whether everyone who needs the store is finished with it. */
int dt_srv_ranks_done(dt_store_server *s);

#endif
