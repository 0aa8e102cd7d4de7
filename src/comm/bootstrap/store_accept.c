/*
 * New connections to the store: accepted on the server thread, then
 * authenticated each in a short-lived thread of its own (bounded in number
 * and in time, so that slow or hostile clients cannot hold up the server),
 * which hands the socket back once the handshake has passed.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/bootstrap/auth.h"
#include "comm/bootstrap/store_server.h"
#include "core/log.h"
#include "core/timer.h"
#include "dtrain/comm.h"

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
    int rc = dt_auth_server(h->fd, s->secret, DT_WIRE_AUTH_CONTEXT, dt_now_ns() + HANDSHAKE_NS,
                            err, sizeof err);
    if (rc) dt_log(rc == DT_ERR_AUTH ? DT_LOG_WARN : DT_LOG_INFO, "store: %s", err);

    pthread_mutex_lock(&s->lock);
    s->handshake_fd[h->slot] = -1;
    if (rc == 0 && !s->closing) {
        s->ready[s->nready++] = h->fd;
        h->fd = -1;
        dt_srv_wake(s);
    }
    s->nhandshakes--;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    /* s may be freed from here on. */
    if (h->fd >= 0) close(h->fd);
    free(h);
    return NULL;
}

int dt_srv_handshake_room(dt_store_server *s)
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

void dt_srv_accept(dt_store_server *s)
{
    while (dt_srv_handshake_room(s)) {
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

void dt_srv_adopt_ready(dt_store_server *s)
{
    int fds[MAX_HANDSHAKES];
    pthread_mutex_lock(&s->lock);
    int n = s->nready;
    memcpy(fds, s->ready, (size_t)n * sizeof fds[0]);
    s->nready = 0;
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < n; i++) dt_srv_adopt(s, fds[i]);
}

/* The handshake threads otherwise end within HANDSHAKE_NS anyway. */
void dt_srv_end_handshakes(dt_store_server *s)
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

