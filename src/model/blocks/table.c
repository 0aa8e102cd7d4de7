/* The block kinds a layer can be made of, by name: the built-in ones, and
 * those a program registers; and the parsing of a layer's blocks from the
 * configuration's string. A new kind is a file in this folder and a row
 * of `builtin`. */
#include <stdio.h>
#include <string.h>

#include "core/str.h"
#include "model/block.h"

extern const dt_block_kind dt_block_layernorm, dt_block_attention, dt_block_mlp, dt_block_moe,
    dt_block_rmsnorm, dt_block_rope_attention, dt_block_swiglu, dt_block_moe_swiglu;

static const dt_block_kind *const builtin[] = {
    &dt_block_layernorm,
    &dt_block_attention,
    &dt_block_mlp,
    &dt_block_moe,
    &dt_block_rmsnorm,
    &dt_block_rope_attention,
    &dt_block_swiglu,
    &dt_block_moe_swiglu,
};

enum { MAX_REGISTERED = 16 };
static const dt_block_kind *registered[MAX_REGISTERED];
static int n_registered;

const char dt_blocks_gpt2[] = "ln_1:layernorm,attn:attention,ln_2:layernorm,mlp:mlp";

const dt_block_kind *dt_block_find(const char *name)
{
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(builtin[i]->name, name)) return builtin[i];
    for (int i = 0; i < n_registered; i++)
        if (!strcmp(registered[i]->name, name)) return registered[i];
    return NULL;
}

int dt_block_register(const dt_block_kind *k, char *err, size_t errlen)
{
    if (!k || !k->name || !k->tensors || !k->acts || !k->forward || !k->backward || !k->flops)
        return dt_strf(err, errlen, "block kind: a name, tensors, acts, forward, backward and "
                       "flops are needed"), -1;
    if (dt_block_find(k->name))
        return dt_strf(err, errlen, "block kind %s: the name is taken", k->name), -1;
    if (n_registered == MAX_REGISTERED)
        return dt_strf(err, errlen, "block kind %s: at most %d kinds can be registered",
                       k->name, MAX_REGISTERED), -1;
    registered[n_registered++] = k;
    return 0;
}

/* One "name:kind" word into b; 0 or -1 with a message. */
static int parse_word(const char *w, size_t len, dt_block *b, char *err, size_t errlen)
{
    const char *colon = memchr(w, ':', len);
    char kind[32];
    size_t nlen = colon ? (size_t)(colon - w) : 0, klen = colon ? len - nlen - 1 : 0;
    if (!colon || nlen == 0 || nlen >= sizeof b->name || klen == 0 || klen >= sizeof kind)
        return dt_strf(err, errlen, "model blocks: '%.*s' is not name:kind (as in "
                       "ln_1:layernorm; names up to %zu characters)", (int)len, w,
                       sizeof b->name - 1), -1;
    memset(b, 0, sizeof *b);
    memcpy(b->name, w, nlen);
    memcpy(kind, colon + 1, klen);
    kind[klen] = '\0';
    if (!(b->kind = dt_block_find(kind)))
        return dt_strf(err, errlen, "model blocks: no block kind called '%s' (built in: "
                       "layernorm, attention, mlp)", kind), -1;
    return 0;
}

/* Pairs of a norm and a branch, names unique. */
static int check_order(const dt_block *b, int n, char *err, size_t errlen)
{
    if (n == 0 || n % 2)
        return dt_strf(err, errlen, "model blocks: a layer is pairs of a norm and a branch "
                       "(got %d blocks)", n), -1;
    for (int i = 0; i < n; i++) {
        const dt_block_role want = i % 2 ? DT_BLOCK_BRANCH : DT_BLOCK_NORM;
        if (b[i].kind->role != want)
            return dt_strf(err, errlen, "model blocks: block %d (%s:%s) should be a %s: a "
                           "layer is pairs of a norm and the branch it feeds", i + 1,
                           b[i].name, b[i].kind->name, want ? "branch" : "norm"), -1;
        for (int j = 0; j < i; j++)
            if (!strcmp(b[i].name, b[j].name))
                return dt_strf(err, errlen, "model blocks: two blocks are called %s",
                               b[i].name), -1;
    }
    return 0;
}

void dt_blocks_canonical(const char *spec, char *buf, size_t n)
{
    dt_block b[DT_LAYER_MAX_BLOCKS];
    char err[160];
    const int k = dt_blocks_parse(spec, b, err, sizeof err);
    size_t at = 0;
    if (k < 0) {
        dt_strf(buf, n, "%s", spec);
        return;
    }
    buf[0] = '\0';
    for (int i = 0; i < k && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s:%s", i ? "," : "", b[i].name,
                               b[i].kind->name);
}

int dt_blocks_same(const char *a, const char *b)
{
    dt_block x[DT_LAYER_MAX_BLOCKS], y[DT_LAYER_MAX_BLOCKS];
    char err[160];
    const int n = dt_blocks_parse(a, x, err, sizeof err);
    if (n < 0 || n != dt_blocks_parse(b, y, err, sizeof err)) return 0;
    for (int i = 0; i < n; i++)
        if (x[i].kind != y[i].kind || strcmp(x[i].name, y[i].name)) return 0;
    return 1;
}

int dt_blocks_parse(const char *spec, dt_block *out, char *err, size_t errlen)
{
    const char *s = spec && *spec ? spec : dt_blocks_gpt2;
    int n = 0;
    while (*s) {
        size_t skip = strspn(s, " ,"), len;
        s += skip;
        if (!*s) break;
        len = strcspn(s, " ,");
        if (n == DT_LAYER_MAX_BLOCKS)
            return dt_strf(err, errlen, "model blocks: at most %d blocks a layer",
                           DT_LAYER_MAX_BLOCKS), -1;
        if (parse_word(s, len, &out[n++], err, errlen)) return -1;
        s += len;
    }
    if (check_order(out, n, err, errlen)) return -1;
    out[n - 1].last = 1;
    return n;
}
