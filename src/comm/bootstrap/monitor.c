/*
 * The control connection (store.h): a thread per process that says HELLO
 * with its rank, sends a heartbeat every interval, carries this rank's
 * failure reports, and hears the store's ABORT, or notices that the store
 * itself is gone. Stopping it says BYE, the sign of a clean exit.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap/store.h"
#include "comm/bootstrap/store_wire.h"
#include "comm/transport/net.h"
#include "core/timer.h"
#include "dtrain/comm.h"

#define NS_PER_S 1000000000ull
#define MONITOR_IO_NS (5 * NS_PER_S)

struct dt_monitor {
    int fd;
    int wake_fd;
    int rank;
    uint64_t interval_ns;
    char addr[300];
    dt_monitor_events ev;
    void *arg;
    pthread_t thread;
    pthread_mutex_t send_lock; /* heartbeats (monitor thread) vs reports (caller) */
    atomic_int stopping;
    atomic_int fired;
};

static void monitor_fire(dt_monitor *m, int code, const char *msg)
{
    if (atomic_exchange(&m->fired, 1) == 0) m->ev.on_abort(m->arg, code, msg);
}

static void monitor_lost(dt_monitor *m)
{
    if (atomic_load(&m->stopping)) return; /* our own goodbye, not a failure */
    char msg[512];
    const char *who = dt_store_server_name();
    snprintf(msg, sizeof msg, "lost the connection to the store on %s (%s): %s died or was killed",
             who, m->addr, who);
    monitor_fire(m, DT_ERR_PEER, msg);
}

static int monitor_send(dt_monitor *m, const dt_wire_hdr *h, const void *val)
{
    pthread_mutex_lock(&m->send_lock);
    int rc = dt_wire_send(m->fd, h, NULL, val, dt_now_ns() + MONITOR_IO_NS);
    pthread_mutex_unlock(&m->send_lock);
    return rc;
}

/* One message from the server: 0 to go on, -1 when the connection is done. */
static int monitor_read(dt_monitor *m)
{
    dt_wire_hdr h;
    unsigned char *body;
    char why[160];
    int rc = dt_wire_read(m->fd, &h, &body, dt_now_ns() + MONITOR_IO_NS, why, sizeof why);
    if (rc) {
        monitor_lost(m);
        return -1;
    }
    if (h.type == DT_WIRE_LEFT) {
        free(body);
        if (m->ev.on_left) m->ev.on_left(m->arg, h.a);
        return 0;
    }
    if (h.type != DT_WIRE_ABORT) {
        free(body);
        if (!atomic_load(&m->stopping))
            monitor_fire(m, DT_ERR_PROTOCOL, "the store sent an unexpected message");
        return -1;
    }
    monitor_fire(m, h.a < 0 ? h.a : DT_ERR_ABORTED, (const char *)body);
    free(body);
    return 0;
}

static void *monitor_main(void *arg)
{
    dt_monitor *m = arg;
    uint64_t next_beat = dt_now_ns() + m->interval_ns;
    while (!atomic_load(&m->stopping)) {
        struct pollfd p[2] = {{.fd = m->fd, .events = POLLIN}, {.fd = m->wake_fd, .events = POLLIN}};
        int r = poll(p, 2, dt_net_poll_ms(next_beat));
        if (atomic_load(&m->stopping)) break;
        if (r < 0 && errno != EINTR) {
            monitor_lost(m);
            break;
        }
        if (r > 0 && p[0].revents && monitor_read(m) != 0) break;
        uint64_t now = dt_now_ns();
        if (now < next_beat) continue;
        dt_wire_hdr h = {.type = DT_WIRE_HEARTBEAT};
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
    int rc = dt_wire_dial(host, port, secret, deadline_ns, &fd, err, errlen);
    if (rc) return rc;
    dt_wire_hdr h = {.type = DT_WIRE_HELLO, .id = 1, .a = rank, .b = (int32_t)interval_ms};
    dt_wire_hdr rh;
    unsigned char *body = NULL;
    rc = dt_wire_send(fd, &h, NULL, NULL, deadline_ns);
    if (rc == 0) rc = dt_wire_read(fd, &rh, &body, deadline_ns, why, sizeof why);
    if (rc == 0 && (rh.type != DT_WIRE_REPLY || rh.id != 1)) rc = DT_ERR_PROTOCOL;
    if (rc == 0 && rh.a != 0) {
        snprintf(err, errlen, "the store on %s refused rank %d: %s", dt_store_server_name(), rank,
                 (char *)body);
        rc = rh.a < 0 ? rh.a : DT_ERR_PROTOCOL;
    } else if (rc) {
        snprintf(err, errlen, "no answer from the store on %s to rank %d's HELLO (%s)",
                 dt_store_server_name(), rank,
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
                     double heartbeat_interval_s, uint64_t deadline_ns,
                     const dt_monitor_events *events, void *arg, dt_monitor **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    if (rank < 0 || !events || !events->on_abort || !(heartbeat_interval_s > 0) || heartbeat_interval_s > 3600) {
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
    m->ev = *events;
    m->arg = arg;
    dt_net_host_port(m->addr, sizeof m->addr, host, port);
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
    dt_wire_hdr h = {.type = DT_WIRE_FAIL, .flag = is_timeout ? 1 : 0, .a = code, .b = suspect,
                  .val_len = (uint32_t)len};
    return monitor_send(m, &h, msg);
}

void dt_monitor_stop(dt_monitor *m)
{
    if (!m) return;
    atomic_store(&m->stopping, 1);
    dt_wire_hdr bye = {.type = DT_WIRE_BYE};
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

