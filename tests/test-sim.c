/*
 * test-sim.c - invariants of the scale model (sim/sim.h): what any
 * allreduce and any failure model must obey, checked over ranges of node
 * counts, sizes and networks rather than at one point.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "sim/sim.h"
#include "tests/helpers.h"
#include "tests/task.h"

#define ASSERT_REL(x, y, tol)                                                \
    ASSERT_MSG(fabs((x) - (y)) <= (tol) * fabs(y), "%s = %.9g, %s = %.9g",  \
               #x, (double)(x), #y, (double)(y))

static const sim_net_t nets[] = {
    {.hop_s = 5e-6, .bw = 12.5e9},    /* 100 Gb/s RDMA */
    {.hop_s = 12e-6, .bw = 1.36e9},   /* this machine's loopback */
    {.hop_s = 50e-6, .bw = 100e9},    /* latency-bound */
};
#define NNETS (int)(sizeof nets / sizeof nets[0])

static sim_work_t resnet(void)
{
    sim_work_t w = {.grad_bytes = 102.4e6, .compute_s = 0.1036,
                    .bwd_frac = 2.0 / 3, .bucket_bytes = 25 << 20,
                    .batch = 256, .epoch_samples = 50000};
    return w;
}

TEST_IMPL(sim_efficiency_bounded)
{
    static const int ns[] = {1, 2, 3, 10, 16, 100, 500, 997, 1000};
    for (int k = 0; k < NNETS; k++)
        for (int s = 0; s < SIM_NSCHEMES; s++)
            for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
                sim_work_t w = resnet();
                double e = sim_efficiency(s, ns[i], &w, &nets[k]);
                ASSERT_MSG(e > 0 && e <= 1, "scheme %d n %d net %d: %g", s,
                           ns[i], k, e);
                if (ns[i] == 1)
                    ASSERT_REL(e, 1.0, 1e-12);
                /* Hiding communication never makes a step shorter. */
                double exposed = sim_exposed_comm(s, ns[i], &w, &nets[k]);
                ASSERT(exposed >= 0);
            }
    return 0;
}

TEST_IMPL(sim_grid_latency_below_flat)
{
    static const double sizes[] = {4096, 1 << 20, 25 << 20, 102.4e6};
    for (int n = 16; n <= 1100; n++) {
        sim_grid_t g;
        ASSERT_OK(sim_grid_layout(n, &g));
        ASSERT_MSG(g.b > 1, "n %d stayed flat", n);
        for (int k = 0; k < NNETS; k++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                sim_cost_t grid = sim_ring_grid(&g, sizes[z], &nets[k]);
                sim_cost_t flat = sim_ring_flat(n, sizes[z], &nets[k]);
                ASSERT_MSG(grid.lat_s < flat.lat_s,
                           "n %d: grid %dx%d (%d short) latency %g s, "
                           "flat %g s", n, g.a, g.b, g.short_rows,
                           grid.lat_s, flat.lat_s);
                ASSERT_EQ(grid.hops, 2 * (g.a - 1) + 2 * (g.b - 1));
            }
        /* About 2(a + b) hops with a and b near sqrt(n): 4 sqrt(n). */
        ASSERT_MSG(g.a + g.b <= 2 * ceil(sqrt(n)) + 1, "n %d: %dx%d", n,
                   g.a, g.b);
    }
    /* 2(a + b - 2) hops on a full grid: 2 * (31 + 31) for 32 x 32. */
    sim_grid_t sq = {.a = 32, .b = 32, .short_rows = 0};
    ASSERT_EQ(sim_ring_grid(&sq, 4096, &nets[0]).hops, 124);
    return 0;
}

