/*
 * sim-main.c - ringd-sim: the seed's table (ResNet-50 on CIFAR-10, data-
 * parallel weak scaling at 10..1000 nodes) for a flat ring, the two-level
 * ring and the two-level ring overlapped with backward; goodput under
 * failures; the view change at 1000; the model against bench/e2e at 2
 * and 4 nodes. `ringd-sim --help` lists the flags; sim/README.md gives
 * the model and where every default comes from.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "sim/sim.h"

#define MAXROWS 64

typedef struct {
    const char *ringbench, *e2e, *etcd_load;
    sim_net_t dc;       /* the assumed datacentre network */
    sim_net_t lo[2];    /* this machine's loopback at n = 2 and 4 */
    int lo_fitted[2];
    sim_work_t work;
    sim_fail_t fail;
    sim_etcd_t etcd;
    double params, bytes_per_param, recover_small_s;
} sim_args_t;

/*
 * Loopback links of this machine when no ringbench file is at hand: the
 * fit of sim/data/ringbench-quick.tsv (tcp rows; see sim/README.md).
 */
#define LO2_HOP_US 12.4
#define LO2_BW_GBPS 1.363
#define LO4_HOP_US 93.1
#define LO4_BW_GBPS 0.470

static void defaults(sim_args_t *s)
{
    *s = (sim_args_t){
        .ringbench = "sim/data/ringbench-quick.tsv",
        .e2e = "sim/data/e2e-quick.tsv",
        .dc = {.hop_s = 5e-6, .bw = 100e9 / 8},
        .lo = {{.hop_s = LO2_HOP_US * 1e-6, .bw = LO2_BW_GBPS * 1e9},
               {.hop_s = LO4_HOP_US * 1e-6, .bw = LO4_BW_GBPS * 1e9}},
        .params = 25.6e6,
        .bytes_per_param = 4,
        /* A100 80GB, AMP, 2470 img/s at batch 256 (NVIDIA
         * DeepLearningExamples, ResNet-50 v1.5, PyTorch 21.03). */
        .work = {.compute_s = 256.0 / 2470.0, .bwd_frac = 2.0 / 3.0,
                 .bucket_bytes = 25.0 * 1024 * 1024, .batch = 256,
                 .epoch_samples = 50000},
        /* Llama 3: 419 interruptions in 54 days on 16,384 GPUs. */
        .fail = {.fail_per_node_h = sim_fail_rate(419, 54, 16384, 1),
                 .recover_s = 0.050, .replace_s = 600, .restart_s = 300,
                 .ckpt_s = 0.25},
        .etcd = {.base_s = 0.0125, .fanout_s = 0.005, .fanout_members = 64,
                 .keepalive_cpu_s = 50e-6, .ttl_s = 5,
                 .view_bytes_per_member = 64, .etcd_bw = 10e9 / 8,
                 .etcd_cores = 2},
    };
}

static void usage(void)
{
    printf(
"usage: ringd-sim [--help] [flag value]...\n"
"  inputs from this machine's benchmarks:\n"
"  --ringbench FILE      bench/ringbench output (default %s)\n"
"  --e2e FILE            bench/e2e output to validate against (%s)\n"
"  --etcd-load FILE      a file with the etcd load tool's last line\n"
"  --etcd-members M --etcd-fanout-ms X --etcd-per-key-us X\n"
"                        that line's figures (default 64, 5, 50: assumed;\n"
"                        per_key_us: etcd CPU per keepalive)\n"
"  the network at scale (default: 100 Gb/s RDMA, 5 us a hop):\n"
"  --hop-us X --bw-gbps X (gigabits per second)\n"
"  the workload (default ResNet-50, A100 AMP, batch 256):\n"
"  --params X --bytes-per-param X --step-ms X --batch N --bwd-frac X\n"
"  --bucket-mb X (MiB) --epoch-samples X\n"
"  failures (default Llama 3's rate, one GPU per node):\n"
"  --fail-per-node-h X --gpus-per-node X --recover-ms X --replace-s X\n"
"  --restart-s X --ckpt-s X --ckpt-every-s X (0: Young's interval)\n"
"  the view change:\n"
"  --view-base-ms X --view-bytes-per-member X --etcd-bw-gbps X\n"
"  --etcd-watcher-cpu-us X --etcd-watcher-kb-cpu-us X --etcd-cores X\n"
"                        etcd CPU per view write and watcher, and per kB of\n"
"                        view (etcd-load's etcd_fanout: fit, which\n"
"                        --etcd-load also reads), on X cores (default 2)\n"
"  --lease-ttl-s X (ringd's default 5; a keepalive every TTL/3)\n",
        "sim/data/ringbench-quick.tsv", "sim/data/e2e-quick.tsv");
}

