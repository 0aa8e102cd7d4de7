/*
 * Receives from any source (dt_irecv_any): such an op has no peer until it
 * chooses its sender. Each pass of the step executor (p2p.c) looks at the
 * next message of every peer it may take, through the links' peek, which
 * leaves the message where it is, and the op takes the first peer whose
 * next message is its own: a point-to-point message with its tag. From
 * then on it is a plain receive from that peer, numbered next in the
 * pair's stream and checked as every receive is.
 *
 * It may take a peer only when no earlier receive of the step still waits
 * on that peer, which owns the pair's next message; receives posted after
 * it wait until it has chosen (p2p.c's is_head). So a pair's messages go
 * to its receives in the order they were posted, as MPI matches them.
 * The look starts after the last peer chosen, so that a peer which always
 * has a message ready cannot starve the others. A wait watches the links
 * of the peers it may take but those whose next message it passed over:
 * nothing takes that message while it waits, and a socket holding it
 * would wake the wait at once, again and again.
 */
#include <stdio.h>

#include "comm/comm_internal.h"

/* No earlier receive of the step waits on peer: it owns peer's next message. */
static int may_take(const dt_comm *c, const dt_p2p *ops, const unsigned char *done, int i,
                    int peer)
{
    if (peer == c->rank) return 0;
    for (int j = 0; j < i; j++)
        if (!done[j] && ops[j].kind != DT_P2P_SEND && ops[j].peer == peer) return 0;
    return 1;
}

/* A collective's message, or one with another tag, is left for the
 * receive it belongs to. A malformed one is taken: the receive's check
 * then fails, naming the peer, where leaving it would wait forever. */
static int is_its(const dt_comm *c, const dt_p2p *op, const dt_msg_hdr *h)
{
    if (h->magic != DT_MSG_MAGIC || h->comm_tag != c->tag) return 1;
    return h->coll == DT_COLL_SEND && h->tag == op->call->tag;
}

enum { NOT_TAKEN, NONE_YET, ITS_OWN, ANOTHERS };

/* What peer's next message is to ops[i] (*h: its header, when one has
 * come), or a negative DT_ERR_* when the look failed. */
static int look(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int i, int peer,
                dt_msg_hdr *h)
{
    if (!may_take(c, ops, done, i, peer)) return NOT_TAKEN;
    dt_link *l = c->links[peer];
    int rc = l->ops->peek(c, l, h);
    if (rc <= 0) return rc < 0 ? rc : NONE_YET;
    return is_its(c, &ops[i], h) ? ITS_OWN : ANOTHERS;
}

int dt_p2p_any_waits_on(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int i,
                        int peer)
{
    dt_msg_hdr h;
    int what = look(c, ops, done, i, peer, &h);
    return what != NOT_TAKEN && what != ANOTHERS;
}

int dt_p2p_any_choose(dt_comm *c, dt_p2p *ops, const unsigned char *done, int i)
{
    dt_p2p *op = &ops[i];
    for (int k = 0; k < c->size; k++) {
        int p = (c->any_next + k) % c->size;
        dt_msg_hdr h;
        int what = look(c, ops, done, i, p, &h);
        if (what < 0) return what;
        if (what != ITS_OWN) continue;
        op->peer = p;
        if (op->call->source) *op->call->source = p;
        c->any_next = (p + 1) % c->size;
        return 1;
    }
    return 0;
}

void dt_p2p_any_passed_over(dt_comm *c, const dt_p2p *ops, const unsigned char *done, int i,
                            char *buf, size_t len)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int p = 0; p < c->size && o < len; p++) {
        dt_msg_hdr h;
        if (look(c, ops, done, i, p, &h) != ANOTHERS) continue;
        int n = h.coll != DT_COLL_SEND
                    ? snprintf(buf + o, len - o, "%s rank %d's is a %s's", o ? "," : "", p,
                               h.coll < DT_COLL_KIND_COUNT ? dt_coll_name(h.coll) : "?")
                    : snprintf(buf + o, len - o, "%s rank %d's is tagged %d", o ? "," : "", p,
                               h.tag);
        o += n > 0 ? (size_t)n : 0;
    }
}
