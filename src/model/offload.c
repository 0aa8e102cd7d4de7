/* The optimizer's state in a file, streamed through aligned buffers. See
 * offload.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_DIRECT */
#endif
#include "model/offload.h"
#include "model/offload_disk.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/aio.h"
#include "core/alloc.h"
#include "core/atomic_file.h"
#include "core/str.h"
#include "core/timer.h"

#define IO_ALIGN 4096
#define MAX_STATES 3 /* two moments and the parameters */
#define MAX_BUFFERS 16

struct dt_opt_store {
    char path[DT_PATH_MAX]; /* what messages call the file: it has no name */
    int fd, direct;
    int nstates;
    int pstate;              /* the parameters' state buffer, or -1 (not offloaded) */
    size_t n, chunk, padded; /* floats: the state's, a chunk's, a region's */
    uint64_t bytes;          /* the file's */
    int nbuf;
    float *buf;              /* nbuf x nstates x chunk */
    dt_aio *aio;
    size_t *chunks, cap;     /* a step's chunk indices */
    float *map;
    uint64_t last_bytes;
    double last_wall_ms;
    uint64_t param_bytes_read; /* by dt_opt_store_read_params, since the store opened */
    /* The open stream (dt_opt_store_begin .. _end): a copy of its spans,
     * its chunks (chunks[0, nc)), the next to update and the next span,
     * the reads and writes in flight by slot, and when it began. */
    int open, nspans, next;
    dt_opt_span *spans;
    size_t nc, i;
    dt_opt_piece_fn update;
    void *ctx;
    int rd[MAX_BUFFERS][MAX_STATES], wr[MAX_BUFFERS][MAX_STATES];
    uint64_t t0;
};

dt_offload_opts dt_offload_defaults(const char *dir)
{
    return (dt_offload_opts){.dir = dir, .chunk_floats = 4u << 20, .buffers = 4,
                             .block_bytes = 1u << 20, .depth = 8};
}

/* A chunk: the options', or the state rounded up to 1024 floats if shorter. */
static size_t chunk_floats(const dt_offload_opts *o, size_t n)
{
    size_t c = (o->chunk_floats + 1023) / 1024 * 1024, whole = (n + 1023) / 1024 * 1024;
    return whole > 0 && whole < c ? whole : c;
}

static int buffer_count(const dt_offload_opts *o)
{
    return o->buffers < 3 ? 3 : o->buffers > MAX_BUFFERS ? MAX_BUFFERS : o->buffers;
}

size_t dt_offload_buffer_bytes(const dt_offload_opts *o, int nstates, size_t n)
{
    return (size_t)buffer_count(o) * (size_t)nstates * chunk_floats(o, n) * sizeof(float);
}

const char *dt_opt_store_path(const dt_opt_store *s) { return s->path; }
uint64_t dt_opt_store_file_bytes(const dt_opt_store *s) { return s->bytes; }

size_t dt_opt_store_buffer_bytes(const dt_opt_store *s)
{
    return (size_t)s->nbuf * (size_t)s->nstates * s->chunk * sizeof(float);
}

void dt_opt_store_last_step(const dt_opt_store *s, uint64_t *bytes, double *wall_ms)
{
    *bytes = s->last_bytes;
    *wall_ms = s->last_wall_ms;
}

/* The directory exists. */
static int check_dir(const char *dir, char *err, size_t n)
{
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return dt_strf(err, n, "--nvme-path %s: %s (create the directory first)", dir,
                       errno == ENOENT || !S_ISDIR(st.st_mode) ? "no such directory"
                                                               : strerror(errno)), -1;
    return 0;
}

static int room_error(const dt_opt_store *s, const char *dir, uint64_t avail, char *err,
                      size_t n)
{
    return dt_strf(err, n, "--nvme-path %s: this rank's optimizer state needs %llu bytes "
                   "(%.1f MiB) and the file system there has %llu free (%.1f MiB); free %.1f "
                   "MiB more, or give --nvme-path a directory with room (each rank of the job "
                   "on that file system needs its own file)", dir, (unsigned long long)s->bytes,
                   (double)s->bytes / 1048576.0, (unsigned long long)avail,
                   (double)avail / 1048576.0, (double)(s->bytes - avail) / 1048576.0), -1;
}

/* The file, sized to its bytes: its blocks are reserved now, so a full
 * disk fails here rather than in a step (and one that has too few free
 * says so before trying; a directory where no file can be made, such as
 * /proc, which has none free either, says that instead). */
