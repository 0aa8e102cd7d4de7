/*
 * TCP sockets with deadlines.
 *
 * Every wait goes through poll() with the time left before the deadline, and
 * every send and receive uses MSG_DONTWAIT, so the same code bounds the wait
 * whether the caller's socket is blocking or not. Sends use MSG_NOSIGNAL: a
 * peer that vanishes is an error code here, never a SIGPIPE.
 */
#include "comm/transport/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/timer.h"
#include "dtrain/comm.h"

#define RETRY_PAUSE_NS 50000000ull /* between connection attempts */
#define SOCKET_BUFFER_BYTES (4 << 20)

/* ---- time ----------------------------------------------------------------- */

int dt_net_poll_ms(uint64_t deadline_ns)
{
    if (deadline_ns == 0) return -1;
    uint64_t now = dt_now_ns();
    if (now >= deadline_ns) return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int dt_net_wait(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        int ms = dt_net_poll_ms(deadline_ns);
        if (ms == 0) return DT_ERR_TIMEOUT;
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int r = poll(&p, 1, ms);
        if (r > 0) return 0;
        if (r < 0 && errno != EINTR) return DT_ERR_SYSTEM;
        /* r == 0 or EINTR: loop, the deadline check decides. */
    }
}

/* Errors that say the caller's own arguments are wrong, as opposed to the
 * connection having broken. */
static int io_error_code(int e)
{
    switch (e) {
    case EBADF:
    case EFAULT:
    case EINVAL:
    case ENOTSOCK:
    case ENOMEM:
    case ENOBUFS:
        return DT_ERR_SYSTEM;
    default:
        return DT_ERR_PEER;
    }
}

/* ---- reads and writes ---------------------------------------------------- */

int dt_net_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns)
{
    const char *p = buf;
    size_t off = 0;
    while (off < n) {
        ssize_t w = send(fd, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = dt_net_wait(fd, POLLOUT, deadline_ns);
            if (rc) return rc;
            continue;
        }
        return w < 0 ? io_error_code(errno) : DT_ERR_PEER;
    }
    return 0;
}

int dt_net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns)
{
    char *p = buf;
    size_t off = 0;
    while (off < n) {
        ssize_t r = recv(fd, p + off, n - off, MSG_DONTWAIT);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r == 0) return DT_ERR_PEER; /* orderly close before n bytes */
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = dt_net_wait(fd, POLLIN, deadline_ns);
            if (rc) return rc;
            continue;
        }
        return io_error_code(errno);
    }
    return 0;
}

/* ---- socket options --------------------------------------------------------- */

int dt_net_set_nonblock(int fd, int on)
{
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0) return DT_ERR_SYSTEM;
    int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
    if (want != flags && fcntl(fd, F_SETFL, want) < 0) return DT_ERR_SYSTEM;
    return 0;
}

/* Best effort: a socket that refuses an option still works, only slower. */
void dt_net_tune(int fd)
{
    int one = 1;
    int bytes = SOCKET_BUFFER_BYTES;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
}

/* Numeric host of a socket address, with IPv4-mapped IPv6 addresses
 * ("::ffff:10.0.0.1") shown as the IPv4 address other hosts can dial. */
static int numeric_host(const struct sockaddr *sa, socklen_t salen, char *buf, size_t len)
{
    char host[NI_MAXHOST];
    if (getnameinfo(sa, salen, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0)
        return DT_ERR_SYSTEM;
    const char *h = host;
    if (sa->sa_family == AF_INET6 && strncmp(host, "::ffff:", 7) == 0 && strchr(host + 7, '.'))
        h = host + 7;
    if ((size_t)snprintf(buf, len, "%s", h) >= len) return DT_ERR_INVALID;
    return 0;
}

int dt_net_local_addr(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) return DT_ERR_SYSTEM;
    return numeric_host((struct sockaddr *)&ss, sslen, buf, len);
}

/* getaddrinfo for host and a numeric port: 0 with *res, or its EAI_* code. */
static int resolve(const char *host, int port, int socktype, int flags, struct addrinfo **res)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = socktype;
    hints.ai_flags = flags | AI_NUMERICSERV;
    *res = NULL;
    return getaddrinfo(host, service, &hints, res);
}