static int num(const char *flag, const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno != 0 || end == v || *end != '\0' || !(x >= 0)) {
        fprintf(stderr, "ringd-sim: %s wants a number >= 0, not '%s'\n",
                flag, v);
        return ST_EINVAL;
    }
    *out = x;
    return 0;
}

/* Flags whose value is a plain number: name, where, scale to SI. */
typedef struct {
    const char *flag;
    size_t off;
    double scale;
    int is_int;
} num_flag_t;

#define F(name, field, scale) {name, offsetof(sim_args_t, field), scale, 0}
#define I(name, field) {name, offsetof(sim_args_t, field), 1, 1}

static const num_flag_t num_flags[] = {
    F("--hop-us", dc.hop_s, 1e-6),
    F("--bw-gbps", dc.bw, 1e9 / 8),
    F("--params", params, 1),
    F("--bytes-per-param", bytes_per_param, 1),
    F("--step-ms", work.compute_s, 1e-3),
    I("--batch", work.batch),
    F("--bwd-frac", work.bwd_frac, 1),
    F("--bucket-mb", work.bucket_bytes, 1024.0 * 1024),
    F("--epoch-samples", work.epoch_samples, 1),
    F("--fail-per-node-h", fail.fail_per_node_h, 1),
    F("--recover-ms", fail.recover_s, 1e-3),
    F("--replace-s", fail.replace_s, 1),
    F("--restart-s", fail.restart_s, 1),
    F("--ckpt-s", fail.ckpt_s, 1),
    F("--ckpt-every-s", fail.ckpt_every_s, 1),
    I("--etcd-members", etcd.fanout_members),
    F("--etcd-fanout-ms", etcd.fanout_s, 1e-3),
    F("--etcd-per-key-us", etcd.keepalive_cpu_s, 1e-6),
    F("--lease-ttl-s", etcd.ttl_s, 1),
    F("--view-base-ms", etcd.base_s, 1e-3),
    F("--view-bytes-per-member", etcd.view_bytes_per_member, 1),
    F("--etcd-bw-gbps", etcd.etcd_bw, 1e9 / 8),
    F("--etcd-watcher-cpu-us", etcd.watcher_cpu_s, 1e-6),
    F("--etcd-watcher-kb-cpu-us", etcd.watcher_byte_cpu_s, 1e-9),
    F("--etcd-cores", etcd.etcd_cores, 1),
};

static int set_num(sim_args_t *s, const char *flag, const char *v,
                   double *gpn)
{
    double x;
    if (strcmp(flag, "--gpus-per-node") == 0) {
        if (num(flag, v, &x) != 0)
            return ST_EINVAL;
        *gpn = x;
        return 0;
    }
    for (size_t i = 0; i < sizeof num_flags / sizeof num_flags[0]; i++) {
        const num_flag_t *nf = &num_flags[i];
        if (strcmp(flag, nf->flag) != 0)
            continue;
        if (num(flag, v, &x) != 0)
            return ST_EINVAL;
        char *p = (char *)s + nf->off;
        if (nf->is_int)
            *(int *)p = (int)x;
        else
            *(double *)p = x * nf->scale;
        return 0;
    }
    fprintf(stderr, "ringd-sim: unknown flag %s (--help lists them)\n",
            flag);
    return ST_EINVAL;
}

