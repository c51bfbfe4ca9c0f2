/*
 * sim.c - the model behind build/sim/ringd-sim (equations in
 * sim/README.md). Every function is a closed form or a short loop over
 * its arguments, so the test suite can check the model's invariants.
 */
#include "sim/sim.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/status.h"

static sim_cost_t cost(double hops, double bytes, const sim_net_t *net)
{
    sim_cost_t c = {.lat_s = hops * net->hop_s, .bw_s = bytes / net->bw,
                    .hops = hops};
    return c;
}

static double total(sim_cost_t c)
{
    return c.lat_s + c.bw_s;
}

static sim_cost_t add(sim_cost_t x, sim_cost_t y)
{
    sim_cost_t c = {.lat_s = x.lat_s + y.lat_s, .bw_s = x.bw_s + y.bw_s,
                    .hops = x.hops + y.hops};
    return c;
}

sim_cost_t sim_ring_flat(int n, double bytes, const sim_net_t *net)
{
    if (n <= 1)
        return (sim_cost_t){0};
    return cost(2.0 * (n - 1), 2.0 * (n - 1) / n * bytes, net);
}

int sim_grid_valid(const sim_grid_t *g, int n)
{
    return g->a >= 1 && g->b >= 1 && g->short_rows >= 0 &&
           g->short_rows < g->b && (g->short_rows == 0 || g->a >= 2) &&
           (long)g->a * g->b - g->short_rows == n;
}

/*
 * Along a row of len members: a reduce-scatter (or an allgather) of
 * bytes split evenly among them, len - 1 steps of bytes / len.
 */
static sim_cost_t row_phase(int len, double bytes, const sim_net_t *net)
{
    if (len <= 1)
        return (sim_cost_t){0};
    return cost(len - 1, (double)(len - 1) / len * bytes, net);
}

sim_cost_t sim_ring_grid(const sim_grid_t *g, double bytes,
                         const sim_net_t *net)
{
    int n = g->a * g->b - g->short_rows;
    if (!sim_grid_valid(g, n) || n <= 1)
        return (sim_cost_t){0};
    /* A full row is never faster than a short one: it sets the rows'
     * phases. In the columns every member of a short row carries
     * bytes / (a - 1), and each column ring steps at its slowest
     * member's pace. */
    sim_cost_t rs = row_phase(g->a, bytes, net);
    sim_cost_t col = {0};
    if (g->b > 1) {
        int width = g->short_rows > 0 ? g->a - 1 : g->a;
        col = cost(2.0 * (g->b - 1),
                   2.0 * (g->b - 1) / g->b * bytes / width, net);
    }
    return add(add(rs, col), rs);
}

int sim_grid_layout(int n, sim_grid_t *grid_p)
{
    if (n < 1) {
        RD_ERROR("sim: a grid of %d nodes", n);
        return ST_EINVAL;
    }
    sim_grid_t g = {.a = n, .b = 1, .short_rows = 0};
    if (n >= SIM_GRID_MIN_NODES) {
        int b = 1;
        while ((b + 1) * (b + 1) <= n)
            b++;
        g.b = b;
        g.a = (n + b - 1) / b;
        g.short_rows = g.a * b - n;
    }
    *grid_p = g;
    return 0;
}

/*
 * One allreduce of bytes at n nodes under scheme s. The two-level
 * schemes run the flat ring for a message the grid would carry slower
 * (the job's size threshold).
 */
static double allreduce_time(sim_scheme_t s, int n, double bytes,
                             const sim_net_t *net)
{
    double flat = total(sim_ring_flat(n, bytes, net));
    if (s == SIM_FLAT)
        return flat;
    sim_grid_t g;
    if (sim_grid_layout(n, &g) != 0)
        return flat;
    return fmin(flat, total(sim_ring_grid(&g, bytes, net)));
}

/*
 * Buckets fill at an even rate through backward; bucket i is allreduced
 * once it is full and bucket i - 1 is done (one ring, in order). What is
 * left when backward ends is exposed.
 */
