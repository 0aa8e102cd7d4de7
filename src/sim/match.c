/* Sends meeting receives (match.h): an open-addressing table (linear
 * probing, deletion by shifting back) of FIFO queues. */
#include "sim/match.h"

#include <stdlib.h>
#include <string.h>

static size_t hash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k;
}

static dt_sim_mslot *find(dt_sim_match *m, uint64_t key)
{
    size_t i = hash(key) & m->mask;
    while (m->slot[i].key && m->slot[i].key != key) i = (i + 1) & m->mask;
    return &m->slot[i];
}

static int grow(dt_sim_match *m)
{
    size_t cap = m->slot ? (m->mask + 1) * 2 : 1024;
    dt_sim_match old = *m;
    m->slot = calloc(cap, sizeof *m->slot);
    if (!m->slot) {
        m->slot = old.slot;
        return -1;
    }
    m->mask = cap - 1;
    for (size_t i = 0; old.slot && i <= old.mask; i++)
        if (old.slot[i].key) *find(m, old.slot[i].key) = old.slot[i];
    free(old.slot);
    return 0;
}

/* Removes the slot at s, shifting later members of its probe run back. */
static void erase(dt_sim_match *m, dt_sim_mslot *s)
{
    size_t i = (size_t)(s - m->slot), j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->slot[j].key) break;
        size_t home = hash(m->slot[j].key) & m->mask;
        /* j may fill the hole at i unless its home lies cyclically in (i, j]. */
        if (i <= j ? (home > i && home <= j) : (home > i || home <= j)) continue;
        m->slot[i] = m->slot[j];
        i = j;
    }
    m->slot[i].key = 0;
    m->used--;
}

static int new_node(dt_sim_match *m, int post)
{
    int n = m->free_node;
    if (n >= 0) {
        m->free_node = m->node_next[n];
    } else {
        if (m->nodes == m->node_alloc) {
            int alloc = m->node_alloc ? 2 * m->node_alloc : 1024;
            int *p = realloc(m->node_post, (size_t)alloc * sizeof *p);
            if (p) m->node_post = p;
            int *q = realloc(m->node_next, (size_t)alloc * sizeof *q);
            if (q) m->node_next = q;
            if (!p || !q) return -1;
            m->node_alloc = alloc;
        }
        n = m->nodes++;
    }
    m->node_post[n] = post;
    m->node_next[n] = -1;
    return n;
}

static int take(dt_sim_match *m, dt_sim_mslot *s)
{
    int n = s->head, post = m->node_post[n];
    s->head = m->node_next[n];
    m->node_next[n] = m->free_node;
    m->free_node = n;
    m->waiting--;
    if (s->head < 0) erase(m, s);
    return post;
}

int dt_sim_match_pair(dt_sim_match *m, uint64_t key, int side, int post)
{
    if (!m->slot) m->free_node = -1;
    if ((!m->slot || 2 * (m->used + 1) > m->mask + 1) && grow(m)) return -2;
    dt_sim_mslot *s = find(m, key);
    if (s->key && s->side != side) return take(m, s);
    int n = new_node(m, post);
    if (n < 0) return -2;
    if (!s->key) {
        *s = (dt_sim_mslot){key, side, n, n};
        m->used++;
    } else {
        m->node_next[s->tail] = n;
        s->tail = n;
    }
    m->waiting++;
    return -1;
}

void dt_sim_match_free(dt_sim_match *m)
{
    free(m->slot);
    free(m->node_post);
    free(m->node_next);
    memset(m, 0, sizeof *m);
}
