/*
 * The store's server (store.h): one thread around poll() over the
 * listening socket and every connection, reading whole messages and
 * handing them to the keys (store_keys.c) or the control side
 * (store_control.c); see store_server.h for how its files divide the work.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap/store_server.h"
#include "comm/transport/net.h"
#include "core/log.h"
#include "core/timer.h"
#include "dtrain/comm.h"

void dt_srv_wake(dt_store_server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->wake_fd, &one, sizeof one);
    (void)w; /* a full counter still wakes the poll */
}

/* ---- connections ---- */

void dt_srv_drop(conn *c, int is_error, const char *fmt, ...)
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
        /* The client closed or reset the connection, but what it sent
         * before (a BYE, say) may still wait to be read: stop writing, and
         * let the read side, which sees the end soon, judge it. */
        c->out_broken = 1;
        break;
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
void dt_srv_send(conn *c, const dt_wire_hdr *h, const void *val)
{
    if (c->dead || c->out_broken) return;
    size_t need = DT_WIRE_HDR_SIZE + (size_t)h->val_len;
    if (c->out_len - c->out_off + need > MAX_QUEUED_BYTES) {
        dt_srv_drop(c, 1, "it does not read its replies (%zu bytes queued)",
                    c->out_len - c->out_off);
        return;
    }
    if (out_reserve(c, need)) {
        dt_srv_drop(c, 1, "out of memory queueing %zu bytes for it", need);
        return;
    }
    dt_wire_encode(h, c->out + c->out_len);
    if (h->val_len) memcpy(c->out + c->out_len + DT_WIRE_HDR_SIZE, val, h->val_len);
    c->out_len += need;
    conn_flush(c);
}

void dt_srv_reply(conn *c, uint32_t id, int status, const void *val, size_t len)
{
    dt_wire_hdr h = {.type = DT_WIRE_REPLY, .id = id, .a = status, .val_len = (uint32_t)len};
    dt_srv_send(c, &h, val);
}

void dt_srv_reply_error(conn *c, uint32_t id, int code, const char *fmt, ...)
{
    char msg[DT_STORE_MAX_MSG];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_srv_reply(c, id, code, msg, strlen(msg));
}

void dt_srv_send_abort(conn *c, int code, const char *msg)
{
    size_t len = strlen(msg);
    if (len > DT_STORE_MAX_MSG) len = DT_STORE_MAX_MSG;
    dt_wire_hdr h = {.type = DT_WIRE_ABORT, .a = code, .val_len = (uint32_t)len};
    dt_srv_send(c, &h, msg);
}

void dt_srv_adopt(dt_store_server *s, int fd)
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

/* ---- messages ---- */

/* Whether a message of this kind may arrive on c; a new connection becomes
 * a request connection with its first request. */
static int conn_is(conn *c, int kind, const char *what)
{
    if (c->kind == kind) return 1;
    if (c->kind == CONN_NEW && kind == CONN_REQUEST) {
        c->kind = CONN_REQUEST;
        return 1;
    }
    dt_srv_drop(c, 1, "%s on a %s connection", what,
                c->kind == CONN_CONTROL ? "control" : c->kind == CONN_REQUEST ? "request" : "new");
    return 0;
}

static void handle_message(dt_store_server *s, conn *c, const dt_wire_hdr *h,
                           const unsigned char *body)
{
    switch (h->type) {
    case DT_WIRE_SET:
        if (conn_is(c, CONN_REQUEST, "SET")) dt_srv_on_set(s, c, h, body);
        break;
    case DT_WIRE_GET:
        if (conn_is(c, CONN_REQUEST, "GET")) dt_srv_on_get(s, c, h, body);
        break;
    case DT_WIRE_ADD:
        if (conn_is(c, CONN_REQUEST, "ADD")) dt_srv_on_add(s, c, h, body);
        break;
    case DT_WIRE_CANCEL:
        if (conn_is(c, CONN_REQUEST, "CANCEL")) dt_srv_on_cancel(s, c, h);
        break;
    case DT_WIRE_HELLO:
        if (conn_is(c, CONN_NEW, "HELLO")) dt_srv_on_hello(s, c, h);
        break;
    case DT_WIRE_HEARTBEAT:
        if (conn_is(c, CONN_CONTROL, "HEARTBEAT")) dt_srv_on_heartbeat(s, c);
        break;
    case DT_WIRE_FAIL:
        if (conn_is(c, CONN_CONTROL, "FAIL")) dt_srv_on_fail(s, c, h, body);
        break;
    case DT_WIRE_BYE:
        if (conn_is(c, CONN_CONTROL, "BYE")) dt_srv_on_bye(s, c);
        break;
    default:
        dt_srv_drop(c, 1, "message type %u is not one a client sends", h->type);
        break;
    }
}

