/*
 * Does MSG_ZEROCOPY pay on this network? Two processes stream messages at
 * each other over one TCP connection (both directions at once, as a ring
 * all-reduce's neighbours do), sent in 1 MiB calls, first with plain
 * send(), then with MSG_ZEROCOPY, and print each direction's rate and how
 * many zero-copy completions the kernel marked "copied"
 * (SO_EE_CODE_ZEROCOPY_COPIED: it copied the pages after all, as it does
 * for a socket on the same host, where zero copy only adds the
 * completions' cost). dtrain's TCP transport sends plainly; run this
 * between two hosts of a cluster to see whether their NICs would change
 * that (docs/comm.md, "TCP").
 *
 *   host A:  bench_tcp_zerocopy --listen ADDR [--bytes 32M] [--iters 40]
 *   host B:  bench_tcp_zerocopy --connect ADDR [--bytes 32M] [--iters 40]
 *
 * Both sides must give the same --bytes and --iters. Port 29600 (--port).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#define CHUNK ((size_t)1 << 20)

typedef struct {
    int fd, zerocopy;
    size_t bytes;
    int iters;
    char *buf;
    long calls, completed, copied; /* zero-copy sends, their completions, those copied */
    int failed;
} sender;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Reads the completions queued on the socket's error queue; with block,
 * waits for at least one. */
static void reap(sender *s, int block)
{
    for (;;) {
        char ctrl[128];
        struct msghdr m = {.msg_control = ctrl, .msg_controllen = sizeof ctrl};
        if (recvmsg(s->fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
            if (!block || errno != EAGAIN) return;
            struct pollfd p = {s->fd, 0, 0}; /* POLLERR is always reported */
            poll(&p, 1, 100);
            continue;
        }
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (!c) continue;
        const struct sock_extended_err *e = (const void *)CMSG_DATA(c);
        if (e->ee_origin != SO_EE_ORIGIN_ZEROCOPY) continue;
        s->completed += (long)(e->ee_data - e->ee_info) + 1; /* a range of sends */
        if (e->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) s->copied += (long)(e->ee_data - e->ee_info) + 1;
        block = 0;
    }
}

static void *send_all(void *arg)
{
    sender *s = arg;
    for (int it = 0; it < s->iters && !s->failed; it++) {
        for (size_t off = 0; off < s->bytes;) {
            size_t n = s->bytes - off < CHUNK ? s->bytes - off : CHUNK;
            ssize_t w = send(s->fd, s->buf + off, n, s->zerocopy ? MSG_ZEROCOPY : 0);
            if (w < 0 && errno == ENOBUFS && s->zerocopy) { /* too many pages pinned */
                reap(s, 1);
                continue;
            }
            if (w < 0) {
                perror("bench_tcp_zerocopy: send");
                s->failed = 1;
                break;
            }
            off += (size_t)w;
            if (s->zerocopy) {
                s->calls++;
                reap(s, 0);
            }
        }
    }
    while (s->zerocopy && !s->failed && s->completed < s->calls) reap(s, 1);
    return NULL;
}

static int recv_all(int fd, char *buf, size_t bytes, int iters)
{
    for (int it = 0; it < iters; it++)
        for (size_t off = 0; off < bytes;) {
            ssize_t r = recv(fd, buf + off, bytes - off, 0);
            if (r <= 0) {
                fprintf(stderr, "bench_tcp_zerocopy: recv: %s\n",
                        r == 0 ? "the peer closed the connection" : strerror(errno));
                return -1;
            }
            off += (size_t)r;
        }
    return 0;
}

static int connect_pair(int listen_side, const char *addr, int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
        fprintf(stderr, "bench_tcp_zerocopy: '%s' is not an IPv4 address\n", addr);
        return -1;
    }
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return perror("bench_tcp_zerocopy: socket"), -1;
    if (listen_side) {
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (void *)&a, sizeof a) || listen(fd, 1))
            return perror("bench_tcp_zerocopy: bind/listen"), close(fd), -1;
        int c = accept(fd, NULL, NULL);
        close(fd);
        return c < 0 ? (perror("bench_tcp_zerocopy: accept"), -1) : c;
    }
    for (int tries = 0; connect(fd, (void *)&a, sizeof a) != 0; tries++) {
        if (tries == 500) return perror("bench_tcp_zerocopy: connect"), close(fd), -1;
        usleep(20000);
    }
    return fd;
}

/* One round over a fresh connection: GB/s each way, or < 0. */
static double round_trip(int listen_side, const char *addr, int port, sender *s, char *rbuf)
{
    int one = 1, big = 4 << 20;
    s->fd = connect_pair(listen_side, addr, port);
    if (s->fd < 0) return -1;
    setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s->fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(s->fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (s->zerocopy && setsockopt(s->fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one)) {
        perror("bench_tcp_zerocopy: SO_ZEROCOPY (kernel 4.14 or later)");
        close(s->fd);
        return -1;
    }
    double t0 = now();
    pthread_t th;
    if (pthread_create(&th, NULL, send_all, s)) return close(s->fd), -1;
    int rc = recv_all(s->fd, rbuf, s->bytes, s->iters);
    pthread_join(th, NULL);
    double t = now() - t0;
    close(s->fd);
    return rc || s->failed ? -1 : (double)s->bytes * s->iters / t * 1e-9;
}

static size_t parse_size(const char *v)
{
    char *end;
    double x = strtod(v, &end);
    double unit = *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1;
    return x > 0 ? (size_t)(x * unit) : 0;
}

int main(int argc, char **argv)
{
    const char *addr = NULL;
    int listen_side = -1, port = 29600, iters = 40;
    size_t bytes = 32u << 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--listen") || !strcmp(argv[i], "--connect")) {
            listen_side = !strcmp(argv[i], "--listen");
            addr = argv[i + 1];
        } else if (!strcmp(argv[i], "--bytes")) {
            bytes = parse_size(argv[i + 1]);
        } else if (!strcmp(argv[i], "--iters")) {
            iters = atoi(argv[i + 1]);
        } else if (!strcmp(argv[i], "--port")) {
            port = atoi(argv[i + 1]);
        } else {
            break;
        }
    }
    if (!addr || bytes == 0 || iters < 1 || port < 1 || port > 65535 || argc % 2 == 0) {
        fprintf(stderr, "usage: bench_tcp_zerocopy --listen ADDR | --connect ADDR [--bytes 32M] "
                        "[--iters 40] [--port 29600]\n");
        return 2;
    }
    char *sbuf = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    char *rbuf = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!sbuf || !rbuf) return fprintf(stderr, "bench_tcp_zerocopy: out of memory\n"), 1;
    memset(sbuf, 1, bytes);
    memset(rbuf, 0, bytes);
    printf("%zu-byte messages x %d each way, 1 MiB a send call\n", bytes, iters);
    for (int zc = 0; zc < 2; zc++) {
        sender s = {.zerocopy = zc, .bytes = bytes, .iters = iters, .buf = sbuf};
        double gbps = round_trip(listen_side, addr, port + zc, &s, rbuf);
        if (gbps < 0) return 1;
        printf("%-12s %6.2f GB/s each way", zc ? "MSG_ZEROCOPY" : "send", gbps);
        if (zc) printf(" (%ld of %ld zero-copy sends copied by the kernel)", s.copied, s.calls);
        printf("\n");
    }
    return 0;
}
