/*
 * e2e-mem.c - bench/e2e's memory and checkpoint rows (all of --mem-only):
 * the daemons' private memory per byte of state with checkpoints off and
 * on, the allreduce time with checkpoints over without, the stall a
 * checkpoint adds to a step (empty, and with a 4 KiB allreduce), the
 * daemons' loop lag in those steps and the checkpoint counters.
 */
#include "bench/e2e-coord.h"

#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/clock.h"
#include "tests/dmn-util.h"

/* The largest anonymous (private) resident set of c's daemons: their
 * heap, staging, snapshots and checkpoint buffers, not the trainers'
 * shared buffers (those are RssShmem). */
static double cluster_private_bytes(const cluster_t *c)
{
    double worst = 0;
    for (int i = 0; i < c->n; i++) {
        char path[64], line[256];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)c->d[i].pid);
        FILE *f = fopen(path, "r");
        unsigned long long kb;
        while (f != NULL && fgets(line, sizeof(line), f) != NULL)
            if (sscanf(line, "RssAnon: %llu kB", &kb) == 1 &&
                kb * 1024.0 > worst)
                worst = kb * 1024.0;
        if (f != NULL)
            fclose(f);
    }
    return worst;
}

#define MEM_STATE (256 * MiB)
#define MEM_GRADS (64 * MiB)

/* The value of a /metrics line beginning with key (name and labels). */
static double metric_in(const char *m, const char *key)
{
    char want[160];
    snprintf(want, sizeof(want), "\n%s ", key);
    const char *p = m != NULL ? strstr(m, want) : NULL;
    return p != NULL ? strtod(p + strlen(want), NULL) : 0;
}

/* Wait (up to 120 s) until no writer of c's daemons holds a shard; the
 * seconds waited, negative when they still did. */
static double wait_writers(const cluster_t *c)
{
    uint64_t t0 = rd_now_ns();
    int busy = 1;
    while (busy && rd_now_ns() - t0 < 120000000000ull) {
        busy = 0;
        for (int i = 0; i < c->n && !busy; i++) {
            char *m = td_http_get(c->d[i].metrics_port, "/metrics");
            busy = metric_in(m, "ringd_checkpoint_writing") != 0;
            free(m);
        }
        if (busy)
            poll(NULL, 0, 50);
    }
    double s = (double)(rd_now_ns() - t0) / 1e9;
    return busy ? -s : s;
}

/* The largest value of a metric among c's daemons. */
static double cluster_metric_max(const cluster_t *c, const char *key)
{
    double worst = 0;
    for (int i = 0; i < c->n; i++) {
        char *m = td_http_get(c->d[i].metrics_port, "/metrics");
        double v = metric_in(m, key);
        if (v > worst)
            worst = v;
        free(m);
    }
    return worst;
}

/*
 * A checkpoint's stall per GiB of state as a difference: the phases'
 * step times with checkpoints minus without (each round's mean step of
 * the slowest trainer, the median over the rounds), times the steps of a
 * round, over the checkpoints the on job copied per round (a boundary
 * that finds the writers still busy takes none), scaled from MEM_STATE.
 * Two noisy figures subtracted: it can read below 0.
 */
static double diff_per_gib(double *son, double *soff,
                           int rounds, int nsteps, double copies)
{
    if (copies <= 0)
        return NAN; /* printed as "na": no checkpoint to measure */
    double ms = (e2e__median(son, rounds) - e2e__median(soff, rounds)) *
                nsteps / (copies / rounds) / 1e3;
    return ms * (1024.0 * MiB) / MEM_STATE;
}

/* Each of c's daemons' checkpoint hold seconds, holds and copies. */
static void hold_counters(const cluster_t *c, double v[MEM_NODES][3])
{
    static const char *const keys[3] = {
        "ringd_checkpoint_hold_seconds_total", "ringd_checkpoint_holds_total",
        "ringd_checkpoint_copies_total"};
    for (int i = 0; i < MEM_NODES; i++) {
        char *m = i < c->n ? td_http_get(c->d[i].metrics_port, "/metrics")
                           : NULL;
        for (int k = 0; k < 3; k++)
            v[i][k] = metric_in(m, keys[k]);
        free(m);
    }
}

/*
 * The stall from the daemons' own clocks between two readings: per
 * daemon, the time its collectives waited for the checkpoint copies
 * (the daemon holds a completed collective until the copy of the
 * boundary's shards is done: the only wait checkpoints put on a step,
 * daemon/README.md "Checkpoints") over the copies it made, in ms per GiB
 * of state; the worst and the best daemon. A sum of durations over a
 * count: it cannot read below 0.
 */
