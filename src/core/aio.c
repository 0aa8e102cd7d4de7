/* io_uring-backed transfers. See aio.h. */
#include "core/aio.h"

#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/str.h"
#include "core/timer.h"

#define MAX_TRANSFERS 64
#define STOP_TAG UINT64_MAX /* the NOP that tells the I/O thread to leave */

typedef struct {
    int used, write, failed;
    int fd;
    const char *what;
    char *buf;
    size_t len;
    uint64_t off;
    unsigned nblocks, submitted, done;
} transfer;

/* The caller's thread queues and waits; the engine's I/O thread reaps
 * completions and hands the kernel the next blocks at once, so a queue
 * longer than depth keeps moving while the caller computes. The mutex
 * guards the transfers and the submission side of the ring; only the I/O
 * thread touches the completion side. */
struct dt_aio {
    struct io_uring ring;
    unsigned depth, inflight;
    size_t block;
    int next; /* the next ticket */
    transfer t[MAX_TRANSFERS];
    uint64_t wait_ns;
    char error[512];
    pthread_mutex_t mu;
    pthread_cond_t done; /* a block came back, or the I/O thread broke */
    pthread_t thread;
    int broken;          /* the I/O thread could not wait: every wait fails */
};

static void reap(dt_aio *a, struct io_uring_cqe *c);
static void submit_some(dt_aio *a);

static void *io_thread(void *arg)
{
    dt_aio *a = arg;
    for (;;) {
        struct io_uring_cqe *c;
        int rc = io_uring_wait_cqe(&a->ring, &c);
        if (rc == -EINTR) continue;
        pthread_mutex_lock(&a->mu);
        if (rc < 0) {
            dt_strf(a->error, sizeof a->error, "asynchronous I/O: waiting: %s", strerror(-rc));
            a->broken = 1;
        } else if (io_uring_cqe_get_data64(c) == STOP_TAG) {
            io_uring_cqe_seen(&a->ring, c);
            a->broken = 1;
        } else {
            reap(a, c);
            io_uring_cqe_seen(&a->ring, c);
            submit_some(a);
        }
        int leave = a->broken;
        pthread_cond_broadcast(&a->done);
        pthread_mutex_unlock(&a->mu);
        if (leave) return NULL;
    }
}

int dt_aio_open(dt_aio **out, unsigned depth, size_t block_bytes, char *err, size_t errlen)
{
    dt_aio *a = calloc(1, sizeof *a);
    if (!a) return dt_strf(err, errlen, "asynchronous I/O: out of memory"), -1;
    int rc = io_uring_queue_init(depth, &a->ring, 0);
    if (rc < 0) {
        free(a);
        return dt_strf(err, errlen, "asynchronous I/O: io_uring_queue_init(%u): %s", depth,
                       strerror(-rc)), -1;
    }
    a->depth = depth;
    a->block = block_bytes;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->done, NULL);
    if ((rc = pthread_create(&a->thread, NULL, io_thread, a))) {
        io_uring_queue_exit(&a->ring);
        free(a);
        return dt_strf(err, errlen, "asynchronous I/O: starting its thread: %s",
                       strerror(rc)), -1;
    }
    *out = a;
    return 0;
}

void dt_aio_close(dt_aio *a)
{
    if (!a) return;
    dt_aio_drain(a);
    pthread_mutex_lock(&a->mu);
    struct io_uring_sqe *s = NULL;
    /* After the drain nothing is in flight: a slot frees once the queue
     * is handed to the kernel. */
    while (!a->broken && !(s = io_uring_get_sqe(&a->ring))) io_uring_submit(&a->ring);
    if (s) {
        io_uring_prep_nop(s);
        io_uring_sqe_set_data64(s, STOP_TAG);
        io_uring_submit(&a->ring);
    }
    pthread_mutex_unlock(&a->mu);
    pthread_join(a->thread, NULL);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->done);
    io_uring_queue_exit(&a->ring);
    free(a);
}

const char *dt_aio_error(const dt_aio *a) { return a->error; }
uint64_t dt_aio_wait_ns(const dt_aio *a) { return a->wait_ns; }

static size_t block_len(const dt_aio *a, const transfer *x, unsigned k)
{
    size_t at = (size_t)k * a->block;
    return x->len - at < a->block ? x->len - at : a->block;
}

/* Hands the kernel blocks of the queued transfers, oldest first, while
 * fewer than depth are in flight. Under the mutex. */