static int make_file(dt_opt_store *s, const char *dir, const char *tag, char *err, size_t n)
{
    char stem[96];
    dt_strf(stem, sizeof stem, "dtrain-optim-%s", tag);
    if ((s->fd = dt_offload_open_unnamed(dir, stem)) < 0)
        return dt_strf(err, n, "--nvme-path %s: cannot create a file in it: %s", dir,
                       strerror(errno)), -1;
    uint64_t avail = dt_offload_free_bytes(dir);
    /* Sized before O_DIRECT: where the file system cannot allocate
     * (NFS 3), glibc writes a byte a block, which O_DIRECT refuses. */
    int rc = avail < s->bytes ? ENOSPC : posix_fallocate(s->fd, 0, (off_t)s->bytes);
    if (rc == 0) {
        dt_offload_try_direct(s->fd, &s->direct);
        return 0;
    }
    close(s->fd);
    s->fd = -1;
    if (rc == ENOSPC && (avail = dt_offload_free_bytes(dir)) < s->bytes)
        return room_error(s, dir, avail, err, n);
    return dt_strf(err, n, "--nvme-path %s: cannot size %s to the %llu bytes of this rank's "
                   "optimizer state: %s", dir, s->path, (unsigned long long)s->bytes,
                   strerror(rc)), -1;
}

int dt_opt_store_create(dt_opt_store **out, const dt_offload_opts *o, const char *tag,
                        int nstates, int with_params, size_t n, char *err, size_t errlen)
{
    dt_opt_store *s = calloc(1, sizeof *s);
    if (!s) return dt_strf(err, errlen, "offload: out of memory"), -1;
    s->fd = -1;
    nstates += with_params != 0;
    s->nstates = nstates < MAX_STATES ? nstates : MAX_STATES;
    s->pstate = with_params ? s->nstates - 1 : -1;
    s->n = n;
    s->chunk = chunk_floats(o, n);
    s->padded = (n + s->chunk - 1) / s->chunk * s->chunk;
    s->bytes = (uint64_t)s->nstates * s->padded * sizeof(float);
    s->nbuf = buffer_count(o);
    dt_strf(s->path, sizeof s->path, "an unnamed file in %s", o->dir);
    size_t buf_bytes = dt_opt_store_buffer_bytes(s);
    if (check_dir(o->dir, err, errlen) || make_file(s, o->dir, tag, err, errlen) ||
        dt_aio_open(&s->aio, o->depth, o->block_bytes, err, errlen)) {
        dt_opt_store_destroy(s);
        return -1;
    }
    if (posix_memalign((void **)&s->buf, IO_ALIGN, buf_bytes)) {
        s->buf = NULL;
        dt_opt_store_destroy(s);
        return dt_strf(err, errlen, "offload: out of memory for %zu bytes of buffers",
                       buf_bytes), -1;
    }
    dt_mem_account(DT_MEM_OPTIM, (long long)buf_bytes);
    *out = s;
    return 0;
}

void dt_opt_store_destroy(dt_opt_store *s)
{
    if (!s) return;
    if (s->map) munmap(s->map, s->bytes);
    if (s->aio) dt_aio_drain(s->aio), dt_aio_close(s->aio); /* an open stream's I/O */
    if (s->buf) {
        free(s->buf);
        dt_mem_account(DT_MEM_OPTIM, -(long long)dt_opt_store_buffer_bytes(s));
    }
    if (s->fd >= 0) close(s->fd);
    free(s->chunks);
    free(s->spans);
    free(s);
}

/* The file still has its size. It has no name, so only its descriptor
 * (/proc/PID/fd) could have truncated it. */
static int check_file(const dt_opt_store *s, char *err, size_t n)
{
    struct stat st;
    if (fstat(s->fd, &st) == 0 && (uint64_t)st.st_size < s->bytes)
        return dt_strf(err, n, "offload: %s holds %llu bytes, and the job made it %llu: it was "
                       "truncated under the running job; resume from the last checkpoint",
                       s->path, (unsigned long long)st.st_size,
                       (unsigned long long)s->bytes), -1;
    return 0;
}

/* The chunks the spans touch, ascending, each once. */
static int list_chunks(dt_opt_store *s, const dt_opt_span *sp, int n, size_t *count)
{
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        if (sp[i].hi <= sp[i].lo) continue;
        size_t first = sp[i].at / s->chunk, last = (sp[i].at + sp[i].hi - sp[i].lo - 1) / s->chunk;
        for (size_t c = first; c <= last; c++) {
            if (k > 0 && s->chunks[k - 1] >= c) continue;
            if (k == s->cap) {
                size_t cap = s->cap ? 2 * s->cap : 64;
                size_t *p = realloc(s->chunks, cap * sizeof *p);
                if (!p) return -1;
                s->chunks = p, s->cap = cap;
            }
            s->chunks[k++] = c;
        }
    }
    *count = k;
    return 0;
}

static float *slot_state(const dt_opt_store *s, int slot, int state)
{
    return s->buf + ((size_t)slot * (size_t)s->nstates + (size_t)state) * s->chunk;
}

