/*
 * The job's key-value store and control channel (see store.h).
 *
 * Wire format. Every message is a 24-byte little-endian header followed by
 * key_len bytes of key and val_len bytes of value:
 *
 *   off size field
 *    0   1   type     (MSG_*)
 *    1   1   flag     FAIL: 1 when the failure is a timeout
 *    2   2   magic    0x5344 ("DS"), catches a stream that is out of step
 *    4   4   id       request id, echoed by the REPLY (CANCEL: the GET's id)
 *    8   4   a        HELLO: rank; FAIL, ABORT: code; REPLY: status (0 or DT_ERR_*)
 *   12   4   b        HELLO: heartbeat interval in ms; FAIL: suspect rank
 *   16   4   key_len  1..DT_STORE_MAX_KEY for SET, GET, ADD; 0 otherwise
 *   20   4   val_len  SET, REPLY: <= DT_STORE_MAX_VALUE; ADD: 8 (int64 delta);
 *                     FAIL, ABORT: <= DT_STORE_MAX_MSG (text); 0 otherwise
 *
 * Request connections send SET, GET, ADD (each answered by one REPLY with
 * the same id; a GET's REPLY waits until the key exists; an ADD's REPLY
 * carries the new int64) and CANCEL (a GET the client stopped waiting for;
 * no answer). A REPLY with a non-zero status carries an error text.
 * A connection whose first message is HELLO is a control connection: it then
 * sends HEARTBEAT, FAIL and BYE, and receives one REPLY to its HELLO and at
 * most one ABORT. Counters made by ADD are stored as decimal text, so a GET
 * of a counter reads "3".
 *
 * The server is one thread around poll() with non-blocking sockets and an
 * output queue per connection, so no client can stall it. The handshake of
 * a new connection runs in a short-lived thread of its own (bounded in
 * number and in time) and hands the socket over once it has passed.
 */
#include "comm/store.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/auth.h"
#include "comm/net.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define AUTH_CONTEXT "store"
#define NS_PER_S 1000000000ull

/* ==== wire format ========================================================= */

#define WIRE_MAGIC 0x5344u
#define HDR_SIZE 24

enum {
    MSG_SET = 1,
    MSG_GET = 2,
    MSG_ADD = 3,
    MSG_CANCEL = 4,
    MSG_HELLO = 16,
    MSG_HEARTBEAT = 17,
    MSG_FAIL = 18,
    MSG_BYE = 19,
    MSG_REPLY = 32,
    MSG_ABORT = 33
};

typedef struct {
    uint8_t type;
    uint8_t flag;
    uint32_t id;
    int32_t a;
    int32_t b;
    uint32_t key_len;
    uint32_t val_len;
} wire_hdr;

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_i64(unsigned char *p, int64_t v)
{
    put_u32(p, (uint32_t)((uint64_t)v & 0xffffffffu));
    put_u32(p + 4, (uint32_t)((uint64_t)v >> 32));
}

