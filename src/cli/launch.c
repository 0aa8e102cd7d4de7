/*
 * `dtrain launch`: starts N local ranks of a command with the torchrun
 * environment, watches them, and applies one failure policy:
 *
 *   the first rank to fail decides the exit status; the others get a grace
 *   period to fail on their own (the library makes them report a clear
 *   error of their own), then SIGTERM, then SIGKILL.
 *
 * The launcher is single-threaded and event-driven: one poll() over a
 * signalfd (SIGCHLD and the stop signals) and, with --tag-output, the
 * ranks' output pipes. Nothing runs in a signal handler.
 *
 * Every rank is the leader of its own process group, so killpg() reaches
 * whatever it spawned. A finished rank stays a zombie (waitid WNOWAIT)
 * until the end: that keeps its pid, and so its process-group id,
 * reserved, so a late killpg() can never hit an unrelated process that
 * happened to get a recycled pid.
 */
#include "cli/cli.h"
#include "core/parse.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROG "dtrain launch"

#define MAX_NPROC 1024
#define MAX_NNODES 65536
#define MAX_GRACE_S 86400.0
#define DEFAULT_GRACE_S 5.0
#define TERM_WAIT_S 3.0
#define MULTINODE_DEFAULT_PORT 29500
#define SECRET_HEX 32
#define JOB_ID_HEX 16
#define JOB_ID_MAX 63 /* the library keeps 63 characters */
/* Longest line kept whole under --tag-output; longer ones are split. */
#define LINE_CAP 16384

/* ------------------------------------------------------------------ */
/* Options                                                             */
/* ------------------------------------------------------------------ */

struct launch_opts {
    long nproc;
    long nnodes;
    long node_rank;
    const char *master_addr; /* NULL: not given */
    long master_port;        /* 0: not given */
    double grace_s;
    int grace_given;
    int standalone;
    int tag_output;
    int help;
    char **cmd; /* NULL-terminated, points into argv */
};

enum opt_id {
    OPT_NPROC,
    OPT_NNODES,
    OPT_NODE_RANK,
    OPT_MASTER_ADDR,
    OPT_MASTER_PORT,
    OPT_GRACE,
    OPT_STANDALONE,
    OPT_TAG_OUTPUT,
    OPT_HELP,
};

struct opt_spec {
    const char *name;
    enum opt_id id;
    int has_value;
};

/* Both the dtrain spellings and torchrun's, so a torchrun command line
 * works after replacing the program name. */
static const struct opt_spec opt_specs[] = {
    {"-n", OPT_NPROC, 1},
    {"--nproc-per-node", OPT_NPROC, 1},
    {"--nproc_per_node", OPT_NPROC, 1},
    {"--nnodes", OPT_NNODES, 1},
    {"--node-rank", OPT_NODE_RANK, 1},
    {"--node_rank", OPT_NODE_RANK, 1},
    {"--master-addr", OPT_MASTER_ADDR, 1},
    {"--master_addr", OPT_MASTER_ADDR, 1},
    {"--master-port", OPT_MASTER_PORT, 1},
    {"--master_port", OPT_MASTER_PORT, 1},
    {"--grace-period", OPT_GRACE, 1},
    {"--grace_period", OPT_GRACE, 1},
    {"--standalone", OPT_STANDALONE, 0},
    {"--tag-output", OPT_TAG_OUTPUT, 0},
    {"--tag_output", OPT_TAG_OUTPUT, 0},
    {"-h", OPT_HELP, 0},
    {"--help", OPT_HELP, 0},
};

