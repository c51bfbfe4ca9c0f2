/*
 * e2e-coord.h - what bench/e2e's coordinator (e2e.c: its processes and
 * clusters, the busbw tables) and its other rows (e2e-rows.c) share.
 */
#ifndef RINGD_BENCH_E2E_COORD_H
#define RINGD_BENCH_E2E_COORD_H

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

typedef struct {
    td_daemon_t d[MAXN];
    worker_t tr[MAXN * MAXT];
    int n, t;
} cluster_t;

/* Kill every process spawned so far. */
void e2e__kill_kids(void);
/* One line from w within the timeout; exits on EOF or timeout. */
void e2e__worker_line(worker_t *w, char *line, size_t cap);
/* Send "run" to every worker of a group; the slowest median, in us; ms:
 * each iteration sleeps that long first (a trainer "computing"). */
double e2e__group_run_ms(worker_t *w, int nw, size_t bytes, int iters,
                         int ms);
double e2e__group_run(worker_t *w, int nw, size_t bytes, int iters);
/* The CPU seconds of c's daemons, every thread. */
double e2e__cluster_cpu(const cluster_t *c);
/* n daemons of job `job`, t trainers each with a state of `state` bytes
 * and a buffer of `max`. */
void e2e__cluster_up(bench_t *b, cluster_t *c, const char *job, int n,
                     int t, size_t max, size_t state);
void e2e__cluster_down(cluster_t *c);

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
    double many_fused_us, fused_one_ratio; /* the 64 in one group */
    double small_async_us, small_block_us, small_fused_us;
    double small_ratio;     /* median of block / async */
    double fused_ratio;     /* median of block / fused */
} async_t;

void e2e__run_steps(bench_t *b, steps_t *out);
void e2e__run_async(bench_t *b, async_t *out);
void e2e__print_async(const async_t *a);
/* us[k]: at n = 2, 4, 8; also printed as a '#' line. */
void e2e__run_step_latency(bench_t *b, double us[3]);

#endif