static double overlap_exposed(int n, const sim_work_t *w,
                              const sim_net_t *net)
{
    double bwd = w->compute_s * w->bwd_frac;
    double bk = w->bucket_bytes > 0 ? w->bucket_bytes : w->grad_bytes;
    double done = 0, filled = 0;
    while (filled < w->grad_bytes) {
        double sz = fmin(bk, w->grad_bytes - filled);
        filled += sz;
        double ready = bwd * filled / w->grad_bytes;
        done = fmax(done, ready) + allreduce_time(SIM_GRID, n, sz, net);
    }
    return fmax(0, done - bwd);
}

double sim_exposed_comm(sim_scheme_t s, int n, const sim_work_t *w,
                        const sim_net_t *net)
{
    if (n <= 1)
        return 0;
    if (s == SIM_GRID_OVERLAP)
        return overlap_exposed(n, w, net);
    return allreduce_time(s, n, w->grad_bytes, net);
}

double sim_step_time(sim_scheme_t s, int n, const sim_work_t *w,
                     const sim_net_t *net)
{
    return w->compute_s + sim_exposed_comm(s, n, w, net);
}

double sim_efficiency(sim_scheme_t s, int n, const sim_work_t *w,
                      const sim_net_t *net)
{
    return sim_step_time(s, 1, w, net) / sim_step_time(s, n, w, net);
}

double sim_epoch_time(sim_scheme_t s, int n, const sim_work_t *w,
                      const sim_net_t *net)
{
    double steps = w->epoch_samples / ((double)n * w->batch);
    return steps * sim_step_time(s, n, w, net);
}

double sim_fail_rate(double interruptions, double days, double gpus,
                     double gpus_per_node)
{
    return interruptions / (days * 24.0 * gpus) * gpus_per_node;
}

/* Failures of the whole n-node job per second. */
static double job_rate(int n, const sim_fail_t *f)
{
    return f->fail_per_node_h * n / 3600.0;
}

double sim_ckpt_interval(int n, const sim_fail_t *f)
{
    if (f->ckpt_every_s > 0)
        return f->ckpt_every_s;
    double lambda = job_rate(n, f);
    if (lambda <= 0 || f->ckpt_s <= 0)
        return INFINITY;
    return sqrt(2.0 * f->ckpt_s / lambda);
}

double sim_goodput(int n, const sim_fail_t *f, int in_place)
{
    double lambda = job_rate(n, f);
    double tau = sim_ckpt_interval(n, f);
    double ckpt = isinf(tau) ? 0 : f->ckpt_s / tau;
    double per_fail;
    if (in_place)
        per_fail = f->recover_s + f->step_s + f->replace_s / n;
    else
        per_fail = f->restart_s + (isinf(tau) ? 0 : tau / 2);
    return fmax(0, 1.0 - ckpt - lambda * per_fail);
}

double sim_view_change(int n, const sim_etcd_t *e)
{
    double fan = e->fanout_members > 0
                     ? e->fanout_s * n / e->fanout_members : e->fanout_s;
    double view_bytes = (double)n * e->view_bytes_per_member;
    if (e->watcher_cpu_s > 0 || e->watcher_byte_cpu_s > 0)
        fan = n * (e->watcher_cpu_s + e->watcher_byte_cpu_s * view_bytes) /
              (e->etcd_cores > 0 ? e->etcd_cores : 1);
    /* Every watcher receives the whole view: n copies of n members. */
    double bytes = (double)n * view_bytes;
    return e->base_s + fan + (e->etcd_bw > 0 ? bytes / e->etcd_bw : 0);
}

double sim_etcd_cpu(int n, const sim_etcd_t *e)
{
    if (e->ttl_s <= 0)
        return 0;
    return n * e->keepalive_cpu_s * 3.0 / e->ttl_s;
}