static void launch_usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain launch [-n N] [--nnodes M] [--node-rank R] [--master-addr A]\n"
            "                     [--master-port P] [--standalone] [--tag-output]\n"
            "                     [--grace-period S] [--] CMD [ARGS...]\n"
            "\n"
            "Start N ranks of CMD on this host with the torchrun environment (RANK,\n"
            "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK,\n"
            "MASTER_ADDR, MASTER_PORT) plus DTRAIN_SECRET and DTRAIN_JOB_ID.\n"
            "\n"
            "options (torchrun's spellings --nproc_per_node, --node_rank, --master_addr,\n"
            "--master_port and --flag=value are accepted too):\n"
            "  -n, --nproc-per-node N  ranks on this host (default 1)\n"
            "  --nnodes M              hosts in the job (default 1)\n"
            "  --node-rank R           this host's index, 0..M-1 (default 0)\n"
            "  --master-addr A         address of node 0 (default 127.0.0.1; required\n"
            "                          when M > 1)\n"
            "  --master-port P         port of the rendezvous store on node 0 (default: a\n"
            "                          free port when M = 1, 29500 when M > 1)\n"
            "  --standalone            single host with a free port (torchrun's flag)\n"
            "  --tag-output            prefix every output line with '[RANK]: '\n"
            "  --grace-period S        seconds the other ranks get to exit on their own\n"
            "                          after the first failure, before SIGTERM (default 5,\n"
            "                          or DTRAIN_GRACE_PERIOD)\n"
            "  -h, --help              show this text\n"
            "\n"
            "If a rank fails, the others are stopped and the exit status is the first\n"
            "failing rank's (its exit code, or 128+signal). With M > 1 every host must\n"
            "export the same DTRAIN_SECRET.\n"
            "\n"
            "examples:\n"
            "  one host, 4 ranks:\n"
            "    dtrain launch -n 4 -- ./my_program --steps 10\n"
            "  two hosts, 8 ranks each, host 0 at 10.0.0.1 (same secret on both):\n"
            "    export DTRAIN_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n"
            "    dtrain launch -n 8 --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 -- ./prog\n"
            "    dtrain launch -n 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -- ./prog\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nRun 'dtrain launch --help' for usage.\n");
    va_end(ap);
    return -1;
}

static int parse_long(const char *flag, const char *s, long min, long max, long *out)
{
    long v;
    if (dt_parse_long(s, min, max, &v)) {
        return usage_error("invalid value '%s' for %s: expected an integer from %ld to %ld", s,
                           flag, min, max);
    }
    *out = v;
    return 0;
}

static int parse_seconds(const char *what, const char *s, double *out)
{
    double v;
    if (dt_parse_double(s, 0, MAX_GRACE_S, &v)) {
        return usage_error("invalid value '%s' for %s: expected seconds from 0 to %g", s, what,
                           MAX_GRACE_S);
    }
    *out = v;
    return 0;
}

static const struct opt_spec *find_opt(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof opt_specs / sizeof opt_specs[0]; i++)
        if (strlen(opt_specs[i].name) == len && strncmp(opt_specs[i].name, name, len) == 0)
            return &opt_specs[i];
    return NULL;
}

/* `flag` is the spelling the user typed, so errors quote it back. */
static int apply_opt(struct launch_opts *o, const struct opt_spec *spec, const char *flag,
                     const char *value)
{
    switch (spec->id) {
    case OPT_NPROC:
        return parse_long(flag, value, 1, MAX_NPROC, &o->nproc);
    case OPT_NNODES:
        return parse_long(flag, value, 1, MAX_NNODES, &o->nnodes);
    case OPT_NODE_RANK:
        return parse_long(flag, value, 0, MAX_NNODES - 1, &o->node_rank);
    case OPT_MASTER_ADDR:
        if (*value == '\0') return usage_error("empty value for %s", flag);
        o->master_addr = value;
        return 0;
    case OPT_MASTER_PORT:
        return parse_long(flag, value, 1, 65535, &o->master_port);
    case OPT_GRACE:
        o->grace_given = 1;
        return parse_seconds(flag, value, &o->grace_s);
    case OPT_STANDALONE:
        o->standalone = 1;
        return 0;
    case OPT_TAG_OUTPUT:
        o->tag_output = 1;
        return 0;
    case OPT_HELP:
        o->help = 1;
        return 0;
    }
    return -1;
}

/* One argument (and maybe the next, as its value). Returns how many
 * arguments it used, or -1. Accepts `--flag value`, `--flag=value`,
 * `-n value`, `-n=value` and `-nvalue`. */
static int parse_one(struct launch_opts *o, char *arg, char *next)
{
    char flag[64];
    const char *attached = NULL;
    size_t name_len;
    if (arg[1] == '-') {
        const char *eq = strchr(arg, '=');
        name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (eq) attached = eq + 1;
    } else {
        name_len = 2;
        if (arg[2] != '\0') attached = arg[2] == '=' ? arg + 3 : arg + 2;
    }
    if (name_len >= sizeof flag) name_len = sizeof flag - 1;
    memcpy(flag, arg, name_len);
    flag[name_len] = '\0';

    const struct opt_spec *spec = find_opt(arg, name_len);
    if (!spec) return usage_error("unknown option '%s'", flag);
    if (!spec->has_value) {
        if (attached) return usage_error("option %s takes no value (got '%s')", flag, attached);
        return apply_opt(o, spec, flag, NULL) < 0 ? -1 : 1;
    }
    if (attached) return apply_opt(o, spec, flag, attached) < 0 ? -1 : 1;
    if (!next) return usage_error("option %s needs a value", flag);
    return apply_opt(o, spec, flag, next) < 0 ? -1 : 2;
}

