/* TCP sockets with deadlines. A deadline is an absolute dt_now_ns() value;
 * 0 means none. Functions return 0 or a negative DT_ERR_* code and write a
 * message naming the address or the failing call into err. */
#ifndef DT_COMM_NET_H
#define DT_COMM_NET_H

#include <stddef.h>
#include <stdint.h>

/* poll()'s timeout for the time left before a deadline: -1 without one, 0
 * once it has passed, rounded up so that a wake-up at the timeout is past
 * the deadline. */
int dt_net_poll_ms(uint64_t deadline_ns);
/* Wait until fd is ready for events (POLLIN, POLLOUT), or has an error to
 * report, which the next call on it returns: 0, DT_ERR_TIMEOUT, or
 * DT_ERR_SYSTEM. Nothing is read or written, so a timeout leaves no half
 * message behind. */
int dt_net_wait(int fd, short events, uint64_t deadline_ns);
/* Listen on addr (NULL or "" = every interface) and port (0 = any free
 * port); *out_port gets the port actually bound. SO_REUSEADDR is set.
 * DT_ERR_PEER when addr is not an address of this host. */
int dt_net_listen(const char *addr, int port, int *out_fd, int *out_port, char *err,
                  size_t errlen);
/* A port for a listener to come (another process, or this one later),
 * where clients that dial addr arrive (dt_net_listen_for): port, or one
 * the kernel chooses (port 0), held by *out_fd until that listener is
 * up, and said in *out_port. The hold is a socket bound
 * with SO_REUSEADDR but not listening. The listener, which binds the port
 * with SO_REUSEADDR as dt_net_listen and PyTorch's store do, may share it;
 * when the kernel picks a port for another socket (a bind to port 0, an
 * outgoing connection) it passes this one over (unless
 * net.ipv4.ip_autobind_reuse is set). A port merely seen free is not
 * enough: another job's link can take it before the listener binds it. */
int dt_net_reserve_port(const char *addr, int port, int *out_fd, int *out_port, char *err,
                        size_t errlen);
/* Listen where clients that dial addr arrive: on addr itself when it is an
 * address of this host (so a job whose ranks dial the loopback cannot be
 * reached from other hosts), on every interface when it is not (a name
 * other hosts resolve differently, an address behind NAT). */
int dt_net_listen_for(const char *addr, int port, int *out_fd, int *out_port, char *err,
                      size_t errlen);
/* Connect to host:port (a name or numeric address), retrying refused
 * connections until the deadline (the listener may not be up yet). */
int dt_net_connect(const char *host, int port, uint64_t deadline_ns, int *out_fd, char *err,
                   size_t errlen);
/* Accept one connection, waiting at most until the deadline. */
int dt_net_accept(int listen_fd, uint64_t deadline_ns, int *out_fd, char *err, size_t errlen);
/* Blocking-style full reads and writes on a socket of either mode, bounded
 * by the deadline: DT_ERR_TIMEOUT, or DT_ERR_PEER when the connection
 * closes or breaks. Writes never raise SIGPIPE. */
int dt_net_write_all(int fd, const void *buf, size_t n, uint64_t deadline_ns);
int dt_net_read_all(int fd, void *buf, size_t n, uint64_t deadline_ns);
/* "1.2.3.4:5555" or "[::1]:5555" of the other end of a socket, for messages. */
void dt_net_peer_name(int fd, char *buf, size_t len);
/* "host:port", with an IPv6 address in brackets so that the port stands
 * out; returns buf. */
const char *dt_net_host_port(char *buf, size_t len, const char *host, int port);
/* Numeric address of the local end of a connected socket. */
int dt_net_local_addr(int fd, char *buf, size_t len);
/* The numeric address of the interface this host would use to reach
 * host:port: 0, or -1 when there is no route (or no such host). */
int dt_net_route_addr(const char *host, int port, char *out, size_t len);
/* TCP_NODELAY, large socket buffers, keepalive. */
void dt_net_tune(int fd);
int dt_net_set_nonblock(int fd, int on);

#endif