int sim_ringbench_read(const char *path, const char *tls, int n,
                       sim_row_t *rows, int max, int *count_p)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int rc = -errno;
        RD_ERROR("sim: %s: %s", path, strerror(errno));
        return rc;
    }
    char line[1024];
    int count = 0;
    while (count < max && fgets(line, sizeof line, f) != NULL) {
        char t[16];
        int rn;
        double bytes, usec;
        if (line[0] == '#' ||
            sscanf(line, "%15s %d %lf %lf", t, &rn, &bytes, &usec) != 4)
            continue;
        if (strcmp(t, tls) != 0 || rn != n || bytes <= 0 || usec <= 0)
            continue;
        rows[count++] = (sim_row_t){.n = rn, .bytes = bytes, .usec = usec};
    }
    fclose(f);
    if (count == 0) {
        RD_ERROR("sim: %s: no %s n=%d row", path, tls, n);
        return ST_EINVAL;
    }
    *count_p = count;
    return 0;
}

int sim_fit(const sim_row_t *rows, int count, sim_net_t *net_p)
{
    /* T = h * alpha + c * x, x = 1 / bw; weights 1 / T^2. */
    double shh = 0, shc = 0, scc = 0, sht = 0, sct = 0;
    for (int i = 0; i < count; i++) {
        int n = rows[i].n;
        double t = rows[i].usec * 1e-6;
        double h = 2.0 * (n - 1), c = 2.0 * (n - 1) / n * rows[i].bytes;
        double w = 1.0 / (t * t);
        shh += w * h * h;
        shc += w * h * c;
        scc += w * c * c;
        sht += w * h * t;
        sct += w * c * t;
    }
    double det = shh * scc - shc * shc;
    if (count < 2 || !(det > 1e-12 * shh * scc)) {
        RD_ERROR("sim: %d rows do not fix alpha and beta", count);
        return ST_EINVAL;
    }
    double alpha = (sht * scc - shc * sct) / det;
    double x = (shh * sct - shc * sht) / det;
    if (!(alpha > 0) || !(x > 0)) {
        RD_ERROR("sim: fit gives alpha %g s, beta %g s/B", alpha, x);
        return ST_EINVAL;
    }
    net_p->hop_s = alpha;
    net_p->bw = 1.0 / x;
    return 0;
}

int sim_etcd_load_read(const char *path, sim_etcd_t *e)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        int rc = -errno;
        RD_ERROR("sim: %s: %s", path, strerror(errno));
        return rc;
    }
    char line[1024];
    int found = 0, m = 0;
    double fan_ms = 0, key_us = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        const char *p = strstr(line, "etcd_load: ");
        const char *q = strstr(line, "etcd_fanout: ");
        int tm;
        double tc, tf, tk, cw, cb;
        /* CPU per watcher, and per watcher and kB (1000 bytes). */
        if (q != NULL &&
            sscanf(q, "etcd_fanout: per_watcher_us=%*f "
                      "per_watcher_kb_us=%*f cpu_per_watcher_us=%lf "
                      "cpu_per_watcher_kb_us=%lf", &cw, &cb) == 2 &&
            cw >= 0 && cb >= 0) {
            e->watcher_cpu_s = cw * 1e-6;
            e->watcher_byte_cpu_s = cb * 1e-9;
        }
        if (p != NULL &&
            sscanf(p, "etcd_load: members=%d etcd_cpu_pct=%lf "
                      "view_fanout_ms=%lf per_key_us=%lf",
                   &tm, &tc, &tf, &tk) == 4) {
            m = tm;
            fan_ms = tf;
            key_us = tk;
            found = 1;
        }
    }
    fclose(f);
    if (!found || m < 1 || fan_ms < 0 || key_us < 0) {
        RD_ERROR("sim: %s: no etcd_load line", path);
        return ST_EINVAL;
    }
    e->fanout_members = m;
    e->fanout_s = fan_ms * 1e-3;
    e->keepalive_cpu_s = key_us * 1e-6;
    return 0;
}
