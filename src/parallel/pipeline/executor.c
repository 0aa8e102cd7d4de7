/* Running a rank's pipeline actions. See executor.h.
 *
 * A slot is taken by a micro-batch's first action on a chunk (its RECV_F,
 * or on stage 0 its F) and given back after its last (the SEND_B that
 * carries its input's gradient back, on stage 0 the B, or a W after
 * both). Sends never
 * block the list: each stays in flight until the slot is taken again, or
 * the step ends. Receives are waited for where the list has them, which is
 * what the schedule's static check assumes. */
#include "parallel/pipeline/executor.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/str.h"
#include "core/timer.h"
#include "core/trace.h"

static int chunk_of(const dt_pp_exec *x, int stage) { return stage / x->p; }

enum {
    LAST_OF_MICRO = 1, /* the last action of its (chunk, micro-batch): the slot is given back
                          after it (a B on stage 0, the SEND_B that carries the input's
                          gradient back, or a W after both) */
    LAST_GRADS = 2     /* the last B or W of its stage: the step's gradients are final after it */
};

/* The LAST_ flags of each action of rank me's list, in one pass each way.
 * 0, or -1 out of memory. */
static int mark_last(const dt_pp_schedule *s, int me, unsigned char *last)
{
    int n = s->n[me], *at = malloc((size_t)s->V * s->M * sizeof *at);
    unsigned char seen[64] = {0};
    if (!at || s->V > 64) return free(at), -1;
    for (int i = 0; i < n; i++) {
        const dt_pp_action *a = &s->acts[me][i];
        at[a->stage / s->p * s->M + a->micro] = i;
    }
    for (int i = n - 1; i >= 0; i--) {
        const dt_pp_action *a = &s->acts[me][i];
        int c = a->stage / s->p, grads = a->op == DT_PP_B || a->op == DT_PP_W;
        last[i] = (at[c * s->M + a->micro] == i ? LAST_OF_MICRO : 0) |
                  (grads && !seen[c] ? LAST_GRADS : 0);
        if (grads) seen[c] = 1;
    }
    free(at);
    return 0;
}

int dt_pp_exec_slots(const dt_pp_schedule *s, int me, const int *cut, dt_gpt_part *parts,
                     int cap)
{
    int live[64] = {0}, most[64] = {0}, n = 0;
    unsigned char *last = malloc((size_t)s->n[me] + 1);
    if (s->V > 64 || !last || mark_last(s, me, last)) return free(last), -1;
    for (int i = 0; i < s->n[me]; i++) {
        const dt_pp_action *a = &s->acts[me][i];
        int c = a->stage / s->p;
        if ((a->op == DT_PP_RECV_F || (a->op == DT_PP_F && a->stage == 0)) && ++live[c] > most[c])
            most[c] = live[c];
        if (last[i] & LAST_OF_MICRO) live[c]--;
    }
    free(last);
    for (int c = 0; c < s->V; c++) {
        int k = c * s->p + me;
        for (int j = 0; j < most[c]; j++) {
            if (n == cap) return -1;
            parts[n++] = (dt_gpt_part){cut[k], cut[k + 1]};
        }
    }
    return n;
}