TEST_IMPL(sim_grid_bandwidth_term)
{
    double bytes = 102.4e6;
    /* Every full a x b grid carries exactly the flat ring's bytes. */
    for (int a = 1; a <= 40; a++)
        for (int b = 1; b <= 40; b++) {
            sim_grid_t g = {.a = a, .b = b, .short_rows = 0};
            int n = a * b;
            if (n < 2)
                continue;
            sim_cost_t grid = sim_ring_grid(&g, bytes, &nets[0]);
            sim_cost_t flat = sim_ring_flat(n, bytes, &nets[0]);
            ASSERT_REL(grid.bw_s, flat.bw_s, 1e-12);
        }
    /* A ragged layout never beats the bound 2(n-1)/n * bytes, and pays
     * little above it (its short rows carry bytes / (a - 1) in the
     * columns instead of bytes / a): under 1% from 100 nodes on. */
    for (int n = 2; n <= 1100; n++) {
        sim_grid_t g;
        ASSERT_OK(sim_grid_layout(n, &g));
        sim_cost_t grid = sim_ring_grid(&g, bytes, &nets[0]);
        sim_cost_t flat = sim_ring_flat(n, bytes, &nets[0]);
        ASSERT_MSG(grid.bw_s >= flat.bw_s * (1 - 1e-12),
                   "n %d: %g below the bound %g", n, grid.bw_s, flat.bw_s);
        if (n >= 100)
            ASSERT_MSG(grid.bw_s <= flat.bw_s * 1.01,
                       "n %d: grid %dx%d (%d short) carries %g s, flat "
                       "%g s", n, g.a, g.b, g.short_rows, grid.bw_s,
                       flat.bw_s);
    }
    return 0;
}

TEST_IMPL(sim_grid_ragged)
{
    for (int n = 1; n <= 1100; n++) {
        sim_grid_t g;
        ASSERT_OK(sim_grid_layout(n, &g));
        ASSERT_MSG(sim_grid_valid(&g, n), "n %d: %d %d %d", n, g.a, g.b,
                   g.short_rows);
        /* The same conditions, spelled out rather than trusted. */
        ASSERT_EQ(g.a * g.b - g.short_rows, n);
        ASSERT(g.short_rows >= 0 && g.short_rows < g.b);
        ASSERT(g.short_rows == 0 || g.a >= 2);
    }
    static const int ragged[] = {7, 10, 13, 997, 1000};
    for (size_t i = 0; i < sizeof ragged / sizeof ragged[0]; i++) {
        int n = ragged[i];
        sim_grid_t g;
        ASSERT_OK(sim_grid_layout(n, &g));
        ASSERT_MSG(g.a > 1 && g.b > 1, "n %d stayed flat: %dx%d", n, g.a,
                   g.b);
    }
    /* ring_grid.c's rows: floor(sqrt(n)) of them, widths within one.
     * 997 is prime: every grid of it has short rows. */
    sim_grid_t g;
    ASSERT_OK(sim_grid_layout(997, &g));
    ASSERT_EQ(g.b, 31);
    ASSERT_EQ(g.a, 33);
    ASSERT_EQ(g.short_rows, 26);
    ASSERT_OK(sim_grid_layout(1000, &g));
    ASSERT_EQ(g.b, 31);
    ASSERT_EQ(g.short_rows, 23);
    ASSERT_OK(sim_grid_layout(3, &g));
    ASSERT_EQ(g.b, 1);
    sim_grid_t bad = {.a = 10, .b = 10, .short_rows = 10};
    ASSERT(!sim_grid_valid(&bad, 90));
    bad = (sim_grid_t){.a = 10, .b = 10, .short_rows = -1};
    ASSERT(!sim_grid_valid(&bad, 101));
    ASSERT_EQ(sim_grid_layout(0, &g), ST_EINVAL);
    return 0;
}

TEST_IMPL(sim_overlap_hides_all_but_the_tail)
{
    for (int k = 0; k < NNETS; k++)
        for (int n = 2; n <= 1000; n = n * 3 + 1) {
            sim_work_t w = resnet();
            double seq = sim_exposed_comm(SIM_GRID, n, &w, &nets[k]);
            double ovl = sim_exposed_comm(SIM_GRID_OVERLAP, n, &w,
                                          &nets[k]);
            ASSERT_MSG(ovl <= seq * (1 + 1e-12), "n %d: %g > %g", n, ovl,
                       seq);
            /* The last bucket fills as backward ends: its allreduce is
             * never hidden. 102.4 MB in 25 MiB buckets leaves 23.5 MB. */
            double tail = w.grad_bytes - 3.0 * w.bucket_bytes;
            sim_grid_t g;
            ASSERT_OK(sim_grid_layout(n, &g));
            sim_cost_t c = sim_ring_grid(&g, tail, &nets[k]);
            sim_cost_t f = sim_ring_flat(n, tail, &nets[k]);
            double t = fmin(c.lat_s + c.bw_s, f.lat_s + f.bw_s);
            ASSERT_MSG(ovl >= t * (1 - 1e-12), "n %d: %g < the tail's %g",
                       n, ovl, t);
            /* With no backward to hide behind, nothing is hidden. */
            w.bwd_frac = 0;
            double none = sim_exposed_comm(SIM_GRID_OVERLAP, n, &w,
                                           &nets[k]);
            ASSERT(none >= seq * (1 - 1e-12));
        }
    return 0;
}