static uint64_t chunk_offset(const dt_opt_store *s, size_t chunk, int state)
{
    return ((uint64_t)state * s->padded + (uint64_t)chunk * s->chunk) * sizeof(float);
}

/* One transfer of chunk c's states to or from buffer slot; tickets in t. */
static int transfer(dt_opt_store *s, int write, size_t c, int slot, int *t)
{
    for (int st = 0; st < s->nstates; st++) {
        size_t len = s->chunk * sizeof(float);
        t[st] = write ? dt_aio_write(s->aio, s->fd, s->path, slot_state(s, slot, st), len,
                                     chunk_offset(s, c, st))
                      : dt_aio_read(s->aio, s->fd, s->path, slot_state(s, slot, st), len,
                                    chunk_offset(s, c, st));
        if (t[st] < 0) return -1;
    }
    return 0;
}

static int finish(dt_opt_store *s, int *t)
{
    int rc = 0;
    for (int st = 0; st < s->nstates; st++) {
        if (t[st] >= 0 && dt_aio_wait(s->aio, t[st])) rc = -1;
        t[st] = -1;
    }
    return rc;
}

/* The spans' pieces in chunk c (its buffer at slot), from span *next on. */
static void update_chunk(dt_opt_store *s, size_t c, int slot, const dt_opt_span *sp, int n,
                         int *next, dt_opt_piece_fn update, void *ctx)
{
    const size_t c0 = c * s->chunk, c1 = c0 + s->chunk;
    for (int i = *next; i < n; i++) {
        size_t a = sp[i].at, b = sp[i].at + (sp[i].hi - sp[i].lo);
        if (a >= c1) break;
        size_t lo = a > c0 ? a : c0, hi = b < c1 ? b : c1;
        if (lo < hi) {
            size_t k = lo - a;
            float *states[MAX_STATES];
            for (int st = 0; st < s->nstates; st++) states[st] = slot_state(s, slot, st) + (lo - c0);
            float *params = s->pstate >= 0 ? states[s->pstate] : sp[i].params + k;
            dt_opt_span piece = {params, dt_gbuf_at(sp[i].grads, k), lo, sp[i].lo + k,
                                 sp[i].lo + k + (hi - lo)};
            update(ctx, &piece, states);
        }
        if (b > c1) break; /* the span goes on into the next chunk */
        *next = i + 1;
    }
}

/* Fails the open stream: its I/O drained, the stream closed. */
static int stream_fail(dt_opt_store *s, char *err, size_t errlen)
{
    dt_aio_drain(s->aio);
    s->open = 0;
    return dt_strf(err, errlen, "offload: %s", dt_aio_error(s->aio)), -1;
}