static int64_t get_i64(const unsigned char *p)
{
    return (int64_t)((uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32);
}

static void hdr_encode(const wire_hdr *h, unsigned char *p)
{
    p[0] = h->type;
    p[1] = h->flag;
    p[2] = (unsigned char)(WIRE_MAGIC & 0xff);
    p[3] = (unsigned char)(WIRE_MAGIC >> 8);
    put_u32(p + 4, h->id);
    put_u32(p + 8, (uint32_t)h->a);
    put_u32(p + 12, (uint32_t)h->b);
    put_u32(p + 16, h->key_len);
    put_u32(p + 20, h->val_len);
}

static void hdr_decode(const unsigned char *p, wire_hdr *h)
{
    h->type = p[0];
    h->flag = p[1];
    h->id = get_u32(p + 4);
    h->a = (int32_t)get_u32(p + 8);
    h->b = (int32_t)get_u32(p + 12);
    h->key_len = get_u32(p + 16);
    h->val_len = get_u32(p + 20);
}

static int check_key_len(uint32_t key_len, char *why, size_t len)
{
    if (key_len >= 1 && key_len <= DT_STORE_MAX_KEY) return 0;
    snprintf(why, len, "key length %" PRIu32 " is outside 1..%d", key_len, DT_STORE_MAX_KEY);
    return -1;
}

static int check_val_len(uint32_t val_len, uint32_t limit, char *why, size_t len)
{
    if (val_len <= limit) return 0;
    snprintf(why, len, "value length %" PRIu32 " exceeds the limit of %" PRIu32, val_len, limit);
    return -1;
}

static int check_no_key(const wire_hdr *h, char *why, size_t len)
{
    if (h->key_len == 0) return 0;
    snprintf(why, len, "message type %u must carry no key", h->type);
    return -1;
}

static int check_empty(const wire_hdr *h, char *why, size_t len)
{
    if (h->key_len == 0 && h->val_len == 0) return 0;
    snprintf(why, len, "message type %u must carry no key or value", h->type);
    return -1;
}

/* Validate a header before any of its lengths is used: 0, or -1 with the
 * reason in why. */
static int hdr_check(const unsigned char *raw, const wire_hdr *h, char *why, size_t len)
{
    if ((raw[2] | raw[3] << 8) != WIRE_MAGIC) {
        snprintf(why, len, "bad magic (not a dtrain store message, or out of step)");
        return -1;
    }
    switch (h->type) {
    case MSG_SET:
        if (check_key_len(h->key_len, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_VALUE, why, len);
    case MSG_GET:
        if (check_key_len(h->key_len, why, len)) return -1;
        return check_val_len(h->val_len, 0, why, len);
    case MSG_ADD:
        if (check_key_len(h->key_len, why, len)) return -1;
        if (h->val_len == 8) return 0;
        snprintf(why, len, "ADD carries %" PRIu32 " value bytes instead of 8", h->val_len);
        return -1;
    case MSG_CANCEL:
    case MSG_HELLO:
    case MSG_HEARTBEAT:
    case MSG_BYE:
        return check_empty(h, why, len);
    case MSG_FAIL:
    case MSG_ABORT:
        if (check_no_key(h, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_MSG, why, len);
    case MSG_REPLY:
        if (check_no_key(h, why, len)) return -1;
        return check_val_len(h->val_len, DT_STORE_MAX_VALUE, why, len);
    default:
        snprintf(why, len, "unknown message type %u", h->type);
        return -1;
    }
}

/* Blocking-style send of one message (clients and the monitor). */
static int send_msg(int fd, const wire_hdr *h, const void *key, const void *val,
                    uint64_t deadline_ns)
{
    unsigned char buf[HDR_SIZE + DT_STORE_MAX_KEY];
    hdr_encode(h, buf);
    if (h->key_len) memcpy(buf + HDR_SIZE, key, h->key_len);
    int rc = dt_net_write_all(fd, buf, HDR_SIZE + h->key_len, deadline_ns);
    if (rc == 0 && h->val_len) rc = dt_net_write_all(fd, val, h->val_len, deadline_ns);
    return rc;
}

/* Blocking-style read of one message (clients and the monitor). *body gets
 * key and value in one malloc'd block with a NUL after them. */
static int read_msg(int fd, wire_hdr *h, unsigned char **body, uint64_t deadline_ns, char *why,
                    size_t whylen)
{
    unsigned char raw[HDR_SIZE];
    *body = NULL;
    int rc = dt_net_read_all(fd, raw, HDR_SIZE, deadline_ns);
    if (rc) return rc;
    hdr_decode(raw, h);
    if (hdr_check(raw, h, why, whylen)) return DT_ERR_PROTOCOL;
    size_t n = (size_t)h->key_len + h->val_len;
    unsigned char *b = malloc(n + 1);
    if (!b) {
        snprintf(why, whylen, "out of memory for a %zu-byte message", n);
        return DT_ERR_NOMEM;
    }
    rc = dt_net_read_all(fd, b, n, deadline_ns);
    if (rc) {
        free(b);
        return rc;
    }
    b[n] = 0;
    *body = b;
    return 0;
}

/* Wait until fd has something to read, without consuming it, so that a
 * timeout never leaves half a message behind. */
static int wait_readable(int fd, uint64_t deadline_ns)
{
    for (;;) {
        int ms = -1;
        if (deadline_ns) {
            uint64_t now = dt_now_ns();
            if (now >= deadline_ns) return DT_ERR_TIMEOUT;
            uint64_t left = (deadline_ns - now + 999999) / 1000000;
            ms = left > 1000000000 ? 1000000000 : (int)left;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
        int r = poll(&p, 1, ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return DT_ERR_SYSTEM;
    }
}

static void format_host_port(char *buf, size_t len, const char *host, int port)
{
    snprintf(buf, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* ==== server: state ======================================================== */

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
    char why[192];
    char peer[80];
    /* Input: the header, then the body (key and value, plus a NUL). */
    unsigned char raw[HDR_SIZE];
    size_t raw_got;
    wire_hdr hdr;
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

static void wake_server(dt_store_server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof one);
    (void)w; /* a full counter still wakes the poll */
}


/* ==== server: connections ================================================== */

/* Mark c for closing at the end of the turn; the first reason wins. */
static void conn_drop(conn *c, int is_error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_drop(conn *c, int is_error, const char *fmt, ...)
{
    if (c->dead) return;
    c->dead = 1;
    c->dead_by_error = is_error;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    if (is_error) dt_log(DT_LOG_WARN, "store: dropping the connection from %s: %s", c->peer, c->why);
}

static void conn_flush(conn *c)
{
    while (c->out_off < c->out_len) {
        ssize_t n = send(c->fd, c->out + c->out_off, c->out_len - c->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        conn_drop(c, 0, "send failed: %s", n < 0 ? strerror(errno) : "no progress");
        return;
    }
    c->out_off = c->out_len = 0;
}

static int out_reserve(conn *c, size_t need)
{
    if (c->out_off > 0) { /* slide the unsent part to the front */
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_cap - c->out_len >= need) return 0;
    size_t cap = c->out_cap ? c->out_cap * 2 : 4096;
    while (cap - c->out_len < need) cap *= 2;
    unsigned char *p = realloc(c->out, cap);
    if (!p) return -1;
    c->out = p;
    c->out_cap = cap;
    return 0;
}

/* Queue one message and send what the socket takes now. */
static void conn_send(conn *c, const wire_hdr *h, const void *val)
{
    if (c->dead) return;
    size_t need = HDR_SIZE + (size_t)h->val_len;
    if (c->out_len - c->out_off + need > MAX_QUEUED_BYTES) {
        conn_drop(c, 1, "it does not read its replies (%zu bytes queued)",
                  c->out_len - c->out_off);
        return;
    }
    if (out_reserve(c, need)) {
        conn_drop(c, 1, "out of memory queueing %zu bytes for it", need);
        return;
    }
    hdr_encode(h, c->out + c->out_len);
    if (h->val_len) memcpy(c->out + c->out_len + HDR_SIZE, val, h->val_len);
    c->out_len += need;
    conn_flush(c);
}

static void reply(conn *c, uint32_t id, int status, const void *val, size_t len)
{
    wire_hdr h = {.type = MSG_REPLY, .id = id, .a = status, .val_len = (uint32_t)len};
    conn_send(c, &h, val);
}

static void reply_error(conn *c, uint32_t id, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_error(conn *c, uint32_t id, int code, const char *fmt, ...)
{
    char msg[DT_STORE_MAX_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    reply(c, id, code, msg, strlen(msg));
}

static void send_abort(conn *c, int code, const char *msg)
{
    size_t len = strlen(msg);
    if (len > DT_STORE_MAX_MSG) len = DT_STORE_MAX_MSG;
    wire_hdr h = {.type = MSG_ABORT, .a = code, .val_len = (uint32_t)len};
    conn_send(c, &h, msg);
}

static void conn_adopt(dt_store_server *s, int fd)
{
    conn *c = calloc(1, sizeof *c);
    if (!c || dt_net_set_nonblock(fd, 1) != 0) {
        dt_log(DT_LOG_WARN, "store: cannot take a new connection (out of memory or fcntl failed)");
        free(c);
        close(fd);
        return;
    }
    if (s->nconns == s->conns_cap) {
        int cap = s->conns_cap ? s->conns_cap * 2 : 64;
        conn **p = realloc(s->conns, (size_t)cap * sizeof *p);
        if (!p) {
            dt_log(DT_LOG_WARN, "store: out of memory for a new connection");
            free(c);
            close(fd);
            return;
        }
        s->conns = p;
        s->conns_cap = cap;
    }
    dt_net_tune(fd);
    c->fd = fd;
    c->rank = -1;
    dt_net_peer_name(fd, c->peer, sizeof c->peer);
    s->conns[s->nconns++] = c;
}

/* ==== server: keys and waiters ============================================= */

static entry *table_find(dt_store_server *s, const unsigned char *key, uint32_t len)
{
    uint64_t h = dt_fnv1a64(key, len);
    for (entry *e = s->buckets[h % s->nbuckets]; e; e = e->next)
        if (e->hash == h && e->key_len == len && memcmp(e->key, key, len) == 0) return e;
    return NULL;
}

/* Double the buckets when the chains grow long; on failure keep going with
 * long chains. */
static void table_grow(dt_store_server *s)
{
    size_t n = s->nbuckets * 2;
    entry **b = calloc(n, sizeof *b);
    if (!b) return;
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = b[e->hash % n];
            b[e->hash % n] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
}

static unsigned char *copy_bytes(const void *src, size_t len)
{
    unsigned char *p = malloc(len + 1);
    if (!p) return NULL;
    if (len) memcpy(p, src, len);
    p[len] = 0;
    return p;
}

/* Set key to val; NULL when out of memory. */
static entry *table_put(dt_store_server *s, const unsigned char *key, uint32_t key_len,
                        const void *val, uint32_t val_len)
{
    unsigned char *v = copy_bytes(val, val_len);
    if (!v) return NULL;
    entry *e = table_find(s, key, key_len);
    if (e) {
        free(e->val);
        e->val = v;
        e->val_len = val_len;
        return e;
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = copy_bytes(key, key_len))) {
        free(e);
        free(v);
        return NULL;
    }
    e->key_len = key_len;
    e->val = v;
    e->val_len = val_len;
    e->hash = dt_fnv1a64(key, key_len);
    e->next = s->buckets[e->hash % s->nbuckets];
    s->buckets[e->hash % s->nbuckets] = e;
    if (++s->nentries > s->nbuckets) table_grow(s);
    return e;
}

static int waiter_add(dt_store_server *s, conn *c, uint32_t id, const unsigned char *key,
                      uint32_t key_len)
{
    if (s->nwaiters == s->waiters_cap) {
        int cap = s->waiters_cap ? s->waiters_cap * 2 : 64;
        waiter *p = realloc(s->waiters, (size_t)cap * sizeof *p);
        if (!p) return -1;
        s->waiters = p;
        s->waiters_cap = cap;
    }
    unsigned char *k = copy_bytes(key, key_len);
    if (!k) return -1;
    s->waiters[s->nwaiters++] = (waiter){.c = c, .id = id, .key_len = key_len, .key = k};
    c->nwaiters++;
    return 0;
}

/* Remove the waiters for which match() holds, keeping the others in order. */
static void waiters_remove(dt_store_server *s, int (*match)(const waiter *, const void *),
                           const void *arg, const entry *answer)
{
    int j = 0;
    for (int i = 0; i < s->nwaiters; i++) {
        waiter *w = &s->waiters[i];
        if (!match(w, arg)) {
            s->waiters[j++] = *w;
            continue;
        }
        if (answer) reply(w->c, w->id, 0, answer->val, answer->val_len);
        w->c->nwaiters--;
        free(w->key);
    }
    s->nwaiters = j;
}

static int waiter_wants(const waiter *w, const void *arg)
{
    const entry *e = arg;
    return w->key_len == e->key_len && memcmp(w->key, e->key, e->key_len) == 0;
}

static int waiter_of_conn(const waiter *w, const void *arg) { return w->c == arg; }

typedef struct {
    const conn *c;
    uint32_t id;
} waiter_ref;

static int waiter_is(const waiter *w, const void *arg)
{
    const waiter_ref *r = arg;
    return w->c == r->c && w->id == r->id;
}

/* ==== server: abort ======================================================== */

static void job_abort(dt_store_server *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The first cause wins; every control connection hears it once. */
static void job_abort(dt_store_server *s, int code, const char *fmt, ...)
{
    if (s->aborted) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->abort_msg, sizeof s->abort_msg, fmt, ap);
    va_end(ap);
    s->aborted = 1;
    s->abort_code = code;
    dt_log(DT_LOG_INFO, "store: aborting the job: %s", s->abort_msg);
    /* Rank 0, the store's own process, hears last: once told it may exit
     * and take the store with it. */
    for (int i = 1; i <= s->world_size; i++) {
        rank_state *rs = &s->ranks[i % s->world_size];
        if (rs->ctl && !rs->bye) send_abort(rs->ctl, code, s->abort_msg);
    }
}

static double beat_age_s(const rank_state *rs, uint64_t now)
{
    return now > rs->last_beat_ns ? (double)(now - rs->last_beat_ns) * 1e-9 : 0.0;
}

/* A live rank whose heartbeats are over two intervals late, the latest one
 * first; -1 if none. */
static int find_late_rank(dt_store_server *s, int except, double *age_out)
{
    uint64_t now = dt_now_ns();
    int late = -1;
    double worst = 0;
    for (int r = 0; r < s->world_size; r++) {
        rank_state *rs = &s->ranks[r];
        if (r == except || !rs->ctl || rs->bye || rs->interval_ms == 0) continue;
        double age = beat_age_s(rs, now);
        if (age > 2.0 * rs->interval_ms * 1e-3 && age > worst) {
            late = r;
            worst = age;
        }
    }
    *age_out = worst;
    return late;
}

static void resolve_fail(dt_store_server *s)
{
    fail_report *f = &s->fail;
    if (!f->set || s->aborted) return;
    f->set = 0;
    double age;
    int late = f->is_timeout ? find_late_rank(s, f->rank, &age) : -1;
    if (late >= 0) {
        job_abort(s, DT_ERR_TIMEOUT,
                  "rank %d is unresponsive: no heartbeat for %.1f s (stopped or hung); "
                  "rank %d reported: %s",
                  late, age, f->rank, f->msg);
        return;
    }
    job_abort(s, f->code, "%s", f->msg);
}

static void check_heartbeats(dt_store_server *s)
{
    if (s->aborted || s->beat_timeout_s <= 0) return;
    uint64_t now = dt_now_ns();
    int silent = -1;
    double worst = s->beat_timeout_s;
    for (int r = 0; r < s->world_size; r++) {
        rank_state *rs = &s->ranks[r];
        if (!rs->ctl || rs->bye) continue;
        double age = beat_age_s(rs, now);
        if (age > worst) {
            silent = r;
            worst = age;
        }
    }
    if (silent >= 0)
        job_abort(s, DT_ERR_TIMEOUT, "rank %d is unresponsive: no heartbeat for %.1f s (stopped or hung)",
                  silent, worst);
}

/* A control connection is gone: a rank that neither said BYE nor reported
 * its own failure was lost. */
static void rank_gone(dt_store_server *s, conn *c)
{
    rank_state *rs = &s->ranks[c->rank];
    rs->ctl = NULL;
    if (rs->bye || rs->reported) return;
    if (c->dead_by_error)
        job_abort(s, DT_ERR_PEER, "rank %d was lost: the store dropped its connection (%s)",
                  c->rank, c->why);
    else
        job_abort(s, DT_ERR_PEER,
                  "rank %d was lost: its connection to the store closed without a goodbye "
                  "(the process died or was killed)",
                  c->rank);
}

/* ==== server: messages ===================================================== */

static void on_set(dt_store_server *s, conn *c, const wire_hdr *h, const unsigned char *body)
{
    entry *e = table_put(s, body, h->key_len, body + h->key_len, h->val_len);
    if (!e) {
        reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
        return;
    }
    reply(c, h->id, 0, NULL, 0);
    waiters_remove(s, waiter_wants, e, e);
}

static void on_get(dt_store_server *s, conn *c, const wire_hdr *h, const unsigned char *body)
{
    entry *e = table_find(s, body, h->key_len);
    if (e) {
        reply(c, h->id, 0, e->val, e->val_len);
        return;
    }
    if (c->nwaiters >= MAX_WAITERS_PER_CONN) {
        conn_drop(c, 1, "more than %d GETs waiting at once", MAX_WAITERS_PER_CONN);
        return;
    }
    if (waiter_add(s, c, h->id, body, h->key_len))
        reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
}

/* A counter's value: absent is 0; anything but a whole decimal int64 is an
 * error. */
static int parse_counter(const entry *e, int64_t *out)
{
    *out = 0;
    if (!e) return 0;
    if (e->val_len == 0 || e->val_len > 20) return -1;
    char *end;
    errno = 0;
    long long v = strtoll((const char *)e->val, &end, 10);
    if (errno || end != (const char *)e->val + e->val_len) return -1;
    *out = v;
    return 0;
}

static void on_add(dt_store_server *s, conn *c, const wire_hdr *h, const unsigned char *body)
{
    int64_t delta = get_i64(body + h->key_len);
    int64_t cur, sum;
    if (parse_counter(table_find(s, body, h->key_len), &cur)) {
        reply_error(c, h->id, DT_ERR_INVALID, "ADD on key '%.*s', which does not hold an integer",
                    (int)h->key_len, (const char *)body);
        return;
    }
    if (__builtin_add_overflow(cur, delta, &sum)) {
        reply_error(c, h->id, DT_ERR_INVALID, "ADD on key '%.*s' overflows int64",
                    (int)h->key_len, (const char *)body);
        return;
    }
    char text[32];
    int len = snprintf(text, sizeof text, "%" PRId64, sum);
    entry *e = table_put(s, body, h->key_len, text, (uint32_t)len);
    if (!e) {
        reply_error(c, h->id, DT_ERR_NOMEM, "the store is out of memory");
        return;
    }
    unsigned char result[8];
    put_i64(result, sum);
    reply(c, h->id, 0, result, sizeof result);
    waiters_remove(s, waiter_wants, e, e);
}

static void on_cancel(dt_store_server *s, conn *c, const wire_hdr *h)
{
    waiter_ref ref = {.c = c, .id = h->id};
    waiters_remove(s, waiter_is, &ref, NULL);
}

static void on_hello(dt_store_server *s, conn *c, const wire_hdr *h)
{
    int r = h->a;
    if (r < 0 || r >= s->world_size) {
        reply_error(c, h->id, DT_ERR_INVALID, "rank %d is outside the job's %d ranks", r,
                    s->world_size);
        conn_drop(c, 1, "HELLO from rank %d, outside the job's %d ranks", r, s->world_size);
        return;
    }
    rank_state *rs = &s->ranks[r];
    if (rs->ctl) {
        reply_error(c, h->id, DT_ERR_INVALID,
                    "rank %d is already connected to the store (two processes with the same rank?)",
                    r);
        conn_drop(c, 1, "a second HELLO for rank %d", r);
        return;
    }
    c->kind = CONN_CONTROL;
    c->rank = r;
    *rs = (rank_state){.ctl = c, .seen = 1, .last_beat_ns = dt_now_ns(),
                       .interval_ms = h->b > 0 ? (uint32_t)h->b : 0};
    reply(c, h->id, 0, NULL, 0);
    if (s->aborted) send_abort(c, s->abort_code, s->abort_msg);
}

static void on_fail(dt_store_server *s, conn *c, const wire_hdr *h, const unsigned char *body)
{
    s->ranks[c->rank].reported = 1;
    if (s->aborted) return;
    fail_report *f = &s->fail;
    /* Within a turn a definite failure explains more than a timeout or a
     * lost peer, which are often its echoes. */
    int weak_old = f->is_timeout || f->code == DT_ERR_PEER;
    int weak_new = h->flag || h->a == DT_ERR_PEER;
    if (f->set && !(weak_old && !weak_new)) return;
    f->set = 1;
    f->rank = c->rank;
    f->code = h->a < 0 ? h->a : DT_ERR_ABORTED;
    f->suspect = h->b;
    f->is_timeout = h->flag != 0;
    snprintf(f->msg, sizeof f->msg, "%.*s", (int)h->val_len, (const char *)body);
}

/* Whether a message of this kind may arrive on c; a new connection becomes
 * a request connection with its first request. */
static int conn_is(conn *c, int kind, const char *what)
{
    if (c->kind == kind) return 1;
    if (c->kind == CONN_NEW && kind == CONN_REQUEST) {
        c->kind = CONN_REQUEST;
        return 1;
    }
    conn_drop(c, 1, "%s on a %s connection", what,
              c->kind == CONN_CONTROL ? "control" : c->kind == CONN_REQUEST ? "request" : "new");
    return 0;
}

static void handle_message(dt_store_server *s, conn *c, const wire_hdr *h,
                           const unsigned char *body)
{
    switch (h->type) {
    case MSG_SET:
        if (conn_is(c, CONN_REQUEST, "SET")) on_set(s, c, h, body);
        break;
    case MSG_GET:
        if (conn_is(c, CONN_REQUEST, "GET")) on_get(s, c, h, body);
        break;
    case MSG_ADD:
        if (conn_is(c, CONN_REQUEST, "ADD")) on_add(s, c, h, body);
        break;
    case MSG_CANCEL:
        if (conn_is(c, CONN_REQUEST, "CANCEL")) on_cancel(s, c, h);
        break;
    case MSG_HELLO:
        if (conn_is(c, CONN_NEW, "HELLO")) on_hello(s, c, h);
        break;
    case MSG_HEARTBEAT:
        if (conn_is(c, CONN_CONTROL, "HEARTBEAT"))
            s->ranks[c->rank].last_beat_ns = dt_now_ns();
        break;
    case MSG_FAIL:
        if (conn_is(c, CONN_CONTROL, "FAIL")) on_fail(s, c, h, body);
        break;
    case MSG_BYE:
        if (conn_is(c, CONN_CONTROL, "BYE")) s->ranks[c->rank].bye = 1;
        break;
    default:
        conn_drop(c, 1, "message type %u is not one a client sends", h->type);
        break;
    }
}

/* ==== server: reading ====================================================== */

/* Bytes read (> 0), 0 when nothing more has arrived, -1 when the connection
 * is closed or broken (then c is marked dead). */
static ssize_t conn_recv(conn *c, void *buf, size_t want)
{
    for (;;) {
        ssize_t n = recv(c->fd, buf, want, MSG_DONTWAIT);
        if (n > 0) return n;
        if (n == 0) {
            int mid = c->raw_got > 0;
            conn_drop(c, mid, mid ? "it closed the connection in the middle of a message"
                                  : "it closed the connection");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        conn_drop(c, 0, "receive failed: %s", strerror(errno));
        return -1;
    }
}

/* The header is complete: check it and make room for the body. */
static int start_body(conn *c)
{
    char why[160];
    hdr_decode(c->raw, &c->hdr);
    if (hdr_check(c->raw, &c->hdr, why, sizeof why)) {
        conn_drop(c, 1, "bad message: %s", why);
        return -1;
    }
    c->body_len = (size_t)c->hdr.key_len + c->hdr.val_len;
    c->body_got = 0;
    c->body = malloc(c->body_len + 1);
    if (!c->body) {
        conn_drop(c, 1, "out of memory for a %zu-byte message", c->body_len);
        return -1;
    }
    return 0;
}

/* Advance c's input: 1 when a whole message was handled, 0 when more bytes
 * are needed, -1 when c is done. */
static int conn_read_one(dt_store_server *s, conn *c)
{
    while (c->raw_got < HDR_SIZE) {
        ssize_t n = conn_recv(c, c->raw + c->raw_got, HDR_SIZE - c->raw_got);
        if (n <= 0) return (int)n;
        c->raw_got += (size_t)n;
    }
    if (!c->body && start_body(c)) return -1;
    while (c->body_got < c->body_len) {
        ssize_t n = conn_recv(c, c->body + c->body_got, c->body_len - c->body_got);
        if (n <= 0) return (int)n;
        c->body_got += (size_t)n;
    }
    c->body[c->body_len] = 0;
    handle_message(s, c, &c->hdr, c->body);
    free(c->body);
    c->body = NULL;
    c->raw_got = 0;
    return 1;
}

static void conn_read(dt_store_server *s, conn *c)
{
    for (int i = 0; i < MAX_MSGS_PER_TURN && !c->dead; i++)
        if (conn_read_one(s, c) <= 0) return;
}

static void conn_free(conn *c)
{
    if (c->fd >= 0) close(c->fd);
    free(c->body);
    free(c->out);
    free(c);
}

/* Close the connections marked dead this turn. */
static void reap_dead(dt_store_server *s)
{
    int j = 0;
    for (int i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        if (!c->dead) {
            s->conns[j++] = c;
            continue;
        }
        conn_flush(c); /* last chance for an error reply to reach the client */
        waiters_remove(s, waiter_of_conn, c, NULL);
        if (c->kind == CONN_CONTROL) rank_gone(s, c);
        conn_free(c);
    }
    s->nconns = j;
}

/* ==== server: handshakes =================================================== */

typedef struct {
    dt_store_server *s;
    int fd;
    int slot;
} handshake;

static void *handshake_main(void *arg)
{
    handshake *h = arg;
    dt_store_server *s = h->s;
    char err[256];
    int rc = dt_auth_server(h->fd, s->secret, AUTH_CONTEXT, dt_now_ns() + HANDSHAKE_NS, err,
                            sizeof err);
    if (rc) dt_log(rc == DT_ERR_AUTH ? DT_LOG_WARN : DT_LOG_INFO, "store: %s", err);

    pthread_mutex_lock(&s->lock);
    s->handshake_fd[h->slot] = -1;
    if (rc == 0 && !s->closing) {
        s->ready[s->nready++] = h->fd;
        h->fd = -1;
        wake_server(s);
    }
    s->nhandshakes--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    /* s may be freed from here on. */
    if (h->fd >= 0) close(h->fd);
    free(h);
    return NULL;
}

static int handshake_room(dt_store_server *s)
{
    pthread_mutex_lock(&s->lock);
    int room = s->nhandshakes + s->nready < MAX_HANDSHAKES;
    pthread_mutex_unlock(&s->lock);
    return room;
}

static int claim_slot(dt_store_server *s, int fd)
{
    int slot = -1;
    pthread_mutex_lock(&s->lock);
    for (int i = 0; i < MAX_HANDSHAKES && slot < 0; i++)
        if (s->handshake_fd[i] < 0) slot = i;
    if (slot >= 0) {
        s->handshake_fd[slot] = fd;
        s->nhandshakes++;
    }
    pthread_mutex_unlock(&s->lock);
    return slot;
}

static void release_slot(dt_store_server *s, int slot)
{
    pthread_mutex_lock(&s->lock);
    s->handshake_fd[slot] = -1;
    s->nhandshakes--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void start_handshake(dt_store_server *s, int fd)
{
    int slot = claim_slot(s, fd);
    handshake *h = slot >= 0 ? malloc(sizeof *h) : NULL;
    if (!h) {
        if (slot >= 0) release_slot(s, slot);
        dt_log(DT_LOG_WARN, "store: no room to authenticate a new connection");
        close(fd);
        return;
    }
    *h = (handshake){.s = s, .fd = fd, .slot = slot};
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, HANDSHAKE_STACK);
    int rc = pthread_create(&t, &attr, handshake_main, h);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        dt_log(DT_LOG_WARN, "store: cannot start a handshake thread: %s", strerror(rc));
        release_slot(s, slot);
        close(fd);
        free(h);
    }
}

static void accept_new(dt_store_server *s)
{
    while (handshake_room(s)) {
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            start_handshake(s, fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            dt_log(DT_LOG_WARN, "store: accept failed: %s", strerror(errno));
        return;
    }
}

static void adopt_ready(dt_store_server *s)
{
    int fds[MAX_HANDSHAKES];
    pthread_mutex_lock(&s->lock);
    int n = s->nready;
    memcpy(fds, s->ready, (size_t)n * sizeof fds[0]);
    s->nready = 0;
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < n; i++) conn_adopt(s, fds[i]);
}

/* ==== server: the loop ===================================================== */

static int build_pollset(dt_store_server *s)
{
    int n = s->nconns + 2;
    if (n > s->pfds_cap) {
        struct pollfd *p = realloc(s->pfds, (size_t)n * sizeof *p);
        if (!p) return -1;
        s->pfds = p;
        s->pfds_cap = n;
    }
    s->pfds[0] = (struct pollfd){.fd = s->wake_fd, .events = POLLIN};
    /* A negative fd is ignored: while every handshake slot is busy, new
     * clients wait in the listen backlog. */
    s->pfds[1] = (struct pollfd){.fd = handshake_room(s) ? s->listen_fd : -1, .events = POLLIN};
    for (int i = 0; i < s->nconns; i++) {
        conn *c = s->conns[i];
        short ev = POLLIN;
        if (c->out_off < c->out_len) ev |= POLLOUT;
        s->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = ev};
    }
    return n;
}

static void handle_events(dt_store_server *s, int npoll)
{
    if (s->pfds[0].revents) {
        uint64_t v;
        ssize_t r = read(s->wake_fd, &v, sizeof v);
        (void)r; /* only the wake-up matters */
    }
    if (s->pfds[1].revents) accept_new(s);
    for (int i = 2; i < npoll; i++) {
        short rev = s->pfds[i].revents;
        conn *c = s->conns[i - 2];
        if (rev & POLLOUT) conn_flush(c);
        if (rev & (POLLIN | POLLHUP | POLLERR)) conn_read(s, c);
    }
}

/* Whether everyone who needs the store is finished with it. */
static int ranks_done(dt_store_server *s)
{
    int seen = 0, bye = 0;
    for (int r = 0; r < s->world_size; r++) {
        const rank_state *rs = &s->ranks[r];
        if (rs->ctl && !rs->bye) return 0;
        seen += rs->seen;
        bye += rs->bye;
    }
    /* No control connections at all: the store was used for requests only. */
    return seen == 0 || s->aborted || bye == s->world_size;
}

static int should_stop(dt_store_server *s)
{
    pthread_mutex_lock(&s->lock);
    int requested = s->stop_requested;
    uint64_t deadline = s->stop_deadline_ns;
    pthread_mutex_unlock(&s->lock);
    if (!requested) return 0;
    if (deadline == 0 || dt_now_ns() >= deadline) return 1;
    return ranks_done(s);
}

static void *server_main(void *arg)
{
    dt_store_server *s = arg;
    for (;;) {
        int npoll = build_pollset(s);
        if (npoll < 0) {
            dt_log(DT_LOG_ERROR, "store: out of memory for the poll set");
            npoll = 0;
        }
        int r = npoll > 0 ? poll(s->pfds, (nfds_t)npoll, TICK_MS) : poll(NULL, 0, TICK_MS);
        if (r < 0 && errno != EINTR) dt_log(DT_LOG_ERROR, "store: poll failed: %s", strerror(errno));
        if (r > 0) handle_events(s, npoll);
        adopt_ready(s);
        reap_dead(s);
        resolve_fail(s);
        check_heartbeats(s);
        if (should_stop(s)) break;
    }
    return NULL;
}

/* ==== server: start and stop =============================================== */

static void server_free(dt_store_server *s)
{
    for (int i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
    for (int i = 0; i < s->nwaiters; i++) free(s->waiters[i].key);
    for (size_t i = 0; s->buckets && i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            free(e->key);
            free(e->val);
            free(e);
            e = next;
        }
    }
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake_fd >= 0) close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s->conns);
    free(s->pfds);
    free(s->ranks);
    free(s->buckets);
    free(s->waiters);
    free(s->secret);
    free(s);
}

int dt_store_server_start(int port, int world_size, const char *secret,
                          double heartbeat_timeout_s, dt_store_server **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    if (world_size < 1 || !secret) {
        snprintf(err, errlen, "store server: need a world size >= 1 and a job secret");
        return DT_ERR_INVALID;
    }
    dt_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "store server: out of memory");
        return DT_ERR_NOMEM;
    }
    s->listen_fd = s->wake_fd = -1;
    s->world_size = world_size;
    s->beat_timeout_s = heartbeat_timeout_s;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    for (int i = 0; i < MAX_HANDSHAKES; i++) s->handshake_fd[i] = -1;
    s->secret = strdup(secret);
    s->ranks = calloc((size_t)world_size, sizeof *s->ranks);
    s->nbuckets = FIRST_BUCKETS;
    s->buckets = calloc(s->nbuckets, sizeof *s->buckets);
    if (!s->secret || !s->ranks || !s->buckets) {
        server_free(s);
        snprintf(err, errlen, "store server: out of memory");
        return DT_ERR_NOMEM;
    }
    char why[256];
    int rc = dt_net_listen(NULL, port, &s->listen_fd, NULL, why, sizeof why);
    if (rc) {
        server_free(s);
        snprintf(err, errlen, "store server: %s", why);
        return rc;
    }
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wake_fd < 0 || dt_net_set_nonblock(s->listen_fd, 1) != 0) {
        snprintf(err, errlen, "store server: eventfd or fcntl failed: %s", strerror(errno));
        server_free(s);
        return DT_ERR_SYSTEM;
    }
    rc = pthread_create(&s->thread, NULL, server_main, s);
    if (rc != 0) {
        snprintf(err, errlen, "store server: cannot start its thread: %s", strerror(rc));
        server_free(s);
        return DT_ERR_SYSTEM;
    }
    *out = s;
    return 0;
}

/* After the server thread has ended: cut short the handshakes still
 * running and wait for their threads, which otherwise end within
 * HANDSHAKE_NS anyway. */
static void end_handshakes(dt_store_server *s)
{
    pthread_mutex_lock(&s->lock);
    s->closing = 1;
    for (int i = 0; i < MAX_HANDSHAKES; i++)
        if (s->handshake_fd[i] >= 0) shutdown(s->handshake_fd[i], SHUT_RDWR);
    while (s->nhandshakes > 0) pthread_cond_wait(&s->cond, &s->lock);
    for (int i = 0; i < s->nready; i++) close(s->ready[i]);
    s->nready = 0;
    pthread_mutex_unlock(&s->lock);
}

void dt_store_server_stop(dt_store_server *s, uint64_t deadline_ns)
{
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stop_requested = 1;
    s->stop_deadline_ns = deadline_ns;
    wake_server(s);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    end_handshakes(s);
    server_free(s);
}

/* ==== client: request connection =========================================== */

#define MIN_IO_TIMEOUT_NS (5 * NS_PER_S)
#define CANCEL_TIMEOUT_NS (1 * NS_PER_S)

struct dt_store {
    int fd;
    uint32_t last_id;
    uint64_t io_timeout_ns; /* bound for requests that take no deadline; 0 = none */
    int broken;             /* the stream is out of step; every call fails */
    char addr[300];
    char err[768];
};

static int store_fail(dt_store *s, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int store_fail(dt_store *s, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t io_deadline(const dt_store *s)
{
    return s->io_timeout_ns ? dt_now_ns() + s->io_timeout_ns : 0;
}

/* A transfer failed part-way: later calls must not read the rest of it as
 * a new message. */
static int store_broke(dt_store *s, int rc, const char *doing, const char *why)
{
    s->broken = 1;
    if (rc == DT_ERR_PEER)
        return store_fail(s, rc, "lost the connection to the store at %s while %s (rank 0 died or was killed?)",
                          s->addr, doing);
    if (rc == DT_ERR_TIMEOUT)
        return store_fail(s, rc, "the store at %s stalled in the middle of a message while %s",
                          s->addr, doing);
    return store_fail(s, rc, "store at %s: %s while %s", s->addr,
                      why && *why ? why : "socket error", doing);
}

static int check_key(dt_store *s, const char *key)
{
    size_t len = key ? strlen(key) : 0;
    if (len >= 1 && len <= DT_STORE_MAX_KEY) return 0;
    return store_fail(s, DT_ERR_INVALID, "store key must be 1..%d bytes long (got %zu)",
                      DT_STORE_MAX_KEY, len);
}

/* Read replies until the one for id; earlier ones are answers to GETs that
 * timed out and are dropped. A DT_ERR_TIMEOUT before the reply starts leaves
 * the stream in step. */
static int await_reply(dt_store *s, uint32_t id, uint64_t deadline_ns, const char *doing,
                       wire_hdr *rh, unsigned char **body)
{
    for (;;) {
        int rc = wait_readable(s->fd, deadline_ns);
        if (rc) return rc == DT_ERR_TIMEOUT ? rc : store_broke(s, rc, doing, "poll failed");
        char why[160] = "";
        rc = read_msg(s->fd, rh, body, io_deadline(s), why, sizeof why);
        if (rc) return store_broke(s, rc, doing, why);
        if (rh->type != MSG_REPLY) {
            free(*body);
            *body = NULL;
            return store_broke(s, DT_ERR_PROTOCOL, doing, "unexpected message type");
        }
        if (rh->id == id) return 0;
        free(*body);
        *body = NULL;
    }
}

/* Send one request and wait for its reply until deadline_ns. On success the
 * reply's status was 0 and *body holds its value. */
static int store_call(dt_store *s, wire_hdr *h, const char *key, const void *val,
                      uint64_t deadline_ns, const char *doing, wire_hdr *rh,
                      unsigned char **body)
{
    *body = NULL;
    if (s->broken)
        return store_fail(s, DT_ERR_PEER,
                          "the connection to the store at %s broke earlier; cannot go on %s",
                          s->addr, doing);
    if (++s->last_id == 0) s->last_id = 1;
    h->id = s->last_id;
    int rc = send_msg(s->fd, h, key, val, io_deadline(s));
    if (rc) return store_broke(s, rc, doing, "send failed");
    rc = await_reply(s, h->id, deadline_ns, doing, rh, body);
    if (rc) return rc;
    if (rh->a != 0) {
        int code = rh->a < 0 ? rh->a : DT_ERR_PROTOCOL;
        rc = store_fail(s, code, "the store at %s refused %s: %s", s->addr, doing,
                        (const char *)*body);
        free(*body);
        *body = NULL;
    }
    return rc;
}

int dt_store_connect(const char *host, int port, const char *secret, uint64_t deadline_ns,
                     dt_store **out, char *err, size_t errlen)
{
    *out = NULL;
    uint64_t start = dt_now_ns();
    char why[512];
    int fd;
    int rc = dt_net_connect(host, port, deadline_ns, &fd, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "cannot reach the store on rank 0: %s", why);
        return rc;
    }
    dt_net_tune(fd);
    rc = dt_auth_client(fd, secret, AUTH_CONTEXT, deadline_ns, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "%s", why);
        close(fd);
        return rc;
    }
    dt_store *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return DT_ERR_NOMEM;
    }
    s->fd = fd;
    /* The caller's connect budget (DTRAIN_TIMEOUT, in practice) also bounds
     * each later request that takes no deadline of its own. */
    if (deadline_ns) {
        uint64_t budget = deadline_ns > start ? deadline_ns - start : 0;
        s->io_timeout_ns = budget > MIN_IO_TIMEOUT_NS ? budget : MIN_IO_TIMEOUT_NS;
    }
    format_host_port(s->addr, sizeof s->addr, host, port);
    *out = s;
    return 0;
}

static int store_set_until(dt_store *s, const char *key, const void *val, size_t len,
                           uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (len && !val)
        return store_fail(s, DT_ERR_INVALID, "store value for '%s' is NULL", key);
    if (len > DT_STORE_MAX_VALUE)
        return store_fail(s, DT_ERR_INVALID, "store value for '%s' is %zu bytes; the limit is %u",
                          key, len, DT_STORE_MAX_VALUE);
    wire_hdr h = {.type = MSG_SET, .key_len = (uint32_t)strlen(key), .val_len = (uint32_t)len};
    wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, val, deadline_ns, "setting a key", &rh, &body);
    if (rc == DT_ERR_TIMEOUT && !s->broken)
        return store_fail(s, rc, "timed out setting key '%s' in the store at %s (rank 0 stopped or hung?)",
                          key, s->addr);
    free(body);
    return rc;
}

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len)
{
    return store_set_until(s, key, val, len, io_deadline(s));
}

