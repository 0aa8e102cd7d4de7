/*
 * The ranks' output under --tag-output: each rank's stdout and stderr come
 * through a pipe of their own and go out line by line, each line prefixed
 * with "[RANK]: " and written in one write(), so that lines of different
 * ranks never interleave.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/launch.h"

int launch_stream_open(struct stream *s, int dest, int *write_end)
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
void launch_stream_read(struct job *j, struct stream *s, int rank, int until_empty)
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

void launch_drain_rank(struct job *j, struct rank *r, int until_empty)
{
    launch_stream_read(j, &r->out, r->rank, until_empty);
    launch_stream_read(j, &r->err, r->rank, until_empty);
}
