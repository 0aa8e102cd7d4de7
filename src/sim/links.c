/*
 * The presets of link models (links.h). Their figures are the vendors'
 * published per-direction peak rates, which collectives approach for
 * large messages, and latencies typical of what NCCL-class libraries
 * measure for small messages (a few microseconds): a starting point, to
 * be replaced by a calibrated file for a real cluster.
 *
 * Reduction (gamma) and copy rates are the GPU's: its memory bandwidth
 * divided by the traffic per byte (a reduction reads two operands and
 * writes one: 3 bytes; a copy 2), rounded down.
 */
#include "sim/links.h"

#include <string.h>

typedef struct {
    const char *name, *what;
    double intra_us, intra_GBps, inter_us, inter_GBps, reduce_GBps, copy_GBps;
} preset;

static const preset presets[] = {
    /* A100 SXM: NVLink 3, 12 links of 25 GB/s each way = 300 GB/s; HBM2e
     * about 2 TB/s. InfiniBand HDR: 200 Gb/s = 25 GB/s each way. */
    {"nvlink-ib", "A100-class host: NVLink 300 GB/s, 3 us; InfiniBand HDR 25 GB/s, 5 us",
     3.0, 300.0, 5.0, 25.0, 600.0, 1000.0},
    /* H100 SXM: NVLink 4, 18 links = 450 GB/s each way; HBM3 about
     * 3.3 TB/s. InfiniBand NDR: 400 Gb/s = 50 GB/s each way. */
    {"nvlink-ndr", "H100-class host: NVLink 450 GB/s, 3 us; InfiniBand NDR 50 GB/s, 5 us",
     3.0, 450.0, 5.0, 50.0, 1100.0, 1600.0},
    /* PCIe 4.0 x16: 32 GB/s raw, about 25 GB/s of payload each way;
     * 100 Gb Ethernet = 12.5 GB/s, with a kernel network stack's latency. */
    {"pcie-eth", "PCIe 4.0 host: 25 GB/s, 5 us; 100 Gb Ethernet 12.5 GB/s, 15 us",
     5.0, 25.0, 15.0, 12.5, 600.0, 1000.0},
};
#define NPRESETS ((int)(sizeof presets / sizeof presets[0]))

static dt_link_cost link_of(double us, double GBps, double reduce_GBps)
{
    return (dt_link_cost){us * 1e-6, 1.0 / (GBps * 1e9), 1.0 / (reduce_GBps * 1e9)};
}

static void from_preset(const preset *p, dt_cost_model *m)
{
    dt_cost_model_defaults(m);
    m->link[DT_LINK_SHM] = link_of(p->intra_us, p->intra_GBps, p->reduce_GBps);
    m->link[DT_LINK_TCP] = link_of(p->inter_us, p->inter_GBps, p->reduce_GBps);
    m->link[DT_LINK_MPI] = m->link[DT_LINK_TCP];
    m->copy = 1.0 / (p->copy_GBps * 1e9);
    snprintf(m->source, sizeof m->source, "preset %s", p->name);
}

int dt_sim_links(const char *name, dt_cost_model *m, char *err, size_t len)
{
    if (!strcmp(name, "builtin")) {
        dt_cost_model_defaults(m);
        return 0;
    }
    for (int i = 0; i < NPRESETS; i++)
        if (!strcmp(name, presets[i].name)) {
            from_preset(&presets[i], m);
            return 0;
        }
    if (!strchr(name, '/') && !strchr(name, '.')) {
        snprintf(err, len, "--link-model '%s' is neither a preset (builtin, nvlink-ib, "
                 "nvlink-ndr, pcie-eth) nor a file's path (a model file from `dtrain bench "
                 "comm --calibrate FILE`, e.g. ./model.json)", name);
        return -1;
    }
    char why[512];
    if (dt_cost_model_load(m, name, why, sizeof why) == 0) return 0;
    snprintf(err, len, "--link-model %s (presets: builtin, nvlink-ib, nvlink-ndr, pcie-eth)",
             why);
    return -1;
}

void dt_sim_links_help(FILE *f)
{
    fprintf(f, "    %-11s the cost model's defaults (measured on the reference machine)\n",
            "builtin");
    for (int i = 0; i < NPRESETS; i++)
        fprintf(f, "    %-11s %s\n", presets[i].name, presets[i].what);
    fprintf(f, "    %-11s a model file (`dtrain bench comm --calibrate FILE`)\n", "FILE");
}