int dt_opt_store_begin(dt_opt_store *s, const dt_opt_span *sp, int n, dt_opt_piece_fn update,
                       void *ctx, char *err, size_t errlen)
{
    if (dt_opt_store_end(s, err, errlen) || check_file(s, err, errlen)) return -1;
    dt_opt_span *copy = realloc(s->spans, (size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (!copy || list_chunks(s, sp, n, &s->nc)) {
        if (copy) s->spans = copy;
        return dt_strf(err, errlen, "offload: out of memory"), -1;
    }
    s->spans = copy;
    memcpy(s->spans, sp, (size_t)n * sizeof *sp);
    s->nspans = n, s->next = 0, s->i = 0;
    s->update = update, s->ctx = ctx;
    memset(s->rd, -1, sizeof s->rd);
    memset(s->wr, -1, sizeof s->wr);
    s->t0 = dt_now_ns();
    s->open = 1;
    /* Chunk j goes to slot j % nb once the write of chunk j - nb from that
     * slot is done; chunk i is updated while chunks up to i + ahead are
     * read and chunk i - 1 is written. */
    const int nb = s->nbuf, ahead = nb - 2;
    for (size_t j = 0; j < s->nc && j < (size_t)ahead; j++)
        if (transfer(s, 0, s->chunks[j], (int)(j % nb), s->rd[j % nb]))
            return stream_fail(s, err, errlen);
    return 0;
}

int dt_opt_store_advance(dt_opt_store *s, size_t upto, char *err, size_t errlen)
{
    const int nb = s->nbuf, ahead = nb - 2;
    for (; s->open && s->i < s->nc && s->chunks[s->i] * s->chunk < upto; s->i++) {
        size_t i = s->i, j = i + (size_t)ahead;
        int slot = (int)(i % nb);
        if (j < s->nc && (finish(s, s->wr[j % nb]) ||
                          transfer(s, 0, s->chunks[j], (int)(j % nb), s->rd[j % nb])))
            return stream_fail(s, err, errlen);
        if (finish(s, s->rd[slot])) return stream_fail(s, err, errlen);
        update_chunk(s, s->chunks[i], slot, s->spans, s->nspans, &s->next, s->update, s->ctx);
        if (transfer(s, 1, s->chunks[i], slot, s->wr[slot])) return stream_fail(s, err, errlen);
    }
    return 0;
}

int dt_opt_store_end(dt_opt_store *s, char *err, size_t errlen)
{
    if (!s->open) return 0;
    if (dt_opt_store_advance(s, SIZE_MAX, err, errlen)) return -1;
    if (dt_aio_drain(s->aio)) return stream_fail(s, err, errlen);
    s->open = 0;
    s->last_bytes = 2ull * s->nc * (uint64_t)s->nstates * s->chunk * sizeof(float);
    s->last_wall_ms = (double)(dt_now_ns() - s->t0) * 1e-6;
    return 0;
}

int dt_opt_store_pending(const dt_opt_store *s) { return s->open; }

int dt_opt_store_step(dt_opt_store *s, const dt_opt_span *sp, int n, dt_opt_piece_fn update,
                      void *ctx, char *err, size_t errlen)
{
    if (dt_opt_store_begin(s, sp, n, update, ctx, err, errlen)) return -1;
    return dt_opt_store_end(s, err, errlen);
}

int dt_opt_store_has_params(const dt_opt_store *s) { return s->pstate >= 0; }

/* A piece of the parameters' region: whole 4096-byte blocks (O_DIRECT's
 * unit) in an aligned buffer; ZeRO's pieces are whole norm blocks. */
static int piece_ok(const dt_opt_store *s, size_t at, size_t n, const void *buf, char *err,
                    size_t errlen)
{
    if (s->pstate < 0 || at + n > s->n || at % 1024 || n % 1024 || (uintptr_t)buf % IO_ALIGN)
        return dt_strf(err, errlen, "offload: parameters [%zu, %zu) of %s are not whole "
                       "aligned blocks of its %zu (a bug)", at, at + n, s->path, s->n), -1;
    return 0;
}

static uint64_t param_offset(const dt_opt_store *s, size_t at)
{
    return ((uint64_t)s->pstate * s->padded + at) * sizeof(float);
}

int dt_opt_store_read_params(dt_opt_store *s, size_t at, size_t n, float *buf, char *err,
                             size_t errlen)
{
    if (piece_ok(s, at, n, buf, err, errlen) || dt_opt_store_end(s, err, errlen) ||
        check_file(s, err, errlen))
        return -1;
    int t = dt_aio_read(s->aio, s->fd, s->path, buf, n * sizeof(float), param_offset(s, at));
    if (t < 0) dt_strf(err, errlen, "offload: %s", dt_aio_error(s->aio));
    else s->param_bytes_read += n * sizeof(float);
    return t;
}

int dt_opt_store_write_params(dt_opt_store *s, size_t at, size_t n, const float *buf,
                              char *err, size_t errlen)
{
    if (piece_ok(s, at, n, buf, err, errlen)) return -1;
    int t = dt_aio_write(s->aio, s->fd, s->path, buf, n * sizeof(float), param_offset(s, at));
    return dt_opt_store_wait(s, t, err, errlen);
}

int dt_opt_store_wait(dt_opt_store *s, int ticket, char *err, size_t errlen)
{
    if (ticket >= 0 && dt_aio_wait(s->aio, ticket) == 0) return 0;
    return dt_strf(err, errlen, "offload: %s", dt_aio_error(s->aio)), -1;
}

void dt_opt_store_totals(const dt_opt_store *s, uint64_t *param_bytes_read, uint64_t *wait_ns)
{
    *param_bytes_read = s->param_bytes_read;
    *wait_ns = dt_aio_wait_ns(s->aio);
}

int dt_opt_store_map(dt_opt_store *s, float **states, char *err, size_t errlen)
{
    if (dt_opt_store_end(s, err, errlen) || check_file(s, err, errlen)) return -1;
    posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED); /* nothing cached from before */
    void *p = mmap(NULL, s->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (p == MAP_FAILED)
        return dt_strf(err, errlen, "offload: mapping %s (%llu bytes): %s", s->path,
                       (unsigned long long)s->bytes, strerror(errno)), -1;
    s->map = p;
    for (int st = 0; st < s->nstates; st++) states[st] = s->map + (size_t)st * s->padded;
    return 0;
}

int dt_opt_store_unmap(dt_opt_store *s, int written, char *err, size_t errlen)
{
    if (!s->map) return 0;
    int rc = written && msync(s->map, s->bytes, MS_SYNC) ? -1 : 0;
    int e = errno;
    munmap(s->map, s->bytes);
    s->map = NULL;
    posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED); /* the stream reads the disk */
    if (rc)
        dt_strf(err, errlen, "offload: writing the restored state to %s: %s", s->path,
                strerror(e));
    return rc;
}