/* Tell the server to forget a GET we stopped waiting for. */
static void send_cancel(dt_store *s, uint32_t id)
{
    wire_hdr h = {.type = MSG_CANCEL, .id = id};
    if (send_msg(s->fd, &h, NULL, NULL, dt_now_ns() + CANCEL_TIMEOUT_NS) != 0) s->broken = 1;
}

int dt_store_get(dt_store *s, const char *key, void **val, size_t *len, uint64_t deadline_ns)
{
    *val = NULL;
    *len = 0;
    if (check_key(s, key)) return DT_ERR_INVALID;
    uint64_t start = dt_now_ns();
    wire_hdr h = {.type = MSG_GET, .key_len = (uint32_t)strlen(key)};
    wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, NULL, deadline_ns, "waiting for a key", &rh, &body);
    if (rc == DT_ERR_TIMEOUT && !s->broken) {
        send_cancel(s, h.id);
        return store_fail(s, rc, "timed out after %.1f s waiting for key '%s' in the store at %s",
                          (double)(dt_now_ns() - start) * 1e-9, key, s->addr);
    }
    if (rc) return rc;
    *val = body;
    *len = rh.val_len;
    return 0;
}

static int store_add_until(dt_store *s, const char *key, int64_t delta, int64_t *result,
                           uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    unsigned char d[8];
    put_i64(d, delta);
    wire_hdr h = {.type = MSG_ADD, .key_len = (uint32_t)strlen(key), .val_len = 8};
    wire_hdr rh;
    unsigned char *body;
    int rc = store_call(s, &h, key, d, deadline_ns, "adding to a counter", &rh, &body);
    if (rc == DT_ERR_TIMEOUT && !s->broken)
        return store_fail(s, rc, "timed out adding to counter '%s' in the store at %s (rank 0 stopped or hung?)",
                          key, s->addr);
    if (rc) return rc;
    if (rh.val_len != 8) {
        free(body);
        return store_broke(s, DT_ERR_PROTOCOL, "adding to a counter", "malformed ADD reply");
    }
    if (result) *result = get_i64(body);
    free(body);
    return 0;
}