/* ---- reading ---- */

/* Bytes read (> 0), 0 when nothing more has arrived, -1 when the connection
 * is closed or broken (then c is marked dead). */
static ssize_t conn_recv(conn *c, void *buf, size_t want)
{
    for (;;) {
        ssize_t n = recv(c->fd, buf, want, MSG_DONTWAIT);
        if (n > 0) return n;
        if (n == 0) {
            int mid = c->raw_got > 0;
            dt_srv_drop(c, mid, mid ? "it closed the connection in the middle of a message"
                                    : "it closed the connection");
            return -1;
        }
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        dt_srv_drop(c, 0, "receive failed: %s", strerror(errno));
        return -1;
    }
}

/* The header is complete: check it and make room for the body. */
static int start_body(conn *c)
{
    char why[160];
    dt_wire_decode(c->raw, &c->hdr);
    if (dt_wire_check(c->raw, &c->hdr, why, sizeof why)) {
        dt_srv_drop(c, 1, "bad message: %s", why);
        return -1;
    }
    c->body_len = (size_t)c->hdr.key_len + c->hdr.val_len;
    c->body_got = 0;
    c->body = malloc(c->body_len + 1);
    if (!c->body) {
        dt_srv_drop(c, 1, "out of memory for a %zu-byte message", c->body_len);
        return -1;
    }
    return 0;
}

/* Advance c's input: 1 when a whole message was handled, 0 when more bytes
 * are needed, -1 when c is done. */
static int conn_read_one(dt_store_server *s, conn *c)
{
    while (c->raw_got < DT_WIRE_HDR_SIZE) {
        ssize_t n = conn_recv(c, c->raw + c->raw_got, DT_WIRE_HDR_SIZE - c->raw_got);
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
        dt_srv_forget_waiters(s, c);
        if (c->kind == CONN_CONTROL) dt_srv_rank_gone(s, c);
        conn_free(c);
    }
    s->nconns = j;
}

/* ---- the loop ---- */

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
    int room = dt_srv_handshake_room(s);
    s->pfds[1] = (struct pollfd){.fd = room ? s->listen_fd : -1, .events = POLLIN};
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
    if (s->pfds[1].revents) dt_srv_accept(s);
    for (int i = 2; i < npoll; i++) {
        short rev = s->pfds[i].revents;
        conn *c = s->conns[i - 2];
        if (rev & POLLOUT) conn_flush(c);
        if (rev & (POLLIN | POLLHUP | POLLERR)) conn_read(s, c);
    }
}

static int should_stop(dt_store_server *s)
{
    pthread_mutex_lock(&s->lock);
    int requested = s->stop_requested;
    uint64_t deadline = s->stop_deadline_ns;
    pthread_mutex_unlock(&s->lock);
    if (!requested) return 0;
    if (deadline == 0 || dt_now_ns() >= deadline) return 1;
    return dt_srv_ranks_done(s);
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
        dt_srv_adopt_ready(s);
        reap_dead(s);
        dt_srv_resolve_fail(s);
        dt_srv_check_heartbeats(s);
        if (should_stop(s)) break;
    }
    return NULL;
}

/* ---- start and stop ---- */

static void server_free(dt_store_server *s)
{
    for (int i = 0; i < s->nconns; i++) conn_free(s->conns[i]);
    dt_srv_keys_free(s);
    if (s->listen_fd >= 0) close(s->listen_fd);
    if (s->wake_fd >= 0) close(s->wake_fd);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s->conns);
    free(s->pfds);
    free(s->ranks);
    free(s->secret);
    free(s);
}

int dt_store_server_start(const char *addr, int port, int world_size, const char *secret,
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
    if (!s->secret || !s->ranks || dt_srv_keys_init(s) != 0) {
        server_free(s);
        snprintf(err, errlen, "store server: out of memory");
        return DT_ERR_NOMEM;
    }
    char why[256];
    int rc = dt_net_listen_for(addr, port, &s->listen_fd, NULL, why, sizeof why);
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

void dt_store_server_stop(dt_store_server *s, uint64_t deadline_ns)
{
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->stop_requested = 1;
    s->stop_deadline_ns = deadline_ns;
    dt_srv_wake(s);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    dt_srv_end_handshakes(s);
    server_free(s);
}