TEST_IMPL(sim_goodput_falls_with_failures)
{
    sim_fail_t f = {.fail_per_node_h = sim_fail_rate(419, 54, 16384, 1),
                    .recover_s = 0.15, .step_s = 0.11, .replace_s = 600,
                    .restart_s = 300, .ckpt_s = 0.25};
    /* 419 / (54 * 24 * 16384) per GPU-hour. */
    ASSERT_REL(f.fail_per_node_h, 1.9733e-5, 1e-3);
    ASSERT_REL(sim_fail_rate(419, 54, 16384, 8), 8 * f.fail_per_node_h,
               1e-12);
    for (int mode = 0; mode < 2; mode++) {
        double prev = 1.0 + 1e-12;
        for (double x = 0; x <= 1000; x = x ? x * 2 : 0.01) {
            sim_fail_t g = f;
            g.fail_per_node_h *= x;
            double gp = sim_goodput(1000, &g, mode);
            ASSERT_MSG(gp >= 0 && gp <= 1, "mode %d x %g: %g", mode, x, gp);
            ASSERT_MSG(gp < prev || gp == 0, "mode %d x %g: %.9f after "
                       "%.9f", mode, x, gp, prev);
            if (x == 0)
                ASSERT_REL(gp, 1.0, 1e-12);
            prev = gp;
        }
    }
    /* With a fixed checkpoint interval only the failures move goodput:
     * the closed forms of sim.h, one failure cost each. */
    f.ckpt_every_s = 1800;
    double lambda = f.fail_per_node_h * 1000 / 3600;
    ASSERT_REL(sim_goodput(1000, &f, 1),
               1 - 0.25 / 1800 - lambda * (0.15 + 0.11 + 600.0 / 1000),
               1e-12);
    ASSERT_REL(sim_goodput(1000, &f, 0),
               1 - 0.25 / 1800 - lambda * (300 + 900), 1e-12);
    for (int mode = 0; mode < 2; mode++) {
        sim_fail_t lo = f, hi = f;
        hi.fail_per_node_h *= 10;
        ASSERT(sim_goodput(1000, &hi, mode) < sim_goodput(1000, &lo, mode));
    }
    f.ckpt_every_s = 0;
    /* In place beats a restart from the checkpoint. */
    ASSERT(sim_goodput(1000, &f, 1) > sim_goodput(1000, &f, 0));
    return 0;
}

