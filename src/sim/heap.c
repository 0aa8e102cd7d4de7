/* The event queue (heap.h). */
#include "sim/heap.h"

#include <stdlib.h>

int dt_sim_heap_push(dt_sim_heap *h, dt_sim_event e)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1024;
        dt_sim_event *ev = realloc(h->ev, cap * sizeof *ev);
        if (!ev) return -1;
        h->ev = ev;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (h->ev[up].t <= e.t) break;
        h->ev[i] = h->ev[up];
        i = up;
    }
    h->ev[i] = e;
    return 0;
}

int dt_sim_heap_pop(dt_sim_heap *h, dt_sim_event *e)
{
    if (!h->n) return 0;
    *e = h->ev[0];
    dt_sim_event last = h->ev[--h->n];
    size_t i = 0, n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h->ev[c + 1].t < h->ev[c].t) c++;
        if (last.t <= h->ev[c].t) break;
        h->ev[i] = h->ev[c];
        i = c;
    }
    if (n) h->ev[i] = last;
    return 1;
}

void dt_sim_heap_free(dt_sim_heap *h)
{
    free(h->ev);
    h->ev = NULL;
    h->n = h->cap = 0;
}