int dt_pp_exec_init(dt_pp_exec *x, dt_comm *comm, const dt_pp_schedule *s, const int *cut,
                    dt_gpt *m, int B, int T)
{
    memset(x, 0, sizeof *x);
    x->comm = comm;
    x->sched = s;
    x->cut = cut;
    x->me = dt_comm_rank(comm);
    x->p = s->p, x->V = s->V, x->S = s->p * s->V, x->M = s->M;
    x->model = m;
    x->B = B, x->T = T, x->msg = dt_gpt_boundary_floats(m, B, T);
    x->nslots = m->acts.nslots;
    for (int k = 0, c = 0; k < m->acts.nslots; k++) { /* the model's slots, chunk by chunk */
        while (c < x->V && m->acts.slots[k].part.l0 != cut[c * x->p + x->me]) c++;
        if (c == x->V) return dt_strf(x->err, sizeof x->err, "pipeline: slot %d holds no "
                                      "stage of rank %d", k, x->me), -1;
        if (x->slot_count[c]++ == 0) x->slot_base[c] = k;
    }
    size_t N = (size_t)B * T, ns = (size_t)x->nslots;
    x->slot_of = malloc((size_t)x->V * x->M * sizeof *x->slot_of);
    x->slot_busy = calloc(ns, 1);
    /* Activations too: what each slot's micro-batch holds beside the model's. */
    x->tokens = dt_alloc(ns * N * sizeof *x->tokens, DT_MEM_ACTS);
    x->targets = dt_alloc(ns * N * sizeof *x->targets, DT_MEM_ACTS);
    x->dout = dt_alloc(ns * x->msg * sizeof *x->dout, DT_MEM_ACTS);
    x->sreq = calloc(ns, sizeof *x->sreq);
    x->sent = calloc(ns, sizeof *x->sent);
    x->sent_ns = calloc(ns, sizeof *x->sent_ns);
    x->last = malloc((size_t)s->n[x->me] + 1);
    if (!x->slot_of || !x->slot_busy || !x->tokens || !x->targets || !x->dout || !x->sreq ||
        !x->sent || !x->sent_ns || !x->last || mark_last(s, x->me, x->last)) {
        dt_pp_exec_free(x);
        return dt_strf(x->err, sizeof x->err, "pipeline: out of memory for %d slots",
                       x->nslots), -1;
    }
    return 0;
}

void dt_pp_exec_free(dt_pp_exec *x)
{
    for (int k = 0; x->sreq && k < x->nslots; k++)
        if (x->sreq[k]) dt_wait(x->sreq[k]);
    free(x->slot_of);
    free(x->slot_busy);
    dt_free(x->tokens);
    dt_free(x->targets);
    dt_free(x->dout);
    free(x->sreq);
    free(x->sent);
    free(x->sent_ns);
    free(x->last);
    x->last = NULL;
    x->slot_of = NULL, x->slot_busy = NULL, x->tokens = x->targets = NULL;
    x->dout = NULL, x->sreq = NULL, x->sent = NULL, x->sent_ns = NULL;
}

/* "receiving the gradient of micro-batch 3 on stage 0 from stage 1 (rank 1
 * of the pipeline): ...": a is the message's action. */
static int comm_failed(dt_pp_exec *x, const char *what, const dt_pp_action *a)
{
    int incoming = a->op == DT_PP_RECV_F || a->op == DT_PP_RECV_B;
    int other = a->stage + (a->op == DT_PP_RECV_F || a->op == DT_PP_SEND_B ? -1 : 1);
    return dt_strf(x->err, sizeof x->err, "pipeline: %s of micro-batch %d on stage %d %s "
                   "stage %d (rank %d of the pipeline): %s", what, a->micro, a->stage,
                   incoming ? "from" : "to", other, a->peer, dt_comm_error(x->comm)), -1;
}

/* A timeline event of one action: its micro-batch, stage and layers, and
 * for a message the peer and the bytes. */
static void trace(const dt_pp_exec *x, dt_trace_lane lane, const char *name,
                  const dt_pp_action *a, uint64_t t0, uint64_t t1)
{
    dt_trace_args ta = dt_trace_noargs();
    ta.micro = a->micro;
    ta.stage = a->stage;
    ta.layer_lo = x->cut[a->stage];
    ta.layer_hi = x->cut[a->stage + 1] - 1;
    if (lane == DT_TRACE_COMM) {
        ta.peer = a->peer;
        ta.bytes = (long long)(x->msg * sizeof(float));
    }
    dt_trace_add(lane, name, t0, t1, &ta);
}

static int wait_send(dt_pp_exec *x, int k)
{
    if (!x->sreq[k]) return 0;
    uint64_t start = 0, end = 0;
    int rc = dt_wait_timed(x->sreq[k], &start, &end);
    x->sreq[k] = NULL;
    if (rc == 0 && dt_trace_on())
        trace(x, DT_TRACE_COMM, x->sent[k].op == DT_PP_SEND_F ? "send_activation" : "send_grad",
              &x->sent[k], x->sent_ns[k], end > x->sent_ns[k] ? end : dt_now_ns());
    return rc;
}

