/* The optimizer's state on NVMe (model/offload.h) against the same state
 * in memory:
 *  - AdamW and SGD with momentum over a GPT layout, with spans like
 *    ZeRO's pieces (several, cutting tensors and chunks, one shorter than
 *    a chunk, a gap between two) and chunks of 1024 floats, so the stream
 *    runs many chunks with reads ahead and writes behind, 3 and 5
 *    buffers: after three steps the parameters and the state are the same
 *    bits as in memory;
 *  - the state read back through the mapping a checkpoint uses, and a
 *    state written through it then streamed: the same bits;
 *  - faults: a directory that does not exist, a disk too small (refused
 *    at creation naming the bytes needed and free), the file truncated
 *    under a running store (the step refuses, naming it and the bytes);
 *  - the file has no name: the directory stays empty while the store is
 *    open, the file goes with its descriptor, a process killed with
 *    SIGKILL (holding a store, or measuring the disk) leaves nothing, and
 *    files under the names of old versions (dtrain-optim-TAG.bin,
 *    dtrain-probe-PID.bin: a restart with the same PID, as in a
 *    container) stop neither and are left as they were; where the file
 *    system has no O_TMPFILE (open refuses it here, as NFS does) the file
 *    is unlinked as soon as it is made and the stream is the same bits;
 *  - the disk probe: at most the bytes asked, half of what is free. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_TMPFILE */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "core/file.h"
#include "model/gpt.h"
#include "model/offload.h"
#include "model/optimizer.h"

enum { L = 2, NH = 2, C = 32, V = 67, BLOCK = 16 };

static char dir[256];

/* A file system without O_TMPFILE (NFS, FUSE), while set: this program's
 * open() refuses it as theirs does, and passes everything else on. */
static int no_tmpfile;

int open(const char *path, int flags, ...)
{
    int mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, int);
        va_end(ap);
    }
    if (no_tmpfile && (flags & O_TMPFILE) == O_TMPFILE) return errno = EOPNOTSUPP, -1;
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

/* The names in dir. */
static int dir_entries(void)
{
    DIR *d = opendir(dir);
    int k = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        k += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d) closedir(d);
    return k;
}

/* This process's descriptors of files in dir: how many, and the last
 * one's number and what /proc says it is ("dir/#123 (deleted)"). */
static int fds_in_dir(int *fd, char *link, size_t n)
{
    DIR *d = opendir("/proc/self/fd");
    int k = 0;
    size_t len = strlen(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char p[300], l[512];
        snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
        ssize_t m = readlink(p, l, sizeof l - 1);
        if (m <= 0) continue;
        l[m] = 0;
        if (strncmp(l, dir, len) || l[len] != '/') continue;
        k++;
        if (fd) *fd = atoi(e->d_name);
        if (link) snprintf(link, n, "%s", l);
    }
    if (d) closedir(d);
    return k;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
}

/* Pieces of [0, n) as a ZeRO rank's: state laid end to end by `at`. */
static int spans_of(const dt_gpt *m, float *params, float *grads, dt_opt_span *sp, size_t *n)
{
    const size_t cuts[][2] = {{5, 1500}, {1500, 1600}, {2300, 7000}, {7000, m->n_floats}};
    size_t at = 0;
    int k = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t lo = cuts[i][0], hi = cuts[i][1];
        sp[k++] = (dt_opt_span){params + lo, dt_gbuf_f32(grads + lo), at, lo, hi};
        at += hi - lo;
    }
    *n = at;
    return k;
}

