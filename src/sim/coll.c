/* Recording collectives' per-rank schedules by dry runs (coll.h). */
#include "sim/coll.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/cost/dry.h"
#include "sim/sched_size.h"

static const dt_coll_kind kinds[] = {DT_COLL_ALLREDUCE, DT_COLL_REDUCE_SCATTER,
                                     DT_COLL_ALLGATHER, DT_COLL_BROADCAST, DT_COLL_ALLTOALL};
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

int dt_sim_coll_kind(const char *name, dt_coll_kind *k, char *err, size_t len)
{
    for (int i = 0; i < NKINDS; i++)
        if (!strcmp(dt_coll_name(kinds[i]), name)) {
            *k = kinds[i];
            return 0;
        }
    snprintf(err, len, "--collective '%s' is not one of allreduce, reduce_scatter, allgather, "
             "broadcast, alltoall", name);
    return -1;
}

/* ---- the recorder: a dry run's hook ------------------------------------ */

typedef struct {
    unsigned char *buf;
    size_t len, cap;
    int rank;
    int full; /* DT_SIM_SCHED_MAX reached, or no memory */
    size_t steps;
} recorder;

static void put_bytes(recorder *r, const void *p, size_t n)
{
    if (r->full) return;
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 4096;
        while (cap < r->len + n) cap *= 2;
        unsigned char *b = cap > DT_SIM_SCHED_MAX ? NULL : realloc(r->buf, cap);
        if (!b) {
            r->full = 1;
            return;
        }
        r->buf = b;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, p, n);
    r->len += n;
}

static void put_varint(recorder *r, uint64_t v)
{
    unsigned char b[10];
    int n = 0;
    do {
        b[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) b[n] |= 0x80;
        n++;
    } while (v);
    put_bytes(r, b, (size_t)n);
}

static uint64_t zigzag(int64_t v) { return v < 0 ? ((uint64_t)(-v) << 1) - 1 : (uint64_t)v << 1; }
static int64_t unzigzag(uint64_t v) { return v & 1 ? -(int64_t)((v + 1) >> 1) : (int64_t)(v >> 1); }

static void rec_step(void *arg, const dt_dry_op *ops, int n)
{
    recorder *r = arg;
    if (n <= 0) return; /* nothing to wait for: the step takes no time */
    put_varint(r, (uint64_t)n << 1);
    for (int i = 0; i < n; i++) {
        put_varint(r, zigzag((int64_t)ops[i].peer - r->rank) << 2 | (uint64_t)ops[i].kind);
        put_varint(r, ops[i].bytes);
    }
    r->steps++;
}

static void rec_local(void *arg, double seconds)
{
    recorder *r = arg;
    if (!(seconds > 0)) return;
    put_varint(r, 1);
    put_bytes(r, &seconds, sizeof seconds);
}

/* ---- recording ------------------------------------------------------------ */

/* Bytes of one element of a call in the nccl-tests sense: all ranks' data
 * for all-gather, reduce-scatter and all-to-all. */
static size_t unit_bytes(dt_coll_kind kind, int p)
{
    size_t per = sizeof(float);
    if (kind == DT_COLL_ALLGATHER || kind == DT_COLL_REDUCE_SCATTER || kind == DT_COLL_ALLTOALL)
        per *= (size_t)p;
    return per;
}

dt_coll_args dt_sim_coll_call(dt_coll_kind kind, size_t bytes, int p)
{
    size_t per = unit_bytes(kind, p);
    size_t count = bytes / per ? bytes / per : 1;
    return (dt_coll_args){.kind = kind, .count = count, .dtype = DT_F32, .op = DT_SUM,
                          .root = 0, .algo = DT_ALGO_AUTO};
}

size_t dt_sim_coll_bytes(const dt_coll_args *a, int p) { return a->count * unit_bytes(a->kind, p); }

static int choose(dt_sim_world *w, dt_coll_args *a, const char *algo, const dt_algo **out,
                  char *err, size_t len)
{
    if (!algo || !strcmp(algo, "auto")) {
        if (dt_algo_pick(w->comm, a, out) == 0) return 0;
        snprintf(err, len, "no %s algorithm can run on %d ranks", dt_coll_name(a->kind),
                 w->ranks);
        return -1;
    }
    int i = dt_algo_find(a->kind, algo);
    if (i < 0 || !dt_algo_usable(w->comm, &dt_algo_table[i], err, len)) {
        const char *names[32];
        int n = dt_comm_algo_names(dt_coll_name(a->kind), names, 32);
        size_t o = (size_t)snprintf(err, len, "--algo '%s' is not one of the %s algorithms the "
                                    "simulator can run (choices: auto", algo,
                                    dt_coll_name(a->kind));
        for (int k = 0; k < n && o < len; k++)
            if (strcmp(names[k], "mpi")) o += (size_t)snprintf(err + o, len - o, ", %s", names[k]);
        if (o < len) snprintf(err + o, len - o, ")");
        return -1;
    }
    *out = &dt_algo_table[i];
    return 0;
}

