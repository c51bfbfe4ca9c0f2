/*
 * e2e-coord.h - what bench/e2e's coordinator (e2e.c: its processes and
 * clusters, the busbw table, the loop lag) and its other rows share:
 * e2e-rows.c (steps, async, step latency), e2e-mem.c (memory and
 * checkpoint stalls) and e2e-vs-gloo.c (the Gloo launches, --vs-gloo).
 */
#ifndef RINGD_BENCH_E2E_COORD_H
#define RINGD_BENCH_E2E_COORD_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench/e2e.h"
#include "tests/dmn-util.h"
#include "tests/mb-fixture.h"

typedef struct {
    pid_t pid;
    FILE *to;
    int from;
} worker_t;

typedef struct {
    int full, quick, rounds, step_latency_only, async_only, mem_only;
    int vs_gloo;
    int vs_ring;
    size_t sizes[MAXSIZES];
    int nsizes;
    fx_etcd_t etcd;
    const char *self;
    char *tmp;
} bench_t;

static inline int iters_for(size_t bytes)
{
    size_t it = 256 * MiB / bytes;
    return it < 3 ? 3 : it > 64 ? 64 : (int)it;
}

static inline double busbw(size_t bytes, double us, int n)
{
    return (double)bytes / (us * 1000.0) * 2.0 * (n - 1) / n;
}

/* CPU seconds of nw processes over a run of iters x bytes, per process,
 * per GB that process reduced. */
static inline double cpu_per_gb(double cpu_s, int nw, size_t bytes,
                                int iters)
{
    return cpu_s / nw / ((double)bytes * iters / 1e9);
}

typedef struct {
    td_daemon_t d[MAXN];
    worker_t tr[MAXN * MAXT];
    int n, t;
    const char *flag; /* one more daemon flag, set before cluster_up */
} cluster_t;

/* Kill every process spawned so far. */
void e2e__kill_kids(void);
/* pid has been waited for: the exit handler must not kill it (nor a
 * reuse). */
void e2e__kid_forget(pid_t pid);
/* Start argv with w's pipes as its stdin and stdout, stderr to log. */
void e2e__worker_spawn(worker_t *w, char *const *argv, const char *log);
/* One line from w within the timeout; exits on EOF or timeout. */
void e2e__worker_line(worker_t *w, char *line, size_t cap);
/* Send "run" to every worker of a group; the slowest median, in us; ms:
 * each iteration sleeps that long first (a trainer "computing"). */
double e2e__group_run_ms(worker_t *w, int nw, size_t bytes, int iters,
                         int ms);
double e2e__group_run(worker_t *w, int nw, size_t bytes, int iters);
/* on: the group runs answer the slowest mean instead of the median. */
void e2e__group_want_mean(int on);
/* The last group run's CPU seconds, all its workers. */
double e2e__group_cpu(void);
/* Send "quit" to every worker of a group and reap them. */
void e2e__group_quit(worker_t *w, int nw);
/* The CPU seconds of c's daemons, every thread. */
double e2e__cluster_cpu(const cluster_t *c);
/* n daemons of job `job`, t trainers each with a state of `state` bytes
 * and a buffer of `max`. */
void e2e__cluster_up(bench_t *b, cluster_t *c, const char *job, int n,
                     int t, size_t max, size_t state);
/* ckpt_dir non-NULL: checkpoints every CKPT_INTERVAL steps there. */
#define CKPT_INTERVAL "10"
void e2e__cluster_up_ckpt(bench_t *b, cluster_t *c, const char *job, int n,
                          int t, size_t max, size_t state,
                          const char *ckpt_dir);
void e2e__cluster_down(cluster_t *c);
/* n raw ring processes (tp + ring, no daemon) for buffers up to max,
 * their addresses exchanged in a directory named for job. */
void e2e__ring_group_up(bench_t *b, const char *job, int n, size_t max,
                        worker_t *rg);

/* The worst main-loop lag of any daemon of c since it started, in ms;
 * the scrape starts a new window. */
double e2e__cluster_lag_ms(const cluster_t *c);
/* The wake-up probe beside that lag (e2e.c): a thread that sleeps 1 ms
 * at a time and records how late it wakes while a window is open. Start
 * it once; reset forgets what it recorded; windows add up until then. */
