/* A layer's blocks in order: the calls each kind gets (its input, the
 * residual stream, its buffers, its tensors), forward, the rebuild a
 * recompute mode needs before backward, and backward (whole, or in two
 * halves). The residual stream runs through the branches' sums: a norm
 * reads the last one (the layer's input before the first branch), a
 * branch reads its norm's output and adds to the last one. */
#include "model/model_internal.h"

void dt_model_block_call(const dt_gpt *m, const dt_block *blk, int tensor0, float *g,
                         dt_block_call *c)
{
    c->blk = blk;
    for (int k = 0; k < blk->n_tensors; k++) {
        const int i = tensor0 + blk->tensor0 + k;
        c->w[k] = dt_model_tensor_weights(m, i);
        const size_t at = m->tensors[i].offset - dt_gpt_segment_start(m, dt_model_segment_of(m, i));
        c->g[k] = g ? g + at : NULL;
    }
}

/* Block i of layer l in the bound slot, on b x t rows from the layer's
 * input x. */
static void layer_call(dt_gpt *m, int l, int i, const float *x, int b, int t, dt_block_call *c)
{
    float **bufs = m->acts.layer + (size_t)l * (size_t)m->acts.per_layer;
    const float *res = x;
    for (int j = 0; j < i; j++)
        if (m->blocks[j].kind->role == DT_BLOCK_BRANCH) res = bufs[m->blocks[j].act0];
    const dt_block *blk = &m->blocks[i];
    dt_model_block_call(m, blk, dt_model_layer_tensor0(m, l), dt_model_grads_of(m, 1 + l), c);
    c->layer = l, c->b = b, c->t = t, c->N = b * t;
    c->a = bufs + blk->act0;
    c->x = blk->kind->role == DT_BLOCK_NORM ? res : bufs[m->blocks[i - 1].act0];
    c->res = res;
}

float *dt_model_layer_output(const dt_gpt *m, int l)
{
    return m->acts.layer[(size_t)l * (size_t)m->acts.per_layer + m->blocks[m->n_blocks - 1].act0];
}

static int run_blocks(dt_gpt *m, int l, const float *x, int b, int t, unsigned run,
                      unsigned last_run)
{
    dt_block_call c;
    for (int i = 0; i < m->n_blocks; i++) {
        layer_call(m, l, i, x, b, t, &c);
        if (m->blocks[i].kind->forward(m, &c, m->blocks[i].last ? last_run : run)) return -1;
    }
    return 0;
}

int dt_model_layer_forward(dt_gpt *m, int l, const float *x, int b, int t)
{
    if (run_blocks(m, l, x, b, t, DT_RUN_ALL, DT_RUN_ALL)) return -1;
    m->acts.rebuilt_layer = l; /* the shared buffers, if any, hold layer l's */
    m->acts.rebuilt_slot = m->acts.slot;
    return 0;
}

/* What the recompute mode did not keep of layer l, rebuilt into the
 * shared buffers (the last layer's are still there from forward): the
 * element-wise parts, and in the full mode the products too, but for the
 * last branch's output, which backward does not read. */
int dt_model_layer_rebuild(dt_gpt *m, int l, const float *x, int b, int t)
{
    const dt_recompute mode = m->acts.recompute;
    if (mode == DT_RECOMPUTE_NONE ||
        (m->acts.rebuilt_layer == l && m->acts.rebuilt_slot == m->acts.slot))
        return 0;
    unsigned run = DT_RUN_ELEMENTWISE, last_run = DT_RUN_ELEMENTWISE;
    if (mode == DT_RECOMPUTE_FULL) {
        run |= DT_RUN_PRODUCTS | DT_RUN_OUTPUT;
        last_run |= DT_RUN_PRODUCTS;
    }
    if (run_blocks(m, l, x, b, t, run, last_run)) return -1;
    m->acts.rebuilt_layer = l;
    m->acts.rebuilt_slot = m->acts.slot;
    return 0;
}

int dt_model_layer_backward(dt_gpt *m, int l, const float *x, int b, int t, dt_bwd_part what)
{
    dt_block_call c;
    if (dt_model_layer_rebuild(m, l, x, b, t)) return -1;
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        layer_call(m, l, i, x, b, t, &c);
        if (m->blocks[i].kind->backward(m, &c, what)) return -1;
    }
    return 0;
}

/* The weight half of layer l's split backward: its blocks' weight and
 * bias gradients, in the order the whole backward adds them. */
int dt_model_layer_weights(dt_gpt *m, int l, const float *x, int b, int t)
{
    dt_block_call c;
    if (dt_model_layer_rebuild(m, l, x, b, t)) return -1;
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        if (!m->blocks[i].kind->weights) continue;
        layer_call(m, l, i, x, b, t, &c);
        if (m->blocks[i].kind->weights(m, &c)) return -1;
    }
    return 0;
}