/* Options end at `--` or at the first word that is not an option (the
 * command), so the command's own flags are never taken for ours. */
static int parse_args(int argc, char **argv, struct launch_opts *o)
{
    int i = 1;
    while (i < argc) {
        char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') break;
        int used = parse_one(o, a, i + 1 < argc ? argv[i + 1] : NULL);
        if (used < 0) return -1;
        i += used;
    }
    o->cmd = i < argc ? argv + i : NULL;
    return 0;
}

static int resolve_grace(struct launch_opts *o)
{
    if (o->grace_given) return 0;
    o->grace_s = DEFAULT_GRACE_S;
    const char *env = getenv("DTRAIN_GRACE_PERIOD");
    if (env && *env) return parse_seconds("DTRAIN_GRACE_PERIOD", env, &o->grace_s);
    return 0;
}

static int check_opts(const struct launch_opts *o)
{
    if (o->standalone && o->nnodes > 1)
        return usage_error("--standalone means one host, but --nnodes is %ld", o->nnodes);
    if (o->node_rank >= o->nnodes)
        return usage_error("--node-rank %ld is out of range for --nnodes %ld (valid: 0 to %ld)",
                           o->node_rank, o->nnodes, o->nnodes - 1);
    if (o->nnodes > 1 && !o->master_addr)
        return usage_error("--nnodes %ld needs --master-addr (the address of node 0, the same "
                           "on every node)",
                           o->nnodes);
    if (!o->cmd) return usage_error("no command to run");
    return 0;
}

/* ------------------------------------------------------------------ */
/* The job's identity: rendezvous address, secret, job id              */
/* ------------------------------------------------------------------ */

struct job_ident {
    char master_addr[256];
    int master_port;
    char secret_buf[SECRET_HEX + 1];
    const char *secret;
    char job_id[JOB_ID_MAX + 1];
};

static void to_hex(const unsigned char *bytes, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

static int random_hex(char *out, size_t nhex)
{
    unsigned char bytes[64];
    size_t n = nhex / 2, got = 0;
    while (got < n) {
        ssize_t r = getrandom(bytes + got, n - got, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            fprintf(stderr, PROG ": getrandom: %s\n", strerror(errno));
            return -1;
        }
        got += (size_t)r;
    }
    to_hex(bytes, n, out);
    return 0;
}

/* Every node must compute the same id without talking to the others, so
 * it comes from what they already share. A hash rather than the secret
 * itself, because the id shows up in world-readable /dev/shm names. */
static int derive_job_id(const struct job_ident *id, char *out)
{
    char text[1024];
    int len = snprintf(text, sizeof text, "dtrain-job-id|%s|%s|%d", id->secret, id->master_addr,
                       id->master_port);
    if (len < 0 || (size_t)len >= sizeof text) len = (int)sizeof text - 1;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (!EVP_Digest(text, (size_t)len, md, &mdlen, EVP_sha256(), NULL) || mdlen < JOB_ID_HEX / 2) {
        fprintf(stderr, PROG ": cannot hash the job id (OpenSSL SHA-256 failed)\n");
        return -1;
    }
    to_hex(md, JOB_ID_HEX / 2, out);
    return 0;
}

/* The id becomes part of the /dev/shm names that the launcher unlinks by
 * the prefix "dtrain-<id>-": it must not contain '/' (another directory)
 * nor '-' (id "a" would then match job "a-b"'s files). Letters and digits
 * only, which is also all the communication library keeps of it. */
static int valid_job_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > JOB_ID_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i])) return 0;
    return 1;
}

/* Like torchrun --standalone: the OS picks a port nobody uses now. All
 * interfaces, because that is where the rendezvous store listens. */
static int pick_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}

static int resolve_address(const struct launch_opts *o, struct job_ident *id)
{
    const char *addr = o->master_addr ? o->master_addr : "127.0.0.1";
    if (strlen(addr) >= sizeof id->master_addr) {
        fprintf(stderr, PROG ": --master-addr is too long\n");
        return -1;
    }
    strcpy(id->master_addr, addr);
    if (o->master_port) {
        id->master_port = (int)o->master_port;
    } else if (o->nnodes > 1) {
        id->master_port = MULTINODE_DEFAULT_PORT;
    } else {
        id->master_port = pick_free_port();
        if (id->master_port < 0) {
            fprintf(stderr, PROG ": cannot find a free port: %s\n", strerror(errno));
            return -1;
        }
    }
    return 0;
}

