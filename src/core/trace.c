/* The timeline recorder: events in chunks of a fixed size, so adding one
 * is a copy into the current chunk (no allocation per event) and a long
 * run never moves what was recorded. See trace.h. */
#include "core/trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"

#define CHUNK_EVENTS 1024

typedef struct chunk {
    struct chunk *next;
    size_t n;
    dt_trace_event ev[CHUNK_EVENTS];
} chunk;

/* `on` is read without the lock (the cheap test); the list only under it.
 * An add that saw `on` before a stop checks again under the lock. */
static atomic_int on;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static chunk *head, *tail;
static size_t total, dropped;
static uint64_t started_ns;

dt_trace_args dt_trace_noargs(void)
{
    dt_trace_args a = {-1, -1, -1, -1, -1, -1, -1};
    return a;
}

static void free_chunks(void)
{
    while (head) {
        chunk *c = head;
        head = c->next;
        free(c);
    }
    tail = NULL;
    total = dropped = 0;
}

int dt_trace_start(void)
{
    pthread_mutex_lock(&lock);
    free_chunks();
    head = tail = calloc(1, sizeof *head);
    started_ns = dt_now_ns();
    atomic_store(&on, head != NULL);
    pthread_mutex_unlock(&lock);
    return head ? 0 : -1;
}

void dt_trace_stop(void)
{
    pthread_mutex_lock(&lock);
    atomic_store(&on, 0);
    free_chunks();
    pthread_mutex_unlock(&lock);
}

uint64_t dt_trace_started_ns(void) { return started_ns; }

int dt_trace_on(void) { return atomic_load_explicit(&on, memory_order_relaxed); }

uint64_t dt_trace_now(void) { return dt_trace_on() ? dt_now_ns() : 0; }

/* The chunk with room for one more event, or NULL out of memory. */
static chunk *room(void)
{
    if (tail->n < CHUNK_EVENTS) return tail;
    chunk *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    tail->next = c;
    tail = c;
    return c;
}

void dt_trace_add(dt_trace_lane lane, const char *name, uint64_t start_ns, uint64_t end_ns,
                  const dt_trace_args *a)
{
    if (!dt_trace_on()) return;
    pthread_mutex_lock(&lock);
    chunk *c = atomic_load(&on) ? room() : NULL;
    if (c) {
        dt_trace_event *e = &c->ev[c->n++];
        e->name = name;
        e->start_ns = start_ns;
        e->end_ns = end_ns < start_ns ? start_ns : end_ns;
        e->lane = lane;
        e->a = a ? *a : dt_trace_noargs();
        total++;
    } else if (atomic_load(&on)) {
        dropped++;
    }
    pthread_mutex_unlock(&lock);
}

int dt_trace_snapshot_from(size_t first, dt_trace_event **ev, size_t *n, size_t *ndropped)
{
    pthread_mutex_lock(&lock);
    *ev = NULL;
    *n = total > first ? total - first : 0;
    *ndropped = dropped;
    int rc = 0;
    if (*n > 0 && !(*ev = malloc(*n * sizeof **ev))) rc = -1;
    size_t at = 0, skip = first; /* every chunk but the last is full */
    chunk *c = head;
    for (; c && skip >= CHUNK_EVENTS && c->next; c = c->next) skip -= CHUNK_EVENTS;
    for (; c && *ev; c = c->next, skip = 0) {
        size_t k = skip < c->n ? c->n - skip : 0;
        memcpy(*ev + at, c->ev + (c->n - k), k * sizeof *c->ev);
        at += k;
    }
    pthread_mutex_unlock(&lock);
    if (rc) *n = 0;
    return rc;
}

int dt_trace_snapshot(dt_trace_event **ev, size_t *n, size_t *ndropped)
{
    return dt_trace_snapshot_from(0, ev, n, ndropped);
}