#define TELL_EVERY 4096 /* ranks recorded between reports of progress */

static int record_ranks(dt_sim_sched *s, dt_sim_world *w, const dt_algo *al, const dt_coll_args *a,
                        char *err, size_t len)
{
    recorder r = {0};
    dt_dry_hook hook = {rec_step, rec_local, &r};
    char what[96];
    snprintf(what, sizeof what, "recording %s %s of %zu bytes over %d ranks",
             dt_coll_name(a->kind), al->name, dt_sim_coll_bytes(a, w->ranks), w->ranks);
    for (int k = 0; k < w->ranks && !r.full; k++) {
        if (k % TELL_EVERY == 0) dt_sim_tell(w, what, k, w->ranks);
        s->start[k] = r.len;
        r.rank = k;
        if (dt_dry_run_rank(w->comm, al, a, k, &hook) < 0) {
            free(r.buf);
            snprintf(err, len, "%s %s cannot run on %d ranks here", dt_coll_name(a->kind),
                     al->name, w->ranks);
            return -1;
        }
    }
    if (r.full) {
        free(r.buf);
        int n = snprintf(err, len, "the schedule of %s %s over %d ranks needs more than %llu "
                         "GiB; ", dt_coll_name(a->kind), al->name, w->ranks,
                         DT_SIM_SCHED_MAX >> 30);
        if (n > 0 && (size_t)n < len)
            dt_sim_sched_suggest(w, al, a, (double)DT_SIM_SCHED_MAX, err + n, len - (size_t)n);
        return -1;
    }
    dt_sim_tell(w, what, w->ranks, w->ranks);
    s->start[w->ranks] = r.len;
    s->code = r.buf;
    s->steps = r.steps;
    return 0;
}

int dt_sim_sched_record(dt_sim_sched *s, dt_sim_world *w, dt_coll_kind kind, const char *algo,
                        size_t bytes, char *err, size_t len)
{
    memset(s, 0, sizeof *s);
    dt_coll_args a = dt_sim_coll_call(kind, bytes, w->ranks);
    const dt_algo *al;
    if (choose(w, &a, algo, &al, err, len) ||
        dt_sim_sched_fits(w, al, &a, (double)DT_SIM_SCHED_MAX, err, len))
        return -1;
    s->kind = kind;
    s->size = w->ranks;
    s->bytes = dt_sim_coll_bytes(&a, w->ranks);
    snprintf(s->algo, sizeof s->algo, "%s", al->name);
    snprintf(s->label, sizeof s->label, "%s %s", dt_coll_name(kind), al->name);
    s->predicted = dt_cost_predict(w->comm, al, &a);
    s->start = malloc(((size_t)w->ranks + 1) * sizeof *s->start);
    if (!s->start) {
        snprintf(err, len, "out of memory for %d ranks' schedules", w->ranks);
        return -1;
    }
    if (record_ranks(s, w, al, &a, err, len)) {
        dt_sim_sched_free(s);
        return -1;
    }
    return 0;
}

double dt_sim_coll_predict(dt_sim_world *w, dt_coll_kind kind, size_t bytes, const char **algo)
{
    dt_coll_args a = dt_sim_coll_call(kind, bytes, w->ranks);
    const dt_algo *al;
    char err[256];
    if (w->ranks < 2) return 0;
    if (choose(w, &a, NULL, &al, err, sizeof err)) return -1;
    if (algo) *algo = al->name;
    return dt_cost_predict(w->comm, al, &a);
}

void dt_sim_sched_free(dt_sim_sched *s)
{
    free(s->code);
    free(s->start);
    memset(s, 0, sizeof *s);
}

/* ---- reading back ------------------------------------------------------------ */

static uint64_t get_varint(dt_sim_cursor *c)
{
    uint64_t v = 0;
    for (int shift = 0; c->p < c->end; shift += 7) {
        unsigned char b = *c->p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) break;
    }
    return v;
}

int dt_sim_cursor_next(dt_sim_cursor *c, dt_sim_entry *e)
{
    if (c->p >= c->end) return 0;
    uint64_t h = get_varint(c);
    e->local = (int)(h & 1);
    e->nops = (int)(h >> 1);
    e->seconds = 0;
    if (e->local) {
        memcpy(&e->seconds, c->p, sizeof e->seconds);
        c->p += sizeof e->seconds;
    }
    return 1;
}

void dt_sim_cursor_op(dt_sim_cursor *c, dt_sim_op_rec *op)
{
    uint64_t v = get_varint(c);
    op->kind = (int)(v & 3);
    op->peer = c->rank + (int)unzigzag(v >> 2);
    op->bytes = (size_t)get_varint(c);
}