static int resolve_secret(const struct launch_opts *o, struct job_ident *id)
{
    const char *env = getenv("DTRAIN_SECRET");
    if (env && *env) {
        id->secret = env;
        return 0;
    }
    if (o->nnodes > 1) {
        fprintf(stderr,
                PROG ": DTRAIN_SECRET is not set. With --nnodes > 1 every node must share the\n"
                "same job secret (ranks authenticate each other with it). Set it on all nodes\n"
                "before launching, for example:\n"
                "  export DTRAIN_SECRET=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \\n')\n");
        return -1;
    }
    if (random_hex(id->secret_buf, SECRET_HEX) < 0) return -1;
    id->secret = id->secret_buf;
    return 0;
}

static int resolve_job_id(const struct launch_opts *o, struct job_ident *id)
{
    const char *env = getenv("DTRAIN_JOB_ID");
    if (env && *env) {
        if (!valid_job_id(env)) {
            fprintf(stderr,
                    PROG ": DTRAIN_JOB_ID='%s' is not valid: use 1 to %d letters or digits\n",
                    env, JOB_ID_MAX);
            return -1;
        }
        strcpy(id->job_id, env);
        return 0;
    }
    if (o->nnodes > 1) return derive_job_id(id, id->job_id);
    return random_hex(id->job_id, JOB_ID_HEX);
}

static int set_env_long(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return setenv(name, buf, 1);
}

/* Launched under mpirun or srun, the launcher itself carries those
 * launchers' rank variables; a rank must not mistake them for its own. */