int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result)
{
    return store_add_until(s, key, delta, result, io_deadline(s));
}

/* The counter key counts arrivals over every use of the barrier; arrival k
 * belongs to round (k-1)/n, and the last arrival of a round opens it by
 * setting "<key>/open.<round>". So the same key can be used again. */
int dt_store_barrier(dt_store *s, const char *key, int n, uint64_t deadline_ns)
{
    if (check_key(s, key)) return DT_ERR_INVALID;
    if (n < 1) return store_fail(s, DT_ERR_INVALID, "barrier '%s' needs n >= 1, got %d", key, n);
    char open_key[DT_STORE_MAX_KEY + 40];
    if (strlen(key) + 32 > DT_STORE_MAX_KEY)
        return store_fail(s, DT_ERR_INVALID, "barrier key '%.40s...' is too long", key);
    uint64_t start = dt_now_ns();
    uint64_t step_deadline = deadline_ns ? deadline_ns : io_deadline(s);
    int64_t arrived;
    int rc = store_add_until(s, key, 1, &arrived, step_deadline);
    if (rc) return rc;
    int64_t round = (arrived - 1) / n;
    snprintf(open_key, sizeof open_key, "%s/open.%" PRId64, key, round);
    if (arrived % n == 0) {
        rc = store_set_until(s, open_key, "1", 1, step_deadline);
        if (rc) return rc;
    }
    void *v;
    size_t len;
    rc = dt_store_get(s, open_key, &v, &len, deadline_ns);
    if (rc == 0) {
        free(v);
        return 0;
    }
    if (rc != DT_ERR_TIMEOUT) return rc;
    /* Say how many made it, which usually points at the missing ones. */
    int64_t now_arrived;
    if (store_add_until(s, key, 0, &now_arrived, dt_now_ns() + CANCEL_TIMEOUT_NS) != 0)
        now_arrived = arrived;
    return store_fail(s, DT_ERR_TIMEOUT, "barrier '%s' timed out after %.1f s: %" PRId64 " of %d arrived",
                      key, (double)(dt_now_ns() - start) * 1e-9, now_arrived - round * n, n);
}