/* The slot of (chunk, micro), taken now if it has none. */
static int slot_for(dt_pp_exec *x, const dt_pp_action *a)
{
    int c = chunk_of(x, a->stage), *at = &x->slot_of[c * x->M + a->micro];
    if (*at >= 0) return *at;
    for (int k = x->slot_base[c]; k < x->slot_base[c] + x->slot_count[c]; k++) {
        if (x->slot_busy[k]) continue;
        if (wait_send(x, k)) return comm_failed(x, "completing a send", &x->sent[k]), -1;
        x->slot_busy[k] = 1;
        return *at = k;
    }
    return dt_strf(x->err, sizeof x->err, "pipeline: no free slot for micro-batch %d on stage "
                   "%d (the list holds more in flight than counted)", a->micro, a->stage), -1;
}

static void give_back(dt_pp_exec *x, const dt_pp_action *a)
{
    int *at = &x->slot_of[chunk_of(x, a->stage) * x->M + a->micro];
    x->slot_busy[*at] = 0;
    *at = -1;
}

static int recv_wait(dt_pp_exec *x, const dt_pp_action *a, void *buf)
{
    dt_request *req;
    uint64_t t0 = dt_now_ns();
    size_t n = x->msg;
    if (dt_irecv(x->comm, buf, n, DT_F32, a->peer, &req) || dt_wait(req))
        return comm_failed(x, a->op == DT_PP_RECV_F ? "receiving the activation"
                                                    : "receiving the gradient", a);
    uint64_t t1 = dt_now_ns();
    x->wait_ms += (double)(t1 - t0) * 1e-6;
    if (dt_trace_on())
        trace(x, DT_TRACE_COMM, a->op == DT_PP_RECV_F ? "recv_activation" : "recv_grad", a, t0,
              t1);
    return 0;
}

static int send(dt_pp_exec *x, const dt_pp_action *a, int k, const void *buf)
{
    size_t n = x->msg;
    /* A middle stage sends twice from a slot: its activation has arrived
     * (the gradient coming back proves it), so this wait ends at once. */
    if (wait_send(x, k)) return comm_failed(x, "completing a send", &x->sent[k]);
    x->sent[k] = *a;
    x->sent_ns[k] = dt_now_ns();
    if (dt_isend(x->comm, buf, n, DT_F32, a->peer, &x->sreq[k]))
        return comm_failed(x, a->op == DT_PP_SEND_F ? "sending the activation"
                                                    : "sending the gradient", a);
    return 0;
}

typedef struct {
    dt_strategy *S;
    uint64_t mine; /* this rank's first sequence of the step */
    float scale;
    double loss;
} step_ctx;

static int forward(dt_pp_exec *x, step_ctx *s, const dt_pp_action *a, int k)
{
    dt_rank *r = s->S->rank;
    size_t N = (size_t)x->B * x->T;
    int embed = a->stage == 0, head = a->stage == x->S - 1;
    int32_t *tok = x->tokens + (size_t)k * N, *tgt = x->targets + (size_t)k * N;
    if ((embed || head) &&
        r->batch(r->batch_ctx, s->mine + (uint64_t)a->micro * x->B, x->B, tok, tgt, x->err,
                 sizeof x->err))
        return -1;
    uint64_t t0 = dt_trace_now();
    double l = dt_gpt_forward_slot(x->model, k, embed ? tok : NULL, head ? tgt : NULL, x->B,
                                   x->T);
    if (l < 0) return dt_strf(x->err, sizeof x->err, "%s", x->model->error), -1;
    if (dt_trace_on()) trace(x, DT_TRACE_COMPUTE, "forward", a, t0, dt_trace_now());
    s->loss += l;
    return 0;
}

static const char *const backward_names[] = {"backward", "backward_input", "backward_weights"};

/* B, I or W: the whole backward or one half (model/gpt.h). The strategy
 * hears of the ones that finish gradients (B, W), the last with `last`. */
static int backward(dt_pp_exec *x, step_ctx *s, const dt_pp_action *a, int k, int last)
{
    dt_bwd_part what = a->op == DT_PP_I ? DT_BWD_INPUT
                       : a->op == DT_PP_W ? DT_BWD_WEIGHTS : DT_BWD_WHOLE;
    if (what != DT_BWD_INPUT) dt_strategy_before_backward(s->S, a->micro, last);
    const float *d_out = a->stage == x->S - 1 ? NULL : x->dout + (size_t)k * x->msg;
    uint64_t t0 = dt_trace_now();
    if (dt_gpt_backward_part(x->model, k, d_out, s->scale, what))
        return dt_strf(x->err, sizeof x->err, "%s", x->model->error), -1;
    if (dt_trace_on()) trace(x, DT_TRACE_COMPUTE, backward_names[what], a, t0, dt_trace_now());
    return 0;
}