int dt_net_route_addr(const char *host, int port, char *out, size_t len)
{
    struct addrinfo *res;
    if (resolve(host, port, SOCK_DGRAM, 0, &res) != 0 || !res) return -1;
    int rc = -1;
    int fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    /* A UDP connect sends nothing; it only picks the route. */
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0)
        rc = dt_net_local_addr(fd, out, len);
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return rc == 0 ? 0 : -1;
}

/* ---- listen ------------------------------------------------------------------- */

static int sockaddr_port(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return -1;
}

static int bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) return -1;
    return sockaddr_port(&ss);
}

/* One socket bound to one address, listening unless it only reserves the
 * port (listening 0); -errno on failure. */
static int listen_on(int family, const struct sockaddr *sa, socklen_t salen, int listening,
                     int *out_fd)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int one = 1, zero = 0;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* An IPv6 wildcard socket also takes IPv4 clients (dual stack). */
    if (family == AF_INET6) (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, sa, salen) != 0 || (listening && listen(fd, SOMAXCONN) != 0)) {
        int e = errno;
        close(fd);
        return -e;
    }
    *out_fd = fd;
    return 0;
}

/* Every interface: IPv6 dual stack where the host has IPv6, else IPv4. */
static int listen_any(int port, int listening, int *out_fd)
{
    struct sockaddr_in6 a6;
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    int rc = listen_on(AF_INET6, (struct sockaddr *)&a6, sizeof a6, listening, out_fd);
    if (rc != -EAFNOSUPPORT && rc != -EADDRNOTAVAIL) return rc;

    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    return listen_on(AF_INET, (struct sockaddr *)&a4, sizeof a4, listening, out_fd);
}

/* "cannot listen on WHERE: why"; for a port in use, with the command to
 * paste that shows whose it is. */
static void open_failed(char *err, size_t errlen, int listening, const char *where, int port,
                        int e)
{
    int n = snprintf(err, errlen, "cannot %s %s: %s", listening ? "listen on" : "hold", where,
                     strerror(e));
    if (e == EADDRINUSE && port > 0 && n >= 0 && (size_t)n < errlen)
        snprintf(err + n, errlen - (size_t)n,
                 " (another socket has the port: `ss -ltnp 'sport = :%d'` shows whose)", port);
}

static int listen_addr(const char *addr, int port, int listening, int *out_fd, char *err,
                       size_t errlen)
{
    struct addrinfo *res;
    int g = resolve(addr, port, SOCK_STREAM, AI_PASSIVE, &res);
    char where[NI_MAXHOST + 16];
    snprintf(where, sizeof where, "%s:%d", addr, port);
    if (g != 0) {
        snprintf(err, errlen, "cannot %s %s: %s", listening ? "listen on" : "hold", where,
                 gai_strerror(g));
        return DT_ERR_INVALID;
    }
    int rc = -EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = listen_on(ai->ai_family, ai->ai_addr, ai->ai_addrlen, listening, out_fd);
        if (rc == 0) break;
    }
    freeaddrinfo(res);
    if (rc != 0) {
        open_failed(err, errlen, listening, where, port, -rc);
        return rc == -EADDRNOTAVAIL ? DT_ERR_PEER : DT_ERR_SYSTEM; /* PEER: not ours to bind */
    }
    return 0;
}

static int is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24 == 127;
    if (sa->sa_family != AF_INET6) return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
}

/* Where clients that dial host arrive: host itself when it is a numeric
 * address (or "localhost"), else the first address the name has here,
 * unless that is a loopback one (a host name that /etc/hosts maps to
 * 127.0.1.1 is not what other hosts dial). -1: no one address. */
static int bind_address(const char *host, char *out, size_t len)
{
    struct addrinfo *res;
    int numeric = resolve(host, 0, SOCK_STREAM, AI_NUMERICHOST, &res) == 0;
    if (!numeric && resolve(host, 0, SOCK_STREAM, 0, &res) != 0) return -1;
    int rc = -1;
    for (struct addrinfo *ai = res; ai && rc; ai = ai->ai_next) {
        if (!numeric && strcmp(host, "localhost") && is_loopback(ai->ai_addr)) continue;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, out, (socklen_t)len, NULL, 0,
                        NI_NUMERICHOST) == 0)
            rc = 0;
    }
    freeaddrinfo(res);
    return rc;
}

