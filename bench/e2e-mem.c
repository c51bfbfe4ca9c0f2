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
 * A checkpoint's stall per GiB of state as the trainer sees it: the
 * phases' mean step times on minus off, over the checkpoints the on job
 * copied in the phase per round (a boundary that finds the writers still
 * busy takes none), scaled from MEM_STATE.
 */
static double stall_per_gib(double *son, double *soff,
                            int rounds, int nsteps, double copies)
{
    if (copies <= 0)
        return NAN; /* printed as "na": no checkpoint to measure */
    double ms = (e2e__median(son, rounds) - e2e__median(soff, rounds)) *
                nsteps / (copies / rounds) / 1e3;
    return ms * (1024.0 * MiB) / MEM_STATE;
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
     * checkpoint boundaries' stalls as the trainer sees them. A step
     * without a collective is never held for the copy (daemon/README.md,
     * "Checkpoints"), so the second phase's steps each run one 4 KiB
     * allreduce and no compute: the worst case, nothing to overlap the
     * copy with. */
    double soff[MAXROUNDS], son[MAXROUNDS];
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
    out->stall_ms_per_gib = stall_per_gib(son, soff, b->rounds, nsteps,
                                          out->copies);
    for (int r = 0; r < b->rounds; r++) {
        soff[r] = e2e__group_run(off.tr, 4, 4096, nsteps);
        son[r] = e2e__group_run(on.tr, 4, 4096, nsteps);
    }
    e2e__group_want_mean(0);
    (void)wait_writers(&on);
    out->copies_coll = cluster_metric_max(&on, copies_key) - c1;
    out->stall_coll_ms_per_gib = stall_per_gib(son, soff, b->rounds, nsteps,
                                               out->copies_coll);
    out->mem_off = cluster_private_bytes(&off) / MEM_STATE;
    out->mem_on = cluster_private_bytes(&on) / MEM_STATE;
    out->ar_ratio = e2e__median(ton, b->rounds) / e2e__median(toff, b->rounds);
    print_ckpt_counters(&on);
    e2e__cluster_down(&on);
    e2e__cluster_down(&off);
    e2e__kill_kids();
}

ms_str_t e2e__ms1(double v)
{
    ms_str_t r;
    if (isnan(v))
        snprintf(r.s, sizeof(r.s), "na");
    else
        snprintf(r.s, sizeof(r.s), "%.1f", v);
    return r;
}

void e2e__run_mem_only(bench_t *b)
{
    e2e__probe_start();
    mem_t mem;
    e2e__run_mem(b, &mem);
    printf("# worst main-loop lag of a daemon in the empty steps: "
           "checkpoints off %.1f ms, on %.1f ms; the 1 ms wake-up probe in "
           "the same window: worst %.2f ms late, median %.2f ms\n",
           mem.lag_off_ms, mem.lag_on_ms, mem.probe.max_ms,
           mem.probe.p50_ms);
    printf("# checkpoints copied: %.0f in the empty steps, %.0f in the "
           "steps with a 4 KiB allreduce (per job, all rounds)\n",
           mem.copies, mem.copies_coll);
    printf("e2e: mem_per_state=%.2f mem_per_state_ckpt=%.2f "
           "ar_ckpt_vs_none=%.3f ckpt_stall_ms_per_GiB=%s "
           "ckpt_stall_coll_ms_per_GiB=%s\n",
           mem.mem_off, mem.mem_on, mem.ar_ratio,
           e2e__ms1(mem.stall_ms_per_gib).s,
           e2e__ms1(mem.stall_coll_ms_per_gib).s);
}