static void run(dt_opt_kind kind, int buffers)
{
    dt_gpt m;
    char err[512] = "";
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    CHECK(dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err) == 0, "layout: %s", err);
    size_t nf = m.n_floats;
    float *p_mem = malloc(nf * sizeof(float)), *p_nv = malloc(nf * sizeof(float));
    float *g = malloc(nf * sizeof(float));
    fill(p_mem, nf, 1);
    memcpy(p_nv, p_mem, nf * sizeof(float));
    dt_opt_span s_mem[8], s_nv[8];
    size_t n;
    int k = spans_of(&m, p_mem, g, s_mem, &n);
    spans_of(&m, p_nv, g, s_nv, &n);
    dt_optimizer mem, nv;
    double mom = kind == DT_OPT_SGD ? 0.9 : 0.0;
    CHECK(dt_optimizer_init(&mem, kind, n, 0.9, 0.95, 1e-8, 0.1, mom) == 0, "in memory");
    dt_offload_opts o = dt_offload_defaults(dir);
    o.chunk_floats = 1024;
    o.buffers = buffers;
    o.block_bytes = 4096;
    o.depth = 4;
    CHECK(dt_optimizer_init_offload(&nv, kind, n, 0.9, 0.95, 1e-8, 0.1, mom, &o, 0, "unit", err,
                                    sizeof err) == 0 && nv.store, "offloaded: %s", err);
    for (int step = 0; step < 3; step++) {
        fill(g, nf, 100 + (unsigned)step);
        dt_optimizer_begin_step(&mem);
        dt_optimizer_begin_step(&nv);
        CHECK(dt_optimizer_update_spans(&mem, &m, s_mem, k, 1e-2, 0.7f, err, sizeof err) == 0 &&
                  dt_optimizer_update_spans(&nv, &m, s_nv, k, 1e-2, 0.7f, err, sizeof err) == 0,
              "step %d: %s", step, err);
    }
    CHECK(memcmp(p_mem, p_nv, nf * sizeof(float)) == 0,
          "%s, %d buffers, chunks of 1024: the parameters after 3 steps are the in-memory "
          "bits", dt_opt_kind_name(kind), buffers);
    CHECK(dt_optimizer_state_map(&nv, err, sizeof err) == 0, "map: %s", err);
    CHECK(memcmp(mem.m, nv.m, n * sizeof(float)) == 0 &&
              (!mem.v || memcmp(mem.v, nv.v, n * sizeof(float)) == 0),
          "%s: the file's state through the mapping is the in-memory state's bits",
          dt_opt_kind_name(kind));
    /* A checkpoint's state written through the mapping, then streamed. */
    fill(mem.m, n, 7);
    memcpy(nv.m, mem.m, n * sizeof(float));
    CHECK(dt_optimizer_state_unmap(&nv, 1, err, sizeof err) == 0, "unmap: %s", err);
    fill(g, nf, 200);
    dt_optimizer_begin_step(&mem);
    dt_optimizer_begin_step(&nv);
    CHECK(dt_optimizer_update_spans(&mem, &m, s_mem, k, 1e-2, 1.0f, err, sizeof err) == 0 &&
              dt_optimizer_update_spans(&nv, &m, s_nv, k, 1e-2, 1.0f, err, sizeof err) == 0 &&
              memcmp(p_mem, p_nv, nf * sizeof(float)) == 0,
          "%s: a state restored through the mapping streams to the in-memory bits (%s)",
          dt_opt_kind_name(kind), err);
    dt_optimizer_free(&mem);
    dt_optimizer_free(&nv);
    CHECK(fds_in_dir(NULL, NULL, 0) == 0 && dir_entries() == 0,
          "the store's file is closed with it, and the directory is empty");
    free(p_mem), free(p_nv), free(g);
    dt_gpt_destroy(&m);
}

/* offload_param: the parameters as the store's last state. Pieces written
 * into it and read back are the same bits; the stream updates them where
 * a span gives no params pointer, to the in-memory update's bits. */
static void params_in_store(void)
{
    char err[512] = "";
    dt_gpt m;
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    CHECK(dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err) == 0, "layout: %s", err);
    size_t n = m.n_floats / 1024 * 1024; /* whole blocks: the store's unit */
    float *p_mem = malloc(n * sizeof(float)), *g = malloc(n * sizeof(float)), *back = NULL;
    CHECK(posix_memalign((void **)&back, 4096, n * sizeof(float)) == 0, "buffer");
    fill(p_mem, n, 3);
    fill(g, n, 4);
    memcpy(back, p_mem, n * sizeof(float));
    dt_optimizer mem, nv;
    CHECK(dt_optimizer_init(&mem, DT_OPT_ADAMW, n, 0.9, 0.95, 1e-8, 0.1, 0) == 0, "in memory");
    dt_offload_opts o = dt_offload_defaults(dir);
    o.chunk_floats = 2048;
    CHECK(dt_optimizer_init_offload(&nv, DT_OPT_ADAMW, n, 0.9, 0.95, 1e-8, 0.1, 0, &o, 1, "p",
                                    err, sizeof err) == 0 && nv.store, "store: %s", err);
    CHECK(dt_opt_store_write_params(nv.store, 0, n, back, err, sizeof err) == 0, "write: %s",
          err);
    dt_opt_span sm = {p_mem, dt_gbuf_f32(g), 0, 0, n}, sn = {NULL, dt_gbuf_f32(g), 0, 0, n};
    for (int step = 0; step < 2; step++) {
        dt_optimizer_begin_step(&mem);
        dt_optimizer_begin_step(&nv);
        CHECK(dt_optimizer_update_spans(&mem, &m, &sm, 1, 1e-2, 1.0f, err, sizeof err) == 0 &&
                  dt_optimizer_update_spans(&nv, &m, &sn, 1, 1e-2, 1.0f, err, sizeof err) == 0,
              "step %d: %s", step, err);
    }
    memset(back, 0, n * sizeof(float));
    int t1 = dt_opt_store_read_params(nv.store, 1024, n - 1024, back + 1024, err, sizeof err);
    int t0 = dt_opt_store_read_params(nv.store, 0, 1024, back, err, sizeof err);
    CHECK(t0 >= 0 && t1 >= 0 && dt_opt_store_wait(nv.store, t1, err, sizeof err) == 0 &&
              dt_opt_store_wait(nv.store, t0, err, sizeof err) == 0,
          "two reads in flight: %s", err);
    CHECK(memcmp(back, p_mem, n * sizeof(float)) == 0,
          "parameters streamed through the store are the in-memory update's bits");
    CHECK(dt_optimizer_state_map(&nv, err, sizeof err) == 0 && nv.params &&
              memcmp(nv.params, p_mem, n * sizeof(float)) == 0,
          "and the mapping shows them: %s", err);
    dt_optimizer_state_unmap(&nv, 0, err, sizeof err);
    CHECK(dt_opt_store_read_params(nv.store, 100, 1024, back, err, sizeof err) < 0 &&
              strstr(err, "not whole aligned blocks"),
          "a piece off the 4096-byte grid is refused: %s", err);
    dt_optimizer_free(&mem);
    dt_optimizer_free(&nv);
    free(p_mem), free(g), free(back);
    dt_gpt_destroy(&m);
}