static int open_port(const char *addr, int port, int listening, int *out_fd, int *out_port,
                     char *err, size_t errlen)
{
    *out_fd = -1;
    if (port < 0 || port > 65535) {
        snprintf(err, errlen, "cannot listen on port %d: not a TCP port", port);
        return DT_ERR_INVALID;
    }
    int fd = -1;
    if (addr && *addr) {
        int rc = listen_addr(addr, port, listening, &fd, err, errlen);
        if (rc) return rc;
    } else {
        int rc = listen_any(port, listening, &fd);
        if (rc != 0) {
            char where[48];
            snprintf(where, sizeof where, "port %d (every interface)", port);
            open_failed(err, errlen, listening, where, port, -rc);
            return DT_ERR_SYSTEM;
        }
    }
    int bound = bound_port(fd);
    if (bound < 0) {
        snprintf(err, errlen, "getsockname on the listening socket failed: %s", strerror(errno));
        close(fd);
        return DT_ERR_SYSTEM;
    }
    *out_fd = fd;
    if (out_port) *out_port = bound;
    return 0;
}

/* Where clients that dial addr arrive (dt_net_listen_for). */
static int open_for(const char *addr, int port, int listening, int *out_fd, int *out_port,
                    char *err, size_t errlen)
{
    char at[NI_MAXHOST];
    if (addr && *addr && bind_address(addr, at, sizeof at) == 0) {
        int rc = open_port(at, port, listening, out_fd, out_port, err, errlen);
        if (rc != DT_ERR_PEER) return rc;
        /* Not an address of this host (behind NAT, say): everywhere. */
    }
    return open_port(NULL, port, listening, out_fd, out_port, err, errlen);
}

int dt_net_listen(const char *addr, int port, int *out_fd, int *out_port, char *err,
                  size_t errlen)
{
    return open_port(addr, port, 1, out_fd, out_port, err, errlen);
}

int dt_net_listen_for(const char *addr, int port, int *out_fd, int *out_port, char *err,
                      size_t errlen)
{
    return open_for(addr, port, 1, out_fd, out_port, err, errlen);
}

int dt_net_reserve_port(const char *addr, int port, int *out_fd, int *out_port, char *err,
                        size_t errlen)
{
    return open_for(addr, port, 0, out_fd, out_port, err, errlen);
}

/* ---- accept ------------------------------------------------------------------- */

int dt_net_accept(int listen_fd, uint64_t deadline_ns, int *out_fd, char *err, size_t errlen)
{
    *out_fd = -1;
    for (;;) {
        /* Poll first: a blocking listening socket must not block past the
         * deadline in accept(). */
        int rc = dt_net_wait(listen_fd, POLLIN, deadline_ns);
        if (rc == DT_ERR_TIMEOUT) {
            snprintf(err, errlen, "timed out waiting for an incoming connection");
            return rc;
        }
        if (rc) {
            snprintf(err, errlen, "poll on the listening socket failed: %s", strerror(errno));
            return rc;
        }
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            *out_fd = fd;
            return 0;
        }
        /* The client gave up between poll and accept, or a signal came. */
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED ||
            errno == EPROTO)
            continue;
        snprintf(err, errlen, "accept failed: %s", strerror(errno));
        return DT_ERR_SYSTEM;
    }
}

/* ---- connect ------------------------------------------------------------------ */

/* Errors after which the same address may work a moment later: the
 * listener is not up yet, or the network is still coming up. */
static int connect_error_is_transient(int e)
{
    switch (e) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
    case EADDRNOTAVAIL:
    case EAGAIN:
        return 1;
    default:
        return 0;
    }
}

/* With nothing listening, a retry loop on a port in the ephemeral range can
 * connect a socket to itself (TCP simultaneous open). */
static int is_self_connected(int fd)
{
    struct sockaddr_storage a, b;
    socklen_t alen = sizeof a, blen = sizeof b;
    if (getsockname(fd, (struct sockaddr *)&a, &alen) != 0) return 0;
    if (getpeername(fd, (struct sockaddr *)&b, &blen) != 0) return 0;
    return alen == blen && memcmp(&a, &b, alen) == 0;
}