static void remove_foreign_rank_vars(void)
{
    static const char *const names[] = {"PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                        "SLURM_LOCALID"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) unsetenv(names[i]);

    /* unsetenv reshuffles environ, so restart the scan after each removal. */
    static const char prefix[] = "OMPI_COMM_WORLD_";
    for (;;) {
        char name[256] = "";
        for (char **e = environ; *e; e++) {
            const char *eq = strchr(*e, '=');
            size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
            if (strncmp(*e, prefix, sizeof prefix - 1) == 0 && n < sizeof name) {
                memcpy(name, *e, n);
                name[n] = '\0';
                break;
            }
        }
        if (!name[0]) break;
        unsetenv(name);
    }
}

/* The variables shared by all local ranks go into the launcher's own
 * environment once; the child adds only RANK and LOCAL_RANK. */
static int export_job_env(const struct launch_opts *o, const struct job_ident *id)
{
    remove_foreign_rank_vars();
    int bad = 0;
    bad |= set_env_long("WORLD_SIZE", o->nnodes * o->nproc);
    bad |= set_env_long("LOCAL_WORLD_SIZE", o->nproc);
    bad |= set_env_long("GROUP_RANK", o->node_rank);
    bad |= set_env_long("NODE_RANK", o->node_rank);
    bad |= set_env_long("GROUP_WORLD_SIZE", o->nnodes);
    bad |= setenv("MASTER_ADDR", id->master_addr, 1);
    bad |= set_env_long("MASTER_PORT", id->master_port);
    bad |= setenv("DTRAIN_SECRET", id->secret, 1);
    bad |= setenv("DTRAIN_JOB_ID", id->job_id, 1);
    if (bad) fprintf(stderr, PROG ": cannot set the environment: %s\n", strerror(errno));
    return bad ? -1 : 0;
}

/* ------------------------------------------------------------------ */
/* Ranks and their output                                              */
/* ------------------------------------------------------------------ */

/* One of a rank's output pipes under --tag-output. */
struct stream {
    int fd;     /* read end; -1 once closed */
    int dest;   /* 1 or 2 */
    int midline; /* the last thing written was a piece of an over-long line */
    size_t len;
    char *buf;  /* LINE_CAP bytes */
};

struct rank {
    int rank; /* global */
    int local;
    pid_t pid; /* 0: never started */
    int finished;
    int code;   /* exit code, when it exited */
    int signo;  /* signal, when it was killed */
    struct stream out, err;
};

enum phase {
    PHASE_RUNNING, /* nothing has gone wrong */
    PHASE_GRACE,   /* a rank failed; the others may still exit on their own */
    PHASE_TERM,    /* SIGTERM sent; waiting before SIGKILL */
    PHASE_KILL,    /* SIGKILL sent */
};

struct job {
    const struct launch_opts *o;
    struct job_ident id;
    struct rank *ranks;
    int nranks;
    struct pollfd *fds; /* the signalfd, then each rank's stdout and stderr */
    pid_t launcher_pid;
    int sigfd;
    sigset_t orig_mask;
    struct sigaction orig_sigpipe;
    int stdin_is_tty;

    enum phase phase;
    double deadline; /* of the current phase, CLOCK_MONOTONIC seconds */
    int failed;      /* a rank failed, a rank could not start, or we were signalled */
    int exit_status;
    char scratch[LINE_CAP + 32];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int rank_status(const struct rank *r)
{
    return r->signo ? 128 + r->signo : r->code;
}

static int ranks_alive(const struct job *j)
{
    int n = 0;
    for (int i = 0; i < j->nranks; i++)
        if (j->ranks[i].pid > 0 && !j->ranks[i].finished) n++;
    return n;
}

/* A failed write (say, stdout is a closed pipe) must not stop the launcher
 * from draining the ranks' pipes, or the ranks would block on them. */
static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

/* One write per line, so lines of different ranks never interleave. */
static void emit(struct job *j, struct stream *s, int rank, const char *data, size_t n,
                 int add_newline)
{
    size_t len = 0;
    if (!s->midline) len = (size_t)snprintf(j->scratch, 32, "[%d]: ", rank);
    memcpy(j->scratch + len, data, n);
    len += n;
    if (add_newline) j->scratch[len++] = '\n';
    write_all(s->dest, j->scratch, len);
}

/* Writes the complete lines in the buffer and keeps the incomplete tail,
 * unless the buffer is full (an over-long line goes out in pieces) or this
 * is the end of the stream (the tail gets a newline of its own, so the next
 * rank's prefix starts a line). */
static void stream_flush(struct job *j, struct stream *s, int rank, int final)
{
    size_t start = 0;
    for (;;) {
        char *nl = memchr(s->buf + start, '\n', s->len - start);
        if (!nl) break;
        size_t end = (size_t)(nl - s->buf) + 1;
        emit(j, s, rank, s->buf + start, end - start, 0);
        s->midline = 0;
        start = end;
    }
    size_t rest = s->len - start;
    if (rest > 0 && (final || rest == LINE_CAP)) {
        emit(j, s, rank, s->buf + start, rest, final);
        s->midline = !final;
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static void stream_close(struct job *j, struct stream *s, int rank)
{
    if (s->fd < 0) return;
    stream_flush(j, s, rank, 1);
    close(s->fd);
    s->fd = -1;
}

/* Reads what the pipe holds now (it is non-blocking). Closes it at end of
 * file; with `until_empty` also when nothing is left, for the final drain,
 * when a grandchild may still hold the write end open. */
static void stream_read(struct job *j, struct stream *s, int rank, int until_empty)
{
    while (s->fd >= 0) {
        ssize_t n = read(s->fd, s->buf + s->len, LINE_CAP - s->len);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            stream_close(j, s, rank);
            return;
        }
        if (n < 0) {
            if (until_empty) stream_close(j, s, rank);
            return;
        }
        s->len += (size_t)n;
        stream_flush(j, s, rank, 0);
    }
}

static void drain_rank(struct job *j, struct rank *r, int until_empty)
{
    stream_read(j, &r->out, r->rank, until_empty);
    stream_read(j, &r->err, r->rank, until_empty);
}

/* ------------------------------------------------------------------ */
/* Starting a rank                                                     */
/* ------------------------------------------------------------------ */

/* What a child reports back through its close-on-exec pipe when it cannot
 * become the command; a successful exec closes the pipe instead. */
struct child_error {
    int step; /* 0: exec, 1: setup */
    int err;
};

static _Noreturn void child_fail(int errfd, int step, int err)
{
    struct child_error ce = {step, err};
    ssize_t w = write(errfd, &ce, sizeof ce);
    (void)w;
    _exit(127);
}

static _Noreturn void run_child(struct job *j, const struct rank *r, int errfd, int out_w,
                                int err_w)
{
    /* Its own group, so that killpg() reaches everything the rank starts. */
    if (setpgid(0, 0) < 0) child_fail(errfd, 1, errno);
    /* A launcher killed with SIGKILL cannot clean up; the kernel does it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) child_fail(errfd, 1, errno);
    if (getppid() != j->launcher_pid) _exit(127); /* the launcher died before prctl */

    if (out_w >= 0 && (dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)) child_fail(errfd, 1, errno);
    /* A rank outside the terminal's foreground group that reads the
     * terminal gets stopped (SIGTTIN) and the job would hang. */
    if (j->stdin_is_tty) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0 || dup2(fd, 0) < 0) child_fail(errfd, 1, errno);
        close(fd);
    }
    if (set_env_long("RANK", r->rank) || set_env_long("LOCAL_RANK", r->local))
        child_fail(errfd, 1, errno);

    sigaction(SIGPIPE, &j->orig_sigpipe, NULL);
    sigprocmask(SIG_SETMASK, &j->orig_mask, NULL);
    execvp(j->o->cmd[0], j->o->cmd);
    child_fail(errfd, 0, errno);
}

static int open_stream(struct stream *s, int dest, int *write_end)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) return -1;
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    s->buf = malloc(LINE_CAP);
    if (!s->buf) {
        close(p[0]);
        close(p[1]);
        errno = ENOMEM;
        return -1;
    }
    s->fd = p[0];
    s->dest = dest;
    *write_end = p[1];
    return 0;
}