static void hold_stall(mem_t *out, double v0[MEM_NODES][3],
                       double v1[MEM_NODES][3])
{
    out->stall_ms_per_gib = NAN;
    out->stall_min_ms_per_gib = NAN;
    for (int i = 0; i < MEM_NODES; i++) {
        double held_s = v1[i][0] - v0[i][0];
        out->holds[i] = v1[i][1] - v0[i][1];
        out->hold_copies[i] = v1[i][2] - v0[i][2];
        double x = NAN;
        if (out->hold_copies[i] > 0)
            x = held_s * 1e3 / out->hold_copies[i] * (1024.0 * MiB) /
                MEM_STATE;
        out->hold_ms_per_gib[i] = x;
        if (isnan(x))
            continue;
        if (isnan(out->stall_ms_per_gib) || x > out->stall_ms_per_gib)
            out->stall_ms_per_gib = x;
        if (isnan(out->stall_min_ms_per_gib) ||
            x < out->stall_min_ms_per_gib)
            out->stall_min_ms_per_gib = x;
    }
}

/*
 * Where the checkpoints of c's daemons spent their time, from their
 * counters (daemon/README.md, "Checkpoints"): one '#' line per daemon,
 * so a stall can be told from a held collective, a slow copy (wall
 * against CPU: waiting for a core; faults: first touch), the encoders
 * or the main loop.
 */
static void print_ckpt_counters(const cluster_t *c)
{
    /* The last checkpoint's encoders may still run (at a low priority):
     * their figures count only once they are done. */
    double s = wait_writers(c);
    printf("# the writers finished %.1f s after the last step%s\n",
           s < 0 ? -s : s, s < 0 ? " (not yet)" : "");
    static const char *const keys[][2] = {
        {"ringd_checkpoints_skipped_total", "skipped"},
        {"ringd_checkpoint_copies_total", "copies"},
        {"ringd_checkpoint_holds_total", "holds"},
        {"ringd_checkpoint_hold_seconds_total", "hold_s"},
        {"ringd_checkpoint_hold_seconds_max", "hold_max_s"},
        {"ringd_checkpoint_copy_seconds_total", "copy_wall_s"},
        {"ringd_checkpoint_shard_copy_seconds_total{shard=\"primary\"}",
         "copy1_s"},
        {"ringd_checkpoint_shard_copy_cpu_seconds_total{shard=\"primary\"}",
         "copy1_cpu_s"},
        {"ringd_checkpoint_shard_copy_page_faults_total{shard=\"primary\"}",
         "copy1_faults"},
        {"ringd_checkpoint_encode_seconds_total{shard=\"primary\"}",
         "enc1_s"},
        {"ringd_checkpoint_encode_cpu_seconds_total{shard=\"primary\"}",
         "enc1_cpu_s"},
        {"ringd_checkpoint_encode_seconds_total{shard=\"replica\"}",
         "enc2_s"},
        {"ringd_checkpoint_shards_written_total{shard=\"primary\"}",
         "written1"},
        {"ringd_checkpoint_loop_seconds_total", "loop_s"},
        {"ringd_loop_copy_bytes_total", "loop_copy_B"},
    };
    for (int i = 0; i < c->n; i++) {
        char *m = td_http_get(c->d[i].metrics_port, "/metrics");
        printf("# ckpt counters n%d:", i);
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++)
            printf(" %s=%.4g", keys[k][1], metric_in(m, keys[k][0]));
        printf("\n");
        free(m);
    }
}

/*
 * n = 4, one trainer each, a 256 MiB state and 64 MiB of gradients:
 * the daemons' private memory as a multiple of the state, checkpoints off
 * and on (every CKPT_INTERVAL steps), and the allreduce time with
 * checkpoints over the time without (medians, the two jobs interleaved).
 */