/* One attempt at one address: 0 with *out_fd set, or an errno value
 * (ETIMEDOUT when the deadline passed while the handshake was pending). */
static int connect_addr(const struct addrinfo *ai, uint64_t deadline_ns, int *out_fd)
{
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int e = 0;
    /* EINTR on a non-blocking connect leaves the handshake running: wait
     * for it like EINPROGRESS. */
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS &&
        errno != EINTR)
        e = errno;
    if (e == 0) {
        if (dt_net_wait(fd, POLLOUT, deadline_ns) != 0) {
            e = ETIMEDOUT;
        } else {
            socklen_t elen = sizeof e;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0) e = errno;
        }
    }
    if (e == 0 && is_self_connected(fd)) e = ECONNREFUSED;
    if (e == 0 && dt_net_set_nonblock(fd, 0) != 0) e = errno;
    if (e != 0) {
        close(fd);
        return e;
    }
    *out_fd = fd;
    return 0;
}

/* One pass over the host's addresses. Returns 0 when connected, 1 when a
 * later pass may succeed, or a negative DT_ERR_* (message in err). *last_err
 * keeps the most recent reason for the final message. */
static int connect_pass(const char *host, int port, uint64_t deadline_ns, int *out_fd,
                        char *last_err, size_t last_len, char *err, size_t errlen)
{
    struct addrinfo *res;
    int g = resolve(host, port, SOCK_STREAM, 0, &res);
    if (g == EAI_AGAIN) { /* resolver temporarily unavailable */
        snprintf(last_err, last_len, "%s", gai_strerror(g));
        return 1;
    }
    if (g != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", host, gai_strerror(g));
        return DT_ERR_INVALID;
    }
    int transient = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int e = connect_addr(ai, deadline_ns, out_fd);
        if (e == 0) {
            freeaddrinfo(res);
            return 0;
        }
        snprintf(last_err, last_len, "%s", strerror(e));
        /* Other errors (an address family this host lacks, ...) rule out
         * this address only; another may work. */
        if (connect_error_is_transient(e)) transient = 1;
    }
    freeaddrinfo(res);
    if (!transient) {
        char hp[300];
        snprintf(err, errlen, "cannot connect to %s: %s", dt_net_host_port(hp, sizeof hp, host, port),
                 last_err);
        return DT_ERR_SYSTEM;
    }
    return 1;
}

int dt_net_connect(const char *host, int port, uint64_t deadline_ns, int *out_fd, char *err,
                   size_t errlen)
{
    *out_fd = -1;
    if (!host || !*host || port <= 0 || port > 65535) {
        snprintf(err, errlen, "cannot connect to '%s':%d: not a host and TCP port",
                 host ? host : "", port);
        return DT_ERR_INVALID;
    }
    uint64_t start = dt_now_ns();
    char last_err[128] = "no attempt finished";
    for (;;) {
        int rc = connect_pass(host, port, deadline_ns, out_fd, last_err, sizeof last_err, err,
                              errlen);
        if (rc <= 0) return rc;
        uint64_t now = dt_now_ns();
        if (deadline_ns != 0 && now >= deadline_ns) break;
        uint64_t pause = RETRY_PAUSE_NS;
        if (deadline_ns != 0 && deadline_ns - now < pause) pause = deadline_ns - now;
        sleep_ns(pause);
    }
    char hp[300];
    snprintf(err, errlen, "timed out after %.1f s connecting to %s (last error: %s)",
             (double)(dt_now_ns() - start) * 1e-9, dt_net_host_port(hp, sizeof hp, host, port),
             last_err);
    return DT_ERR_TIMEOUT;
}

/* "1.2.3.4:5555" or "[::1]:5555" of the other end, for messages. */
void dt_net_peer_name(int fd, char *buf, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof ss;
    char host[NI_MAXHOST];
    if (getpeername(fd, (struct sockaddr *)&ss, &sslen) != 0 ||
        numeric_host((struct sockaddr *)&ss, sslen, host, sizeof host) != 0) {
        snprintf(buf, len, "an unknown address");
        return;
    }
    dt_net_host_port(buf, len, host, sockaddr_port(&ss));
}

const char *dt_net_host_port(char *buf, size_t len, const char *host, int port)
{
    snprintf(buf, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
    return buf;
}