static void submit_some(dt_aio *a)
{
    unsigned queued = 0;
    for (int i = 0; i < MAX_TRANSFERS && a->inflight < a->depth; i++) {
        int slot = (a->next + i) % MAX_TRANSFERS; /* the oldest live ticket first */
        transfer *x = &a->t[slot];
        while (x->used && !x->failed && x->submitted < x->nblocks && a->inflight < a->depth) {
            struct io_uring_sqe *s = io_uring_get_sqe(&a->ring);
            if (!s) break;
            unsigned k = x->submitted++;
            size_t n = block_len(a, x, k), at = (size_t)k * a->block;
            if (x->write) io_uring_prep_write(s, x->fd, x->buf + at, (unsigned)n, x->off + at);
            else io_uring_prep_read(s, x->fd, x->buf + at, (unsigned)n, x->off + at);
            io_uring_sqe_set_data64(s, ((uint64_t)slot << 32) | k);
            a->inflight++;
            queued++;
        }
    }
    if (queued) io_uring_submit(&a->ring);
}

static int queue(dt_aio *a, int write, int fd, const char *what, void *buf, size_t len,
                 uint64_t off)
{
    pthread_mutex_lock(&a->mu);
    int ticket = a->next, slot = ticket % MAX_TRANSFERS;
    if (a->t[slot].used) {
        dt_strf(a->error, sizeof a->error, "asynchronous I/O: more than %d transfers in flight",
                MAX_TRANSFERS);
        ticket = -1;
    } else {
        a->t[slot] = (transfer){.used = 1, .write = write, .fd = fd, .what = what, .buf = buf,
                                .len = len, .off = off,
                                .nblocks = (unsigned)((len + a->block - 1) / a->block)};
        a->next = (a->next + 1) % (1 << 30);
        submit_some(a);
    }
    pthread_mutex_unlock(&a->mu);
    return ticket;
}

int dt_aio_read(dt_aio *a, int fd, const char *what, void *buf, size_t len, uint64_t off)
{
    return queue(a, 0, fd, what, buf, len, off);
}

int dt_aio_write(dt_aio *a, int fd, const char *what, const void *buf, size_t len,
                 uint64_t off)
{
    return queue(a, 1, fd, what, (void *)buf, len, off);
}

/* One completion: its block counted, a failure or a short transfer noted
 * with the file, offset and bytes. Under the mutex. */
static void reap(dt_aio *a, struct io_uring_cqe *c)
{
    uint64_t ud = io_uring_cqe_get_data64(c);
    transfer *x = &a->t[ud >> 32];
    unsigned k = (unsigned)(ud & 0xffffffffu);
    size_t want = block_len(a, x, k);
    uint64_t at = x->off + (uint64_t)k * a->block;
    if (!x->failed && (c->res < 0 || (size_t)c->res != want)) {
        x->failed = 1;
        if (c->res < 0)
            dt_strf(a->error, sizeof a->error, "%s %s: %zu bytes at offset %llu: %s",
                    x->write ? "writing" : "reading", x->what, want, (unsigned long long)at,
                    strerror(-c->res));
        else
            dt_strf(a->error, sizeof a->error, "%s %s: %d of %zu bytes at offset %llu (the "
                    "file is shorter than the job made it: truncated or replaced?)",
                    x->write ? "writing" : "reading", x->what, c->res, want,
                    (unsigned long long)at);
    }
    x->done++;
    a->inflight--;
}

/* Until transfer x has every block it submitted back (a failed one stops
 * submitting). Under the mutex, which the wait lets go. */
static int settle(dt_aio *a, transfer *x)
{
    uint64_t t0 = dt_now_ns();
    while (x->done < (x->failed ? x->submitted : x->nblocks) && !a->broken)
        pthread_cond_wait(&a->done, &a->mu);
    a->wait_ns += dt_now_ns() - t0;
    if (x->done < (x->failed ? x->submitted : x->nblocks)) return -1; /* a->error says why */
    return x->failed ? -1 : 0;
}

int dt_aio_wait(dt_aio *a, int ticket)
{
    if (ticket < 0) return -1;
    pthread_mutex_lock(&a->mu);
    transfer *x = &a->t[ticket % MAX_TRANSFERS];
    int rc = x->used ? settle(a, x) : 0;
    x->used = 0;
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int dt_aio_drain(dt_aio *a)
{
    int rc = 0;
    pthread_mutex_lock(&a->mu);
    for (int i = 0; i < MAX_TRANSFERS; i++) {
        int slot = (a->next + i) % MAX_TRANSFERS;
        if (!a->t[slot].used) continue;
        if (settle(a, &a->t[slot])) rc = -1;
        a->t[slot].used = 0;
    }
    pthread_mutex_unlock(&a->mu);
    return rc;
}
