/*
 * Measuring, on the machine at hand, from what message size pulling by
 * cross-memory attach (one copy, by the kernel) beats streaming through a
 * ring (two copies: the sender's into the ring, the receiver's out of it).
 *
 * Which wins depends on the CPU. In a collective every rank moves data,
 * so both copies of a streamed byte cost a busy core, against the pull's
 * one kernel copy (which also pins the pages). Where two user copies
 * through a ring in a shared cache are cheaper than that kernel copy
 * (AMD EPYC: the design's reference), streaming wins at every size; where
 * they are not (Intel Xeon, Emerald Rapids: a 2-rank all-to-all-v of
 * 256 KiB-16 MiB ran at 0.55-0.75x of a pull at every size), pulling
 * wins from some tens of KiB. So the transport measures instead of
 * assuming: two threads of this process exchange a message both ways at
 * once, through rings as two ranks do (threads and processes share the
 * caches alike), and then pull it (process_vm_readv on our own pid: the
 * kernel's copy and pinning are the same). The pull also pays a fixed
 * cost a streamed message does not: the system call and the
 * acknowledgement's round trip between the cores; the crossover is where
 * the pull's smaller cost per byte has paid for it.
 *
 * Each figure is the best of a few repetitions (the least disturbed by
 * other load). The whole takes a few milliseconds, once per process.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "comm/transport/shm_layout.h"
#include "core/timer.h"

#define MSG (1u << 20)      /* the message exchanged each way */
#define RING (256u << 10)   /* each way's ring (cache-sized, as the transport's) */
#define REPS 9
#define PINGS 64
#define SMALLEST (4u << 10) /* below this the ring always wins */
#define LARGEST (64u << 20) /* a crossover past this is no crossover */
#define SPINS_PER_YIELD 256 /* share the core when the other thread is not running */

/* The writer thread copies a piece of the message into the ring when the
 * main thread asks (turn odd), and hands the turn back (even). */
typedef struct {
    _Alignas(64) _Atomic uint64_t turn;
    size_t off; /* the piece asked for; NONE: no copy; DONE: stop */
    char *ring;
    const char *src;
} probe;

#define NONE ((size_t)-1)
#define DONE ((size_t)-2)

static void wait_for(_Atomic uint64_t *v, uint64_t at_least)
{
    unsigned spins = 0;
    while (atomic_load_explicit(v, memory_order_acquire) < at_least)
        if (++spins % SPINS_PER_YIELD == 0)
            sched_yield();
        else
            __builtin_ia32_pause();
}

static void *writer(void *arg)
{
    probe *p = arg;
    for (uint64_t t = 1;; t += 2) {
        wait_for(&p->turn, t);
        if (p->off == DONE) return NULL;
        if (p->off != NONE) memcpy(p->ring, p->src + p->off, RING);
        atomic_store_explicit(&p->turn, t + 1, memory_order_release);
    }
}

static void ask(probe *p, size_t off)
{
    p->off = off;
    uint64_t t = atomic_fetch_add_explicit(&p->turn, 1, memory_order_acq_rel) + 1;
    if (off != DONE) wait_for(&p->turn, t + 1);
}

static int pull(char *to, const char *from, size_t n)
{
    struct iovec local = {to, n}, remote = {(void *)from, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n ? 0 : -1;
}

static void keep_best(double *best, double t)
{
    if (t < *best) *best = t;
}

typedef struct {
    double rtt, stream, pulled; /* best times */
} timings;

/* The cores take turns, so that each copy is timed whole even where the
 * two threads share a core: a streamed message costs the writer's copies
 * into the ring, ours out of it (its lines in the writer's cache) and a
 * round trip a ring's worth; a pulled one, the kernel's copy. */
static void time_turns(probe *p, char *dst, timings *t)
{
    t->rtt = t->stream = t->pulled = 1e30;
    for (int i = 0; i < PINGS; i++) {
        double t0 = dt_now_s();
        ask(p, NONE);
        keep_best(&t->rtt, dt_now_s() - t0);
    }
    for (int r = 0; r < REPS; r++) {
        double t0 = dt_now_s();
        for (size_t off = 0; off < MSG; off += RING) {
            ask(p, off);
            memcpy(dst + off, p->ring, RING);
        }
        keep_best(&t->stream, dt_now_s() - t0);
    }
    for (int r = 0; r < REPS; r++) {
        double t0 = dt_now_s();
        if (pull(dst, p->src, MSG) < 0) t->pulled = -1;
        if (t->pulled < 0) return;
        keep_best(&t->pulled, dt_now_s() - t0);
    }
}

/* The writer runs on another CPU than ours, whatever this rank is bound
 * to: it stands in for a peer rank, whose core is idle meanwhile (the
 * peers wait for our figures in setup's barrier). */
static void elsewhere(pthread_attr_t *a)
{
    cpu_set_t others;
    CPU_ZERO(&others);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    int me = sched_getcpu();
    for (int i = 0; i < n && i < CPU_SETSIZE; i++)
        if (i != me) CPU_SET(i, &others);
    if (CPU_COUNT(&others) > 0) pthread_attr_setaffinity_np(a, sizeof others, &others);
}

static int time_both(char *buf, timings *t)
{
    probe *p = aligned_alloc(64, sizeof *p);
    pthread_t th;
    pthread_attr_t a;
    if (!p) return -1;
    memset(p, 0, sizeof *p);
    p->src = buf;
    p->ring = buf + 2 * (size_t)MSG;
    pthread_attr_init(&a);
    elsewhere(&a);
    int rc = pthread_create(&th, &a, writer, p) ? -1 : 0;
    pthread_attr_destroy(&a);
    if (rc == 0) {
        time_turns(p, buf + MSG, t);
        ask(p, DONE);
        pthread_join(th, NULL);
        rc = t->pulled < 0 ? -1 : 0;
    }
    free(p);
    return rc;
}

/* The best time of a pull too small for its copy to count: the call. */
static double time_call(char *to, const char *from)
{
    double best = 1e30;
    for (int r = 0; r < REPS; r++) {
        double t0 = dt_now_s();
        if (pull(to, from, LINE) < 0) return -1;
        keep_best(&best, dt_now_s() - t0);
    }
    return best;
}

static size_t crossover(double fixed, double stream, double pulled)
{
    double gain = (stream - pulled) / MSG; /* seconds a byte saves by pulling */
    if (gain <= 0 || fixed / gain > LARGEST) return SIZE_MAX;
    size_t at = SMALLEST;
    while ((double)at < fixed / gain) at *= 2;
    return at;
}

static dt_shm_probe_result result = {0, 0, 0, SIZE_MAX};

static void measure(void)
{
    size_t bytes = 2 * (size_t)MSG + RING;
    char *buf = aligned_alloc(4096, bytes);
    if (!buf) return;
    memset(buf, 1, bytes);
    timings t;
    double call = time_call(buf + MSG, buf);
    if (call >= 0 && time_both(buf, &t) == 0) {
        double fixed = call + t.rtt;
        result = (dt_shm_probe_result){MSG / t.stream, MSG / t.pulled, fixed,
                                       crossover(fixed, t.stream, t.pulled)};
    }
    free(buf);
}

size_t dt_shm_probe_pull_min(dt_shm_probe_result *out)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, measure);
    if (out) *out = result;
    return result.pull_min;
}