static int parse(sim_args_t *s, int argc, char **argv)
{
    double gpn = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            usage();
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ringd-sim: %s wants a value\n", argv[i]);
            return ST_EINVAL;
        }
        const char *f = argv[i], *v = argv[++i];
        if (strcmp(f, "--ringbench") == 0)
            s->ringbench = v;
        else if (strcmp(f, "--e2e") == 0)
            s->e2e = v;
        else if (strcmp(f, "--etcd-load") == 0)
            s->etcd_load = v;
        else if (set_num(s, f, v, &gpn) != 0)
            return ST_EINVAL;
    }
    s->fail.fail_per_node_h *= gpn;
    s->work.grad_bytes = s->params * s->bytes_per_param;
    if (s->dc.bw <= 0 || s->work.compute_s <= 0 || s->work.batch < 1) {
        fprintf(stderr, "ringd-sim: bandwidth, step time and batch must "
                        "be positive\n");
        return ST_EINVAL;
    }
    return 0;
}

/* Loopback alpha-beta per n from ringbench's tcp rows, if it is there. */
static void calibrate(sim_args_t *s)
{
    for (int k = 0; k < 2; k++) {
        sim_row_t rows[MAXROWS];
        int count;
        int n = k ? 4 : 2;
        if (sim_ringbench_read(s->ringbench, "tcp", n, rows, MAXROWS,
                               &count) == 0 &&
            sim_fit(rows, count, &s->lo[k]) == 0)
            s->lo_fitted[k] = 1;
        printf("# loopback n=%d: hop %.1f us, link %.3f GB/s (%s)\n", n,
               s->lo[k].hop_s * 1e6, s->lo[k].bw / 1e9,
               s->lo_fitted[k] ? s->ringbench
                               : "built-in defaults: no ringbench rows");
        for (int i = 0; s->lo_fitted[k] && i < count; i++) {
            sim_cost_t c = sim_ring_flat(n, rows[i].bytes, &s->lo[k]);
            double model = (c.lat_s + c.bw_s) * 1e6;
            printf("#   fit at %.0f B: model %.0f us, ringbench %.0f us "
                   "(%+.0f%%)\n", rows[i].bytes, model, rows[i].usec,
                   (model / rows[i].usec - 1) * 100);
        }
    }
}

static const char *scheme_name[SIM_NSCHEMES] = {"flat", "grid",
                                                "grid_overlap"};

static void table(const sim_args_t *s, const sim_net_t *net,
                  const char *what)
{
    static const int nodes[] = {10, 100, 500, 1000};
    static const char *seed[] = {"0.82", "-", "-", "0.60"};
    printf("# %s: hop %.1f us, link %.2f GB/s; grad %.1f MB, step %.1f ms "
           "compute (%.0f%% backward), batch %d per node, buckets %.0f "
           "MiB\n", what, net->hop_s * 1e6, net->bw / 1e9,
           s->work.grad_bytes / 1e6, s->work.compute_s * 1e3,
           s->work.bwd_frac * 100, s->work.batch,
           s->work.bucket_bytes / 1048576.0);
    printf("nodes\tgrid\tseed_eff");
    for (int k = 0; k < SIM_NSCHEMES; k++)
        printf("\t%s_epoch_s\t%s_speedup\t%s_eff", scheme_name[k],
               scheme_name[k], scheme_name[k]);
    printf("\n");
    for (int i = 0; i < 4; i++) {
        int n = nodes[i];
        sim_grid_t g;
        sim_grid_layout(n, &g);
        char gs[64];
        if (g.short_rows == 0)
            snprintf(gs, sizeof gs, "%d_rows_of_%d", g.b, g.a);
        else
            snprintf(gs, sizeof gs, "%d_rows_of_%d(%d_of_%d)", g.b, g.a,
                     g.short_rows, g.a - 1);
        printf("%d\t%s\t%s", n, gs, seed[i]);
        for (int k = 0; k < SIM_NSCHEMES; k++) {
            double e = sim_efficiency(k, n, &s->work, net);
            printf("\t%.3f\t%.1f\t%.3f", sim_epoch_time(k, n, &s->work, net),
                   e * n, e);
        }
        printf("\n");
    }
}