const char *dt_store_error(const dt_store *s) { return s ? s->err : "no store connection"; }

void dt_store_close(dt_store *s)
{
    if (!s) return;
    close(s->fd);
    free(s);
}

/* ==== client: monitor ======================================================== */

#define MONITOR_IO_NS (5 * NS_PER_S)

struct dt_monitor {
    int fd;
    int wake_fd;
    int rank;
    uint64_t interval_ns;
    char addr[300];
    dt_abort_fn on_abort;
    void *arg;
    pthread_t thread;
    pthread_mutex_t send_lock; /* heartbeats (monitor thread) vs reports (caller) */
    atomic_int stopping;
    atomic_int fired;
};

static void monitor_fire(dt_monitor *m, int code, const char *msg)
{
    if (atomic_exchange(&m->fired, 1) == 0) m->on_abort(m->arg, code, msg);
}

static void monitor_lost(dt_monitor *m)
{
    if (atomic_load(&m->stopping)) return; /* our own goodbye, not a failure */
    char msg[512];
    snprintf(msg, sizeof msg,
             "lost the connection to the store on rank 0 (%s): rank 0 died or was killed", m->addr);
    monitor_fire(m, DT_ERR_PEER, msg);
}

static int monitor_send(dt_monitor *m, const wire_hdr *h, const void *val)
{
    pthread_mutex_lock(&m->send_lock);
    int rc = send_msg(m->fd, h, NULL, val, dt_now_ns() + MONITOR_IO_NS);
    pthread_mutex_unlock(&m->send_lock);
    return rc;
}