typedef struct {
    double max_ms;  /* the worst lateness */
    double p50_ms;  /* the median (10 us bins) */
    uint64_t n;     /* wake-ups counted */
} probe_t;
void e2e__probe_start(void);
void e2e__probe_reset(void);
void e2e__probe_window(int open);
probe_t e2e__probe_get(void);

/* e2e-rows.c */
#define COMPUTE_MS 20

typedef struct {
    double overhead_ms[2];   /* [n=2, n=1]: a step with the state minus
                                one without */
    double cpu_ms_per_step;  /* daemon CPU while trainers compute */
} steps_t;

typedef struct {
    double one_us, many_us; /* medians over the rounds */
    double ratio;           /* median of one_us / many_us */
    /* Over the 64-piece runs, node 0's: the share of the pieces the
     * daemon fused by arrival, and its asks per run of 64. */
    double many_auto_share, many_asks;
    double many_fused_us, fused_one_ratio; /* the 64 in one group */
    double back_fused_us, back_one_ratio;  /* ... issued backwards */
    double small_async_us, small_block_us, small_fused_us;
    double small_ratio;     /* median of block / async */
    double fused_ratio;     /* median of block / fused */
} async_t;

void e2e__run_steps(bench_t *b, steps_t *out);
void e2e__run_async(bench_t *b, async_t *out);
void e2e__print_async(const async_t *a);
/* us[k]: at n = 2, 4, 8; also printed as a '#' line. */
void e2e__run_step_latency(bench_t *b, double us[3], double off_us[3]);


/* e2e-mem.c */
#define MEM_NODES 4

typedef struct {
    double mem_off, mem_on;  /* private memory / state, ckpt off and on */
    double ar_ratio;         /* allreduce time with checkpoints / without */
    /* The stall from the daemons' own clocks, in the steps with a 4 KiB
     * allreduce: the time their collectives were held for the checkpoint
     * copy (ringd_checkpoint_hold_seconds_total) per copy
     * (ringd_checkpoint_copies_total), per GiB of state; per daemon
     * (NAN: it copied none), the worst and the best of them. */
    double hold_ms_per_gib[MEM_NODES];
    double holds[MEM_NODES], hold_copies[MEM_NODES];
    double stall_ms_per_gib, stall_min_ms_per_gib;
    /* The same stall as differences of the step times with checkpoints
     * and without (medians over the rounds), over the copies: empty
     * steps (never held: what is left is contention) and steps with the
     * 4 KiB allreduce. Noise can take these below 0. */
    double diff_ms_per_gib, diff_coll_ms_per_gib;
    double copies, copies_coll;   /* checkpoints copied in those phases */
    double lag_off_ms, lag_on_ms; /* worst loop lag in the empty steps */
    probe_t probe;                /* the wake-up probe's, same window */
} mem_t;

/* A figure with its decimals, or "na" (NaN) where nothing measured it: a
 * stall with no checkpoint copied, a Gloo ratio where Gloo did not run. */
typedef struct { char s[24]; } ms_str_t;

ms_str_t e2e__na(double v, int decimals);
ms_str_t e2e__ms1(double v); /* e2e__na(v, 1) */
void e2e__run_mem(bench_t *b, mem_t *out);
/* Its '#' lines: the stall per daemon and as differences, the lag. */
void e2e__print_mem_notes(const mem_t *m);
/* --mem-only: e2e__run_mem with the wake-up probe, its '#' lines and
 * its e2e: line. */
void e2e__run_mem_only(bench_t *b);

/* e2e-vs-gloo.c */
#define NGLOO 3 /* ring, chunked, new */

typedef struct {
    double us[MAXSIZES], cpu[MAXSIZES]; /* 0: Gloo not built */
    const char *algo[MAXSIZES];
    double var_us[NGLOO][MAXSIZES], var_cpu[NGLOO][MAXSIZES];
} gloo_t;

/* Every Gloo ring variant at n; per size the best (the fastest, its CPU
 * per GB beside it). */
void e2e__run_gloo(bench_t *b, int n, int iters, gloo_t *g);
/* Dies naming what is missing when bench/e2e-gloo was not built: the
 * full run's ratios need the peer (checked before anything runs). */
void e2e__need_gloo(void);
/* --vs-gloo: the whole run, its table and its e2e: line. */
int e2e__run_vs_gloo(bench_t *b);

#endif