typedef struct {
    int n;
    double bytes, ring_s, e2e_s;
} e2e_row_t;

/* e2e's rows with one trainer per node at n = 2 and 4, as times. */
static int e2e_read(const char *path, e2e_row_t *rows, int max)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        printf("# validation: %s: %s\n", path, strerror(errno));
        return 0;
    }
    char line[1024];
    int count = 0;
    while (count < max && fgets(line, sizeof line, f) != NULL) {
        int n, t;
        double bytes, e2e_bus, ring_bus;
        if (sscanf(line, "%d %d %lf %lf %lf", &n, &t, &bytes, &e2e_bus,
                   &ring_bus) != 5 || t != 1 || (n != 2 && n != 4) ||
            e2e_bus <= 0 || ring_bus <= 0)
            continue;
        double busf = 2.0 * (n - 1) / n * bytes / 1e9;
        rows[count++] = (e2e_row_t){.n = n, .bytes = bytes,
                                    .ring_s = busf / ring_bus,
                                    .e2e_s = busf / e2e_bus};
    }
    fclose(f);
    return count;
}

/*
 * The flat-ring model against bench/e2e: with the ringbench fit (another
 * run, minutes apart) and with a fit of e2e's own raw-ring rows (the
 * same run, interleaved with the product path it predicts).
 */
static void validate(const sim_args_t *s)
{
    e2e_row_t rows[MAXROWS];
    int count = e2e_read(s->e2e, rows, MAXROWS);
    if (count == 0)
        return;
    sim_net_t same[2];
    int same_ok[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        sim_row_t fit[MAXROWS];
        int m = 0;
        for (int i = 0; i < count; i++)
            if (rows[i].n == (k ? 4 : 2))
                fit[m++] = (sim_row_t){.n = rows[i].n,
                                       .bytes = rows[i].bytes,
                                       .usec = rows[i].ring_s * 1e6};
        same_ok[k] = sim_fit(fit, m, &same[k]) == 0;
    }
    printf("# the flat-ring model against bench/e2e (%s), one trainer "
           "per node; model: ringbench's fit at the same n; same_run: a "
           "fit of e2e's raw-ring rows; err = model / measured - 1\n",
           s->e2e);
    printf("n\tbytes\tmodel_ms\tring_ms\tring_err\te2e_ms\te2e_err"
           "\tsame_run_ms\tsame_run_e2e_err\n");
    for (int i = 0; i < count; i++) {
        const e2e_row_t *r = &rows[i];
        int k = r->n == 4;
        sim_cost_t c = sim_ring_flat(r->n, r->bytes, &s->lo[k]);
        double model = c.lat_s + c.bw_s, sr = 0;
        if (same_ok[k]) {
            c = sim_ring_flat(r->n, r->bytes, &same[k]);
            sr = c.lat_s + c.bw_s;
        }
        printf("%d\t%.0f\t%.2f\t%.2f\t%+.0f%%\t%.2f\t%+.0f%%\t%.2f\t"
               "%+.0f%%\n", r->n, r->bytes, model * 1e3, r->ring_s * 1e3,
               (model / r->ring_s - 1) * 100, r->e2e_s * 1e3,
               (model / r->e2e_s - 1) * 100, sr * 1e3,
               sr > 0 ? (sr / r->e2e_s - 1) * 100 : 0);
    }
}