/* One message from the server: 0 to go on, -1 when the connection is done. */
static int monitor_read(dt_monitor *m)
{
    wire_hdr h;
    unsigned char *body;
    char why[160];
    int rc = read_msg(m->fd, &h, &body, dt_now_ns() + MONITOR_IO_NS, why, sizeof why);
    if (rc) {
        monitor_lost(m);
        return -1;
    }
    if (h.type != MSG_ABORT) {
        free(body);
        if (!atomic_load(&m->stopping))
            monitor_fire(m, DT_ERR_PROTOCOL, "the store on rank 0 sent an unexpected message");
        return -1;
    }
    monitor_fire(m, h.a < 0 ? h.a : DT_ERR_ABORTED, (const char *)body);
    free(body);
    return 0;
}

static int ms_until(uint64_t t)
{
    uint64_t now = dt_now_ns();
    return t > now ? (int)((t - now + 999999) / 1000000) : 0;
}

static void *monitor_main(void *arg)
{
    dt_monitor *m = arg;
    uint64_t next_beat = dt_now_ns() + m->interval_ns;
    while (!atomic_load(&m->stopping)) {
        struct pollfd p[2] = {{.fd = m->fd, .events = POLLIN}, {.fd = m->wake_fd, .events = POLLIN}};
        int r = poll(p, 2, ms_until(next_beat));
        if (atomic_load(&m->stopping)) break;
        if (r < 0 && errno != EINTR) {
            monitor_lost(m);
            break;
        }
        if (r > 0 && p[0].revents && monitor_read(m) != 0) break;
        uint64_t now = dt_now_ns();
        if (now < next_beat) continue;
        wire_hdr h = {.type = MSG_HEARTBEAT};
        if (monitor_send(m, &h, NULL) != 0) {
            monitor_lost(m);
            break;
        }
        next_beat += m->interval_ns;
        if (next_beat < now) next_beat = now + m->interval_ns; /* we were descheduled */
    }
    return NULL;
}