static void close_fd(int *fd)
{
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Waits for the child's verdict on exec: end of file (it ran) or an error
 * record. Returns 0 when the rank runs, -1 when it did not start (the child
 * has already exited with 127 and will be reaped like any failed rank). */
static int await_exec(struct job *j, int errfd, const struct rank *r)
{
    struct child_error ce;
    ssize_t n;
    do n = read(errfd, &ce, sizeof ce);
    while (n < 0 && errno == EINTR);
    if (n != (ssize_t)sizeof ce) return 0;
    if (ce.step == 0)
        fprintf(stderr, PROG ": cannot run '%s': %s\n", j->o->cmd[0], strerror(ce.err));
    else
        fprintf(stderr, PROG ": cannot set up rank %d: %s\n", r->rank, strerror(ce.err));
    return -1;
}

static int spawn_rank(struct job *j, struct rank *r)
{
    int out_w = -1, err_w = -1, errp[2] = {-1, -1};
    if (j->o->tag_output &&
        (open_stream(&r->out, 1, &out_w) < 0 || open_stream(&r->err, 2, &err_w) < 0))
        goto fail;
    if (pipe2(errp, O_CLOEXEC) < 0) goto fail;

    pid_t pid = fork();
    if (pid < 0) goto fail;
    if (pid == 0) run_child(j, r, errp[1], out_w, err_w);

    /* Also here, so that the group exists before we might killpg() it. */
    setpgid(pid, pid);
    r->pid = pid;
    close_fd(&errp[1]);
    close_fd(&out_w);
    close_fd(&err_w);
    int rc = await_exec(j, errp[0], r);
    close(errp[0]);
    return rc;

fail:
    fprintf(stderr, PROG ": cannot start rank %d: %s\n", r->rank, strerror(errno));
    close_fd(&errp[0]);
    close_fd(&errp[1]);
    close_fd(&out_w);
    close_fd(&err_w);
    return -1;
}

/* ------------------------------------------------------------------ */
/* Watching ranks: the failure policy                                  */
/* ------------------------------------------------------------------ */

static void signal_groups(struct job *j, int sig)
{
    for (int i = 0; i < j->nranks; i++)
        if (j->ranks[i].pid > 0) killpg(j->ranks[i].pid, sig);
}

static void enter_term(struct job *j)
{
    signal_groups(j, SIGTERM);
    j->phase = PHASE_TERM;
    j->deadline = now_s() + TERM_WAIT_S;
}

static void enter_kill(struct job *j)
{
    signal_groups(j, SIGKILL);
    j->phase = PHASE_KILL;
}

/* The first failure sets the exit status; later ones are consequences. */
static void record_failure(struct job *j, int status)
{
    if (j->failed) return;
    j->failed = 1;
    j->exit_status = status;
}

static void on_rank_failed(struct job *j, const struct rank *r)
{
    if (j->failed) return;
    if (r->signo)
        fprintf(stderr, PROG ": rank %d (pid %d) was killed by signal %d (%s)\n", r->rank,
                (int)r->pid, r->signo, strsignal(r->signo));
    else
        fprintf(stderr, PROG ": rank %d (pid %d) exited with status %d\n", r->rank, (int)r->pid,
                r->code);
    record_failure(j, rank_status(r));
    if (j->phase != PHASE_RUNNING) return;
    j->phase = PHASE_GRACE;
    j->deadline = now_s() + j->o->grace_s;
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return strsignal(sig);
    }
}