static double goodput_table(const sim_args_t *s, double step_s)
{
    sim_fail_t f = s->fail;
    f.step_s = step_s;
    /* At scale the view takes longer to go round than in the demo. */
    f.recover_s = s->recover_small_s +
                  sim_view_change(1000, &s->etcd) -
                  sim_view_change(4, &s->etcd);
    double lambda_h = f.fail_per_node_h * 1000;
    printf("# failures: %.3g per node-hour (Llama 3: 419 in 54 days on "
           "16,384 GPUs = %.3g per GPU-hour), at 1000 nodes one every "
           "%.1f h; in place: recovery %.0f ms + one step %.0f ms redone "
           "+ a node short for %.0f s; restart: %.0f s + half of a %.0f s "
           "checkpoint interval; a checkpoint stalls %.2f s\n",
           f.fail_per_node_h, sim_fail_rate(419, 54, 16384, 1),
           1 / lambda_h, f.recover_s * 1e3, step_s * 1e3, f.replace_s,
           f.restart_s, sim_ckpt_interval(1000, &f), f.ckpt_s);
    printf("fail_rate_x\tgoodput_in_place\tgoodput_restart\n");
    static const double x[] = {1, 10, 100};
    for (int i = 0; i < 3; i++) {
        sim_fail_t g = f;
        g.fail_per_node_h *= x[i];
        printf("%.0f\t%.6f\t%.6f\n", x[i], sim_goodput(1000, &g, 1),
               sim_goodput(1000, &g, 0));
    }
    return sim_goodput(1000, &f, 1);
}

int main(int argc, char **argv)
{
    sim_args_t s;
    defaults(&s);
    if (parse(&s, argc, argv) != 0)
        return 2;
    if (s.etcd_load != NULL && sim_etcd_load_read(s.etcd_load, &s.etcd))
        return 1;
    s.recover_small_s = s.fail.recover_s;
    calibrate(&s);
    table(&s, &s.dc, "datacentre network (assumed: 100 Gb/s RDMA, 5 us a "
                     "hop unless flags say otherwise)");
    table(&s, &s.lo[0], "this machine's loopback links (n=2 fit) at every "
                        "hop");
    validate(&s);
    double step = sim_step_time(SIM_GRID_OVERLAP, 1000, &s.work, &s.dc);
    double good = goodput_table(&s, step);
    double view = sim_view_change(1000, &s.etcd);
    if (s.etcd.watcher_cpu_s > 0 || s.etcd.watcher_byte_cpu_s > 0)
        printf("# view change at 1000: %.1f ms base + 1000 watchers x "
               "(%.0f us + %.1f us per kB x %.1f kB) of etcd CPU on %.0f "
               "cores + the copies at %.2f GB/s\n", s.etcd.base_s * 1e3,
               s.etcd.watcher_cpu_s * 1e6, s.etcd.watcher_byte_cpu_s * 1e9,
               s.etcd.view_bytes_per_member, s.etcd.etcd_cores,
               s.etcd.etcd_bw / 1e9);
    else
        printf("# view change at 1000: %.1f ms base + %.1f ms fan-out at "
               "%d members scaled to 1000 + %.0f B per member to each of "
               "1000 watchers at %.2f GB/s\n", s.etcd.base_s * 1e3,
               s.etcd.fanout_s * 1e3, s.etcd.fanout_members,
               s.etcd.view_bytes_per_member, s.etcd.etcd_bw / 1e9);
    printf("# etcd's keepalive CPU at 1000 members: %.2f cores (%.0f us "
           "each, TTL %.0f s)\n", sim_etcd_cpu(1000, &s.etcd),
           s.etcd.keepalive_cpu_s * 1e6, s.etcd.ttl_s);
    printf("sim: eff_1000=%.3f eff_1000_flat=%.3f goodput_1000=%.4f "
           "view_change_1000_ms=%.0f\n",
           sim_efficiency(SIM_GRID_OVERLAP, 1000, &s.work, &s.dc),
           sim_efficiency(SIM_FLAT, 1000, &s.work, &s.dc), good,
           view * 1e3);
    return 0;
}