/* Connect, authenticate and say HELLO; the server's answer says whether it
 * took this rank. */
static int monitor_hello(const char *host, int port, int rank, const char *secret,
                         uint32_t interval_ms, uint64_t deadline_ns, int *out_fd, char *err,
                         size_t errlen)
{
    char why[512];
    int fd;
    int rc = dt_net_connect(host, port, deadline_ns, &fd, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "cannot reach the store on rank 0: %s", why);
        return rc;
    }
    dt_net_tune(fd);
    rc = dt_auth_client(fd, secret, AUTH_CONTEXT, deadline_ns, why, sizeof why);
    if (rc) {
        snprintf(err, errlen, "%s", why);
        close(fd);
        return rc;
    }
    wire_hdr h = {.type = MSG_HELLO, .id = 1, .a = rank, .b = (int32_t)interval_ms};
    wire_hdr rh;
    unsigned char *body = NULL;
    rc = send_msg(fd, &h, NULL, NULL, deadline_ns);
    if (rc == 0) rc = read_msg(fd, &rh, &body, deadline_ns, why, sizeof why);
    if (rc == 0 && (rh.type != MSG_REPLY || rh.id != 1)) rc = DT_ERR_PROTOCOL;
    if (rc == 0 && rh.a != 0) {
        snprintf(err, errlen, "the store on rank 0 refused rank %d: %s", rank, (char *)body);
        rc = rh.a < 0 ? rh.a : DT_ERR_PROTOCOL;
    } else if (rc) {
        snprintf(err, errlen, "no answer from the store on rank 0 to rank %d's HELLO (%s)", rank,
                 rc == DT_ERR_TIMEOUT ? "timed out" : rc == DT_ERR_PEER ? "connection closed" : "bad reply");
    }
    free(body);
    if (rc) {
        close(fd);
        return rc;
    }
    *out_fd = fd;
    return 0;
}