static void on_launcher_signal(struct job *j, int sig)
{
    if (j->phase == PHASE_TERM || j->phase == PHASE_KILL) {
        /* Asked twice: stop waiting politely. */
        if (j->phase == PHASE_TERM) enter_kill(j);
        return;
    }
    fprintf(stderr, PROG ": received %s; stopping %d rank(s)\n", signal_name(sig),
            ranks_alive(j));
    record_failure(j, 128 + sig);
    enter_term(j);
}

/* Notes every rank that has ended, without reaping it (see the top). */
static void check_ranks(struct job *j)
{
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        if (r->pid <= 0 || r->finished) continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)r->pid, &si, WEXITED | WNOHANG | WNOWAIT) < 0 || si.si_pid == 0)
            continue;
        r->finished = 1;
        if (si.si_code == CLD_EXITED)
            r->code = si.si_status;
        else
            r->signo = si.si_status;
        /* Its last words come before our verdict on it. */
        drain_rank(j, r, 0);
        if (rank_status(r) != 0) on_rank_failed(j, r);
    }
}

static void on_deadline(struct job *j)
{
    int alive = ranks_alive(j);
    if (j->phase == PHASE_GRACE) {
        fprintf(stderr, PROG ": %d rank(s) still running %gs after the failure; sending SIGTERM\n",
                alive, j->o->grace_s);
        enter_term(j);
    } else if (j->phase == PHASE_TERM) {
        fprintf(stderr, PROG ": %d rank(s) still running %gs after SIGTERM; sending SIGKILL\n",
                alive, TERM_WAIT_S);
        enter_kill(j);
    }
}

static void read_signals(struct job *j)
{
    struct signalfd_siginfo si[16];
    for (;;) {
        ssize_t n = read(j->sigfd, si, sizeof si);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return;
        for (size_t k = 0; k < (size_t)n / sizeof si[0]; k++) {
            if (si[k].ssi_signo == SIGCHLD)
                check_ranks(j);
            else
                on_launcher_signal(j, (int)si[k].ssi_signo);
        }
    }
}

static int poll_timeout_ms(const struct job *j)
{
    if (j->phase != PHASE_GRACE && j->phase != PHASE_TERM) return -1;
    double left = j->deadline - now_s();
    if (left <= 0) return 0;
    return (int)(left * 1000.0) + 1;
}

/* One round: wait for a signal, output, or the phase deadline. */
static int watch_once(struct job *j)
{
    struct pollfd *fds = j->fds;
    int nfds = 0;
    fds[nfds++] = (struct pollfd){.fd = j->sigfd, .events = POLLIN};
    for (int i = 0; i < j->nranks; i++) {
        fds[nfds++] = (struct pollfd){.fd = j->ranks[i].out.fd, .events = POLLIN};
        fds[nfds++] = (struct pollfd){.fd = j->ranks[i].err.fd, .events = POLLIN};
    }
    int rc = poll(fds, (nfds_t)nfds, poll_timeout_ms(j));
    if (rc < 0 && errno != EINTR) return -1;
    if (rc > 0) {
        for (int i = 0; i < j->nranks; i++) {
            if (fds[1 + 2 * i].revents) stream_read(j, &j->ranks[i].out, j->ranks[i].rank, 0);
            if (fds[2 + 2 * i].revents) stream_read(j, &j->ranks[i].err, j->ranks[i].rank, 0);
        }
        if (fds[0].revents) read_signals(j);
    }
    if ((j->phase == PHASE_GRACE || j->phase == PHASE_TERM) && now_s() >= j->deadline)
        on_deadline(j);
    return 0;
}

static void watch(struct job *j)
{
    while (ranks_alive(j) > 0) {
        if (watch_once(j) == 0) continue;
        /* poll() fails only for want of memory; the ranks must still be
         * followed to the end, so keep going at a slower pace. */
        read_signals(j);
        nanosleep(&(struct timespec){.tv_nsec = 100 * 1000 * 1000}, NULL);
    }
}

/* ------------------------------------------------------------------ */
/* Setup and teardown                                                  */
/* ------------------------------------------------------------------ */