static void faults(void)
{
    char err[512] = "", path[512];
    dt_offload_opts o = dt_offload_defaults("/nonexistent/dtrain");
    dt_opt_store *s = NULL;
    CHECK(dt_opt_store_create(&s, &o, "f", 2, 0, 1000, err, sizeof err) != 0 &&
              strstr(err, "/nonexistent/dtrain") && strstr(err, "no such directory"),
          "a missing directory is refused, naming it: %s", err);
    o = dt_offload_defaults(dir);
    CHECK(dt_opt_store_create(&s, &o, "f", 2, 0, (size_t)1 << 60, err, sizeof err) != 0 &&
              strstr(err, dir) && strstr(err, "needs 9223372036854775808 bytes") &&
              strstr(err, " free (") && strstr(err, "give --nvme-path a directory with room"),
          "a disk too small is refused at creation, naming the path, the bytes needed and "
          "free, and what would work: %s", err);
    CHECK(dir_entries() == 0, "and leaves nothing in the directory");
    o.chunk_floats = 1024;
    float state[2048] = {0}, params[2048] = {0}, grads[2048] = {0};
    (void)state;
    dt_gpt m;
    dt_gpt_config cfg = {.n_layer = L, .n_head = NH, .n_embd = C,
                         .vocab_size = V, .block_size = BLOCK};
    dt_gpt_create_layout(&m, &cfg, DT_PREC_F32, err, sizeof err);
    dt_opt_span sp = {params, dt_gbuf_f32(grads), 0, 0, 2048};
    dt_optimizer opt;
    CHECK(dt_optimizer_init_offload(&opt, DT_OPT_ADAMW, 2048, 0.9, 0.95, 1e-8, 0, 0, &o, 0, "t",
                                    err, sizeof err) == 0, "store: %s", err);
    int fd = -1;
    CHECK(fds_in_dir(&fd, NULL, 0) == 1, "the store's descriptor");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    CHECK(truncate(path, 4096) == 0, "truncating %s", path);
    dt_optimizer_begin_step(&opt);
    CHECK(dt_optimizer_update_spans(&opt, &m, &sp, 1, 1e-3, 1.0f, err, sizeof err) != 0 &&
              strstr(err, dir) && strstr(err, "holds 4096 bytes") &&
              strstr(err, "made it 16384") && strstr(err, "truncated"),
          "a file truncated under the store stops the step, naming it and the bytes: %s", err);
    dt_optimizer_free(&opt);
    dt_gpt_destroy(&m);
}

/* A store of 2 states of n floats, in chunks of 1024, tagged tag. */
static dt_opt_store *small_store(const char *tag, size_t n, char *err, size_t errlen)
{
    dt_offload_opts o = dt_offload_defaults(dir);
    o.chunk_floats = 1024;
    dt_opt_store *s = NULL;
    return dt_opt_store_create(&s, &o, tag, 2, 0, n, err, errlen) ? NULL : s;
}

/* While open, the store's file is a descriptor and no name: the
 * directory is empty; closing it frees it. Without O_TMPFILE it had a
 * name for a moment, made from the tag, and is unlinked. */