void e2e__run_mem(bench_t *b, mem_t *out)
{
    static cluster_t off, on;
    char dir[600];
    snprintf(dir, sizeof(dir), "%s/ckpt", b->tmp);
    mkdir(dir, 0700);
    e2e__cluster_up(b, &off, "e2e-mem-off", 4, 1, MEM_GRADS, MEM_STATE);
    e2e__cluster_up_ckpt(b, &on, "e2e-mem-on", 4, 1, MEM_GRADS, MEM_STATE,
                         dir);
    double toff[MAXROUNDS], ton[MAXROUNDS];
    for (int r = 0; r < b->rounds; r++) {
        toff[r] = e2e__group_run(off.tr, 4, MEM_GRADS, 10);
        ton[r] = e2e__group_run(on.tr, 4, MEM_GRADS, 10);
    }
    /* Empty steps, 2 * CKPT_INTERVAL of them: the mean holds the
     * checkpoint boundaries' effect as the trainer sees it. A step
     * without a collective is never held for the copy (daemon/README.md,
     * "Checkpoints"), so the second phase's steps each run one 4 KiB
     * allreduce and no compute: the worst case, nothing to overlap the
     * copy with, and the daemons' hold counters measure its stall. */
    double soff[MAXROUNDS], son[MAXROUNDS], v0[MEM_NODES][3];
    double v1[MEM_NODES][3];
    const char *copies_key = "ringd_checkpoint_copies_total";
    int nsteps = 2 * atoi(CKPT_INTERVAL);
    e2e__group_want_mean(1);
    (void)e2e__cluster_lag_ms(&off); /* the scrape resets the worst lag */
    (void)e2e__cluster_lag_ms(&on);
    e2e__probe_reset();
    e2e__probe_window(1);
    /* A boundary while the writers still encode the last checkpoint
     * takes none: start each phase with them idle. */
    (void)wait_writers(&on);
    double c0 = cluster_metric_max(&on, copies_key);
    for (int r = 0; r < b->rounds; r++) {
        soff[r] = e2e__group_run(off.tr, 4, 0, nsteps);
        son[r] = e2e__group_run(on.tr, 4, 0, nsteps);
    }
    out->lag_off_ms = e2e__cluster_lag_ms(&off);
    out->lag_on_ms = e2e__cluster_lag_ms(&on);
    e2e__probe_window(0);
    out->probe = e2e__probe_get();
    (void)wait_writers(&on); /* the last boundary's copy counts when done */
    double c1 = cluster_metric_max(&on, copies_key);
    out->copies = c1 - c0;
    out->diff_ms_per_gib = diff_per_gib(son, soff, b->rounds, nsteps,
                                        out->copies);
    hold_counters(&on, v0);
    for (int r = 0; r < b->rounds; r++) {
        soff[r] = e2e__group_run(off.tr, 4, 4096, nsteps);
        son[r] = e2e__group_run(on.tr, 4, 4096, nsteps);
    }
    e2e__group_want_mean(0);
    (void)wait_writers(&on);
    hold_counters(&on, v1);
    hold_stall(out, v0, v1);
    out->copies_coll = cluster_metric_max(&on, copies_key) - c1;
    out->diff_coll_ms_per_gib = diff_per_gib(son, soff, b->rounds, nsteps,
                                             out->copies_coll);
    out->mem_off = cluster_private_bytes(&off) / MEM_STATE;
    out->mem_on = cluster_private_bytes(&on) / MEM_STATE;
    out->ar_ratio = e2e__median(ton, b->rounds) / e2e__median(toff, b->rounds);
    print_ckpt_counters(&on);
    e2e__cluster_down(&on);
    e2e__cluster_down(&off);
    e2e__kill_kids();
}

ms_str_t e2e__na(double v, int decimals)
{
    ms_str_t r;
    if (isnan(v))
        snprintf(r.s, sizeof(r.s), "na");
    else
        snprintf(r.s, sizeof(r.s), "%.*f", decimals, v);
    return r;
}

ms_str_t e2e__ms1(double v)
{
    return e2e__na(v, 1);
}

/* The '#' lines of e2e__run_mem: the stall per daemon and as
 * differences, and the loop lag of the empty steps beside the probe. */
void e2e__print_mem_notes(const mem_t *m)
{
    printf("# checkpoint stall from the daemons' clocks (steps with a 4 KiB "
           "allreduce, no compute; collectives held for the copy, per copy, "
           "per GiB of state):");
    for (int i = 0; i < MEM_NODES; i++)
        printf(" n%d %s ms (%.0f held, %.0f copies)", i,
               e2e__ms1(m->hold_ms_per_gib[i]).s, m->holds[i],
               m->hold_copies[i]);
    printf("; worst %s, best %s\n", e2e__ms1(m->stall_ms_per_gib).s,
           e2e__ms1(m->stall_min_ms_per_gib).s);
    printf("# checkpoint stall as step-time differences (median over the "
           "rounds, with checkpoints minus without, per copy, per GiB of "
           "state): empty steps %s ms (%.0f copied), with a 4 KiB "
           "allreduce %s ms (%.0f copied)\n", e2e__ms1(m->diff_ms_per_gib).s,
           m->copies, e2e__ms1(m->diff_coll_ms_per_gib).s, m->copies_coll);
    printf("# worst main-loop lag of a daemon in the empty steps: "
           "checkpoints off %.1f ms, on %.1f ms; the 1 ms wake-up probe in "
           "the same window: worst %.2f ms late, median %.2f ms\n",
           m->lag_off_ms, m->lag_on_ms, m->probe.max_ms, m->probe.p50_ms);
}

void e2e__run_mem_only(bench_t *b)
{
    e2e__probe_start();
    mem_t mem;
    e2e__run_mem(b, &mem);
    e2e__print_mem_notes(&mem);
    printf("e2e: mem_per_state=%.2f mem_per_state_ckpt=%.2f "
           "ar_ckpt_vs_none=%.3f ckpt_stall_ms_per_GiB=%s "
           "ckpt_stall_ms_per_GiB_min=%s ckpt_stall_diff_ms_per_GiB=%s "
           "ckpt_stall_coll_ms_per_GiB=%s\n",
           mem.mem_off, mem.mem_on, mem.ar_ratio,
           e2e__ms1(mem.stall_ms_per_gib).s,
           e2e__ms1(mem.stall_min_ms_per_gib).s,
           e2e__ms1(mem.diff_ms_per_gib).s,
           e2e__ms1(mem.diff_coll_ms_per_gib).s);
}