static int setup_signals(struct job *j)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    /* Under nohup, hanging up is not a reason to stop the job. */
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) == 0 && hup.sa_handler != SIG_IGN) sigaddset(&set, SIGHUP);

    /* An inherited SIG_IGN for SIGCHLD would make the kernel reap the
     * ranks behind our back, losing their exit status. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGCHLD, &dfl, NULL);
    /* With --tag-output our stdout may be a pipe whose reader went away;
     * that must not kill the launcher and orphan the ranks' cleanup. */
    struct sigaction ign = dfl;
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &j->orig_sigpipe);

    if (sigprocmask(SIG_BLOCK, &set, &j->orig_mask) < 0) {
        fprintf(stderr, PROG ": sigprocmask: %s\n", strerror(errno));
        return -1;
    }
    j->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (j->sigfd < 0) {
        fprintf(stderr, PROG ": signalfd: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* The communication library names its shared-memory segments
 * dtrain-<job id>-...; ranks that died cannot remove their own. */
static void remove_job_shm(const char *job_id)
{
    char prefix[JOB_ID_MAX + 16];
    int plen = snprintf(prefix, sizeof prefix, "dtrain-%s-", job_id);
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT)
            fprintf(stderr, PROG ": cannot remove /dev/shm/%s: %s\n", e->d_name, strerror(errno));
    }
    closedir(d);
}

static void finish(struct job *j)
{
    /* After a failure, whatever the ranks left behind in their groups
     * (helpers, data workers) goes too. */
    if (j->failed) signal_groups(j, SIGKILL);
    for (int i = 0; i < j->nranks; i++) drain_rank(j, &j->ranks[i], 1);
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        if (r->pid > 0)
            while (waitpid(r->pid, NULL, 0) < 0 && errno == EINTR) {
            }
        free(r->out.buf);
        free(r->err.buf);
    }
    remove_job_shm(j->id.job_id);
    if (j->sigfd >= 0) close(j->sigfd);
    free(j->ranks);
    free(j->fds);
}

/* Everything sized by the rank count, before any rank exists, so that a
 * shortage of memory is an error up front rather than midway. */
static int alloc_ranks(struct job *j)
{
    const struct launch_opts *o = j->o;
    j->nranks = (int)o->nproc;
    j->ranks = calloc((size_t)j->nranks, sizeof *j->ranks);
    j->fds = calloc((size_t)(1 + 2 * j->nranks), sizeof *j->fds);
    if (!j->ranks || !j->fds) {
        fprintf(stderr, PROG ": out of memory\n");
        return -1;
    }
    for (int i = 0; i < j->nranks; i++) {
        struct rank *r = &j->ranks[i];
        r->local = i;
        r->rank = (int)(o->node_rank * o->nproc) + i;
        r->out.fd = r->err.fd = -1;
    }
    return 0;
}

static void start_ranks(struct job *j)
{
    fflush(NULL);
    for (int i = 0; i < j->nranks; i++) {
        if (spawn_rank(j, &j->ranks[i]) == 0) continue;
        /* A rank that could not even be forked leaves the others waiting
         * for it until their timeout, with nothing of their own to
         * report: no grace period. (A failed exec is an ordinary failed
         * rank, status 127.) */
        if (j->ranks[i].pid <= 0) {
            record_failure(j, 1);
            enter_term(j);
        }
        break;
    }
}

static int resolve_ident(const struct launch_opts *o, struct job_ident *id)
{
    if (resolve_secret(o, id) < 0) return CLI_EXIT_USAGE;
    if (resolve_address(o, id) < 0) return 1;
    if (resolve_job_id(o, id) < 0) return CLI_EXIT_USAGE;
    return 0;
}

int cli_launch(int argc, char **argv)
{
    struct launch_opts o = {.nproc = 1, .nnodes = 1};
    if (parse_args(argc, argv, &o) < 0) return CLI_EXIT_USAGE;
    if (o.help) {
        launch_usage(stdout);
        return 0;
    }
    if (resolve_grace(&o) < 0 || check_opts(&o) < 0) return CLI_EXIT_USAGE;

    static struct job j; /* holds the line scratch buffer; one per process */
    memset(&j, 0, sizeof j);
    j.o = &o;
    j.sigfd = -1;
    j.launcher_pid = getpid();
    j.stdin_is_tty = isatty(0);
    int rc = resolve_ident(&o, &j.id);
    if (rc != 0) return rc;
    if (alloc_ranks(&j) < 0 || export_job_env(&o, &j.id) < 0 || setup_signals(&j) < 0) return 1;

    start_ranks(&j);
    watch(&j);
    finish(&j);
    return j.failed ? j.exit_status : 0;
}