static void unnamed(void)
{
    char err[512] = "", link[512] = "";
    for (no_tmpfile = 0; no_tmpfile < 2; no_tmpfile++) {
        const char *how = no_tmpfile ? "without O_TMPFILE" : "with O_TMPFILE";
        dt_opt_store *s = small_store("u", 4096, err, sizeof err);
        CHECK(s, "%s: store: %s", how, err);
        CHECK(dir_entries() == 0 && fds_in_dir(NULL, link, sizeof link) == 1 &&
                  strstr(link, "(deleted)") &&
                  (!no_tmpfile || strstr(link, "/dtrain-optim-u-")),
              "%s: the open store's file has no name in the directory (%s)", how, link);
        CHECK(s && strstr(dt_opt_store_path(s), dir) && strstr(dt_opt_store_path(s), "unnamed"),
              "%s: messages call it '%s'", how, s ? dt_opt_store_path(s) : "");
        dt_opt_store_destroy(s);
        CHECK(fds_in_dir(NULL, NULL, 0) == 0 && dir_entries() == 0,
              "%s: destroyed, nothing is left", how);
    }
    /* The whole stream on a file made without O_TMPFILE: the same bits. */
    no_tmpfile = 1;
    run(DT_OPT_ADAMW, 3);
    no_tmpfile = 0;
}

static void plant(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "planting %s", p);
}

static int holds(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    size_t len = 0;
    char *got = dt_read_file(p, 1024, &len, NULL, 0);
    int ok = got && len == strlen(text) && !memcmp(got, text, len);
    free(got);
    unlink(p);
    return ok;
}

/* Files under the names earlier versions gave the store and the probe
 * (a killed run's; a restart with the same PID, as in a container, then
 * failed with "File exists"): a new store and probe do not mind them and
 * leave them as they are. */
static void leftovers(void)
{
    char err[512] = "", name[96];
    plant("dtrain-optim-7-rank0.bin", "old state");
    snprintf(name, sizeof name, "dtrain-probe-%ld.bin", (long)getpid());
    plant(name, "old probe");
    dt_opt_store *s = small_store("7-rank0", 4096, err, sizeof err);
    CHECK(s, "a store beside an old one of the same name: %s", err);
    dt_opt_store_destroy(s);
    dt_disk_probe p;
    CHECK(dt_disk_bandwidth(dir, 16u << 20, &p, err, sizeof err) == 0 && p.bytes > 0,
          "the probe beside an old one of the same name: %s", err);
    CHECK(holds("dtrain-optim-7-rank0.bin", "old state") && holds(name, "old probe"),
          "the old files are left as they were");
    CHECK(dir_entries() == 0, "and nothing else is in the directory");
}

/* A child that does `what` until it is killed; it says when it has begun. */
static void killed(const char *what, int probe)
{
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        char err[512];
        dt_opt_store *s = probe ? NULL : small_store("k", 1u << 20, err, sizeof err);
        dt_disk_probe p;
        if (!probe && !s) _exit(1);
        for (int first = 1;; first = 0) {
            if (first && write(fds[1], "x", 1) != 1) _exit(1);
            if (!probe) pause();
            else if (dt_disk_bandwidth(dir, 64u << 20, &p, err, sizeof err)) _exit(1);
        }
    }
    char c;
    CHECK(pid > 0 && read(fds[0], &c, 1) == 1, "%s: the child began", what);
    usleep(probe ? 30000 : 0); /* into a probe */
    int st = 0;
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    close(fds[0]), close(fds[1]);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && dir_entries() == 0,
          "%s, killed with SIGKILL: nothing is left in the directory (%d entries)", what,
          dir_entries());
}

/* At most the bytes asked, and half of what is free, in whole 4 MiB writes. */
static void probe_size(void)
{
    char err[512] = "";
    dt_disk_probe p;
    CHECK(dt_disk_bandwidth(dir, 18u << 20, &p, err, sizeof err) == 0 && p.free > (64u << 20) &&
              p.bytes == (16u << 20) && p.write_bps > 0 && p.read_bps > 0,
          "a probe of at most 18 MiB measures 16 (%zu; free %llu): %s", p.bytes,
          (unsigned long long)p.free, err);
    CHECK(dir_entries() == 0, "the probe leaves nothing");
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/dtrain_test_offload_%ld", (long)getpid());
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    run(DT_OPT_ADAMW, 3);
    run(DT_OPT_ADAMW, 5);
    run(DT_OPT_SGD, 3);
    params_in_store();
    faults();
    unnamed();
    leftovers();
    killed("holding a store", 0);
    killed("measuring the disk", 1);
    probe_size();
    rmdir(dir);
    return finish("test_offload");
}