TEST_IMPL(sim_inputs_parse_and_fit)
{
    char *dir = th_mkdtemp("ringd-sim");
    ASSERT(dir != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/rb.tsv", dir);
    /* Rows a flat ring of alpha 20 us, 2 GB/s would give. */
    sim_net_t truth = {.hop_s = 20e-6, .bw = 2e9};
    FILE *f = fopen(path, "w");
    ASSERT(f != NULL);
    fprintf(f, "tls\tn\tbytes\tusec\talgbw_GBps\n# ceiling tcp n=4 ...\n");
    static const double sizes[] = {4096, 1048576, 67108864};
    for (int n = 2; n <= 4; n += 2)
        for (int i = 0; i < 3; i++) {
            sim_cost_t c = sim_ring_flat(n, sizes[i], &truth);
            fprintf(f, "tcp\t%d\t%.0f\t%.6f\t0\n", n, sizes[i],
                    (c.lat_s + c.bw_s) * 1e6);
            fprintf(f, "auto\t%d\t%.0f\t1\t0\n", n, sizes[i]);
        }
    fprintf(f, "etcd_load: members=100 etcd_cpu_pct=1 view_fanout_ms=9 "
               "per_key_us=30\n");
    fprintf(f, "etcd_load: members=250 etcd_cpu_pct=3 view_fanout_ms=12.5 "
               "per_key_us=40\n");
    ASSERT_EQ(fclose(f), 0);
    sim_row_t rows[8];
    int count = 0;
    ASSERT_OK(sim_ringbench_read(path, "tcp", 4, rows, 8, &count));
    ASSERT_EQ(count, 3);
    sim_net_t fit;
    ASSERT_OK(sim_fit(rows, count, &fit));
    ASSERT_REL(fit.hop_s, truth.hop_s, 1e-4);
    ASSERT_REL(fit.bw, truth.bw, 1e-4);
    ASSERT_EQ(sim_ringbench_read(path, "tcp", 8, rows, 8, &count),
              ST_EINVAL);
    ASSERT_EQ(sim_fit(rows, 1, &fit), ST_EINVAL);
    sim_etcd_t e = {0};
    ASSERT_OK(sim_etcd_load_read(path, &e));
    ASSERT_EQ(e.fanout_members, 250);
    ASSERT_REL(e.fanout_s, 0.0125, 1e-12);
    ASSERT_REL(e.keepalive_cpu_s, 40e-6, 1e-12);
    /* At the measured size the fan-out is the measurement; more
     * members never reach sooner. */
    e.base_s = 0.01;
    ASSERT_REL(sim_view_change(250, &e), 0.0225, 1e-12);
    ASSERT_REL(sim_view_change(1000, &e), 0.01 + 0.05, 1e-12);
    e.view_bytes_per_member = 64;
    e.etcd_bw = 1.25e9;
    /* 1000 copies of a 64 KB view at 1.25 GB/s: 51.2 ms more. */
    ASSERT_REL(sim_view_change(1000, &e), 0.01 + 0.05 + 0.0512, 1e-12);
    for (int n = 1; n < 2000; n += 50)
        ASSERT(sim_view_change(n + 50, &e) > sim_view_change(n, &e));
    /* 1000 members, a keepalive each every 5 / 3 s, 40 us each. */
    e.ttl_s = 5;
    ASSERT_REL(sim_etcd_cpu(1000, &e), 1000 * 40e-6 * 3 / 5, 1e-12);
    /* The fit's line: n watchers' events of 200 us + 40 us per kB of
     * view each, on 2 cores; 10 bytes a member, so 10 kB at 1000. */
    snprintf(path, sizeof path, "%s/fanout", dir);
    f = fopen(path, "w");
    ASSERT(f != NULL);
    fprintf(f, "etcd_load: members=1000 etcd_cpu_pct=9 view_fanout_ms=700 "
               "per_key_us=600\n"
               "etcd_fanout: per_watcher_us=300.5 per_watcher_kb_us=117.21 "
               "cpu_per_watcher_us=200 cpu_per_watcher_kb_us=40\n");
    ASSERT_EQ(fclose(f), 0);
    sim_etcd_t t = {.base_s = 0.01, .view_bytes_per_member = 10,
                    .etcd_cores = 2};
    ASSERT_OK(sim_etcd_load_read(path, &t));
    ASSERT_REL(t.watcher_cpu_s, 200e-6, 1e-12);
    ASSERT_REL(t.watcher_byte_cpu_s, 40e-9, 1e-12);
    ASSERT_REL(sim_view_change(1000, &t),
               0.01 + 1000 * (200e-6 + 40e-9 * 10000) / 2, 1e-12);
    /* Half the view's bytes save only the per-byte part. */
    t.view_bytes_per_member = 5;
    ASSERT_REL(sim_view_change(1000, &t),
               0.01 + 1000 * (200e-6 + 40e-9 * 5000) / 2, 1e-12);
    for (int n = 1; n < 2000; n += 50)
        ASSERT(sim_view_change(n + 50, &t) > sim_view_change(n, &t));
    snprintf(path, sizeof path, "%s/none", dir);
    ASSERT(sim_etcd_load_read(path, &e) < 0);
    th_rmtree(dir);
    free(dir);
    return 0;
}