static int run(dt_pp_exec *x, step_ctx *s, int i)
{
    const dt_pp_action *a = &x->sched->acts[x->me][i];
    int k = slot_for(x, a);
    if (k < 0) return -1;
    size_t NC = x->msg;
    int rc = 0;
    switch (a->op) {
    case DT_PP_RECV_F: rc = recv_wait(x, a, dt_gpt_slot_input(x->model, k)); break;
    case DT_PP_F: rc = forward(x, s, a, k); break;
    case DT_PP_SEND_F: rc = send(x, a, k, dt_gpt_slot_output(x->model, k)); break;
    case DT_PP_RECV_B: rc = recv_wait(x, a, x->dout + (size_t)k * NC); break;
    case DT_PP_B:
    case DT_PP_I:
    case DT_PP_W: rc = backward(x, s, a, k, x->last[i] & LAST_GRADS); break;
    case DT_PP_SEND_B: rc = send(x, a, k, dt_gpt_slot_input_grad(x->model, k)); break;
    default:
        return dt_strf(x->err, sizeof x->err, "pipeline: unknown action %d", a->op), -1;
    }
    if (rc == 0 && (x->last[i] & LAST_OF_MICRO)) give_back(x, a);
    return rc;
}

static int finish_sends(dt_pp_exec *x)
{
    int failed = 0;
    for (int k = 0; k < x->nslots; k++)
        if (wait_send(x, k) && !failed++)
            dt_strf(x->err, sizeof x->err, "pipeline: a send of this step: %s",
                    dt_comm_error(x->comm));
    return failed ? -1 : 0;
}

int dt_pp_exec_step(dt_pp_exec *x, dt_strategy *S, uint64_t first, double *loss_sum)
{
    step_ctx s = {.S = S,
                  .mine = first + (uint64_t)S->dp_index * (uint64_t)x->B * (uint64_t)x->M,
                  .scale = dt_strategy_grad_scale(S, x->B, dt_gpt_rows(x->model, x->T), x->M)};
    for (int i = 0; i < x->V * x->M; i++) x->slot_of[i] = -1;
    memset(x->slot_busy, 0, (size_t)x->nslots);
    x->wait_ms = 0;
    uint64_t sent = dt_comm_bytes_sent(x->comm);
    for (int i = 0; i < x->sched->n[x->me]; i++)
        if (run(x, &s, i)) return -1;
    if (finish_sends(x)) return -1;
    x->bytes = dt_comm_bytes_sent(x->comm) - sent;
    *loss_sum = s.loss;
    return 0;
}

int dt_pp_exec_forward(dt_pp_exec *x, const int32_t *tokens, const int32_t *targets, int b,
                       double *loss)
{
    size_t n = dt_gpt_boundary_floats(x->model, b, x->T);
    *loss = 0;
    for (int c = 0; c < x->V; c++) {
        int k = c * x->p + x->me, slot = x->slot_base[c];
        dt_pp_action a = {DT_PP_RECV_F, (int16_t)k, 0, (int16_t)((k - 1 + x->p) % x->p)};
        if (k > 0 && dt_recv(x->comm, dt_gpt_slot_input(x->model, slot), n, DT_F32, a.peer))
            return comm_failed(x, "receiving the activation (evaluation)", &a);
        double l = dt_gpt_forward_slot(x->model, slot, k == 0 ? tokens : NULL,
                                       k == x->S - 1 ? targets : NULL, b, x->T);
        if (l < 0) return dt_strf(x->err, sizeof x->err, "%s", x->model->error), -1;
        a.op = DT_PP_SEND_F, a.peer = (int16_t)((k + 1) % x->p);
        if (k < x->S - 1 &&
            dt_send(x->comm, dt_gpt_slot_output(x->model, slot), n, DT_F32, a.peer))
            return comm_failed(x, "sending the activation (evaluation)", &a);
        if (k == x->S - 1) *loss = l;
    }
    if (dt_broadcast(x->comm, loss, loss, 1, DT_F64, (x->S - 1) % x->p))
        return dt_strf(x->err, sizeof x->err, "pipeline: evaluation loss: %s",
                       dt_comm_error(x->comm)), -1;
    return 0;
}