int dt_monitor_start(const char *host, int port, int rank, const char *secret,
                     double heartbeat_interval_s, uint64_t deadline_ns, dt_abort_fn on_abort,
                     void *arg, dt_monitor **out, char *err, size_t errlen)
{
    *out = NULL;
    if (rank < 0 || !on_abort || !(heartbeat_interval_s > 0) || heartbeat_interval_s > 3600) {
        snprintf(err, errlen, "monitor: need a rank >= 0, a callback and an interval in (0, 3600] s");
        return DT_ERR_INVALID;
    }
    uint64_t interval_ns = (uint64_t)(heartbeat_interval_s * 1e9);
    if (interval_ns < 1000000) interval_ns = 1000000;
    int fd;
    int rc = monitor_hello(host, port, rank, secret, (uint32_t)(interval_ns / 1000000),
                           deadline_ns, &fd, err, errlen);
    if (rc) return rc;
    dt_monitor *m = calloc(1, sizeof *m);
    int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!m || wake < 0) {
        snprintf(err, errlen, "monitor: out of memory or no eventfd");
        free(m);
        if (wake >= 0) close(wake);
        close(fd);
        return DT_ERR_SYSTEM;
    }
    m->fd = fd;
    m->wake_fd = wake;
    m->rank = rank;
    m->interval_ns = interval_ns;
    m->on_abort = on_abort;
    m->arg = arg;
    format_host_port(m->addr, sizeof m->addr, host, port);
    pthread_mutex_init(&m->send_lock, NULL);
    rc = pthread_create(&m->thread, NULL, monitor_main, m);
    if (rc != 0) {
        snprintf(err, errlen, "monitor: cannot start its thread: %s", strerror(rc));
        pthread_mutex_destroy(&m->send_lock);
        close(wake);
        close(fd);
        free(m);
        return DT_ERR_SYSTEM;
    }
    *out = m;
    return 0;
}

int dt_monitor_report(dt_monitor *m, int code, int suspect, int is_timeout, const char *msg)
{
    if (!m) return DT_ERR_INVALID;
    if (!msg) msg = "";
    size_t len = strlen(msg);
    if (len > DT_STORE_MAX_MSG) len = DT_STORE_MAX_MSG;
    wire_hdr h = {.type = MSG_FAIL, .flag = is_timeout ? 1 : 0, .a = code, .b = suspect,
                  .val_len = (uint32_t)len};
    return monitor_send(m, &h, msg);
}

void dt_monitor_stop(dt_monitor *m)
{
    if (!m) return;
    atomic_store(&m->stopping, 1);
    wire_hdr bye = {.type = MSG_BYE};
    (void)monitor_send(m, &bye, NULL);
    /* Also ends a read the thread may be blocked in; the BYE is already
     * queued ahead of the FIN. */
    shutdown(m->fd, SHUT_RDWR);
    uint64_t one = 1;
    ssize_t w = write(m->wake_fd, &one, sizeof one);
    (void)w;
    pthread_join(m->thread, NULL);
    pthread_mutex_destroy(&m->send_lock);
    close(m->wake_fd);
    close(m->fd);
    free(m);
}
