/*
 * e2e.c - the product path against its own ring and against Gloo.
 *
 *   e2e              the default run (a few minutes): 1, 16, 64 MiB
 *   e2e --full       1, 4, 16, 64, 256 MiB and more rounds
 *   e2e --quick      1 and 16 MiB, one round (a smoke test)
 *   e2e --rounds R   rounds per configuration
 *   e2e --async-only only the asynchronous row (a smoke test of it)
 *   e2e --mem-only   only the memory and checkpoint figures
 *   e2e --vs-gloo    only the raw ring against Gloo (below; --quick: 64
 *                    MiB, one round)
 *   e2e --vs-ring    only the product path against its own ring (the
 *                    table without Gloo's columns, and the line's
 *                    e2e_vs_ring_min and e2e2_vs_ring_min)
 *
 * One real etcd on loopback; for n in {2, 4} nodes and t in {1, 2}
 * trainers per node: n real ringd daemons (--etcd, one job each), n*t
 * trainer processes (this binary, --trainer) and n raw ring processes
 * (this binary, --ring: tp + ring_create, no daemon), everything over
 * UCX tcp on lo. Each round runs every size on the product path, then the
 * same size on the raw ring, interleaved, so both see the same machine.
 *
 * A trainer times ringd_allreduce() of an f32 AVG tensor (step_begin and
 * step_end around it, outside the timed part); a ring process times
 * ring_allreduce() of the same count with the daemon's default ring
 * options. Each process reports the median of its iterations; a run's
 * time is that of the slowest process; a row holds the median over the
 * rounds. busbw = bytes / time * 2(n-1)/n (n = nodes: the cross-node ring
 * carries the same bytes for 1 or 2 trainers). ratio = the median of the
 * per-round e2e/ring ratios. cpu_s_per_GB: the daemons' CPU time (every
 * thread, /proc/PID/task/TID/schedstat) over the product runs, per daemon,
 * per GB reduced by that node (bytes * iterations).
 *
 * Gloo (build/bench/e2e-gloo, when libgloo-dev was there at build time):
 * per n, one launch of n processes per ring variant (AllreduceRing,
 * AllreduceRingChunked, gloo::allreduce RING) over all sizes; the column
 * is the best variant per size (its name beside it).
 *
 * Columns (TSV):
 *   n t bytes e2e_busbw ring_busbw ratio cpu_s_per_GB gloo_busbw gloo_algo
 *   ring_vs_gloo e2e_vs_gloo ring_cpu_s_per_GB gloo_cpu_s_per_GB
 * The last two are the raw ring's and the best Gloo variant's CPU per GB:
 * each rank's process CPU time (every thread: UCX's and Gloo's transport
 * threads too; CLOCK_PROCESS_CPUTIME_ID over the timed iterations, the
 * warm-up left out), summed, per rank, per GB reduced (bytes * iterations),
 * as cpu_s_per_GB is for the daemons. On a CPU-bound machine this is the
 * figure that compares the two implementations; busbw is the machine's.
 *
 * --vs-gloo: n = 2 and 4, 16 and 64 MiB, 5 rounds (--rounds R); per round
 * every size on the raw ring (its processes stay up), then one launch per
 * Gloo variant. Per size a row
 *   n bytes ring_busbw ring_cpu_s_per_GB gloo_busbw gloo_cpu_s_per_GB
 *   gloo_algo ring_vs_gloo ring_cpu_over_gloo
 * against each round's fastest variant (gloo_algo: the one fastest most
 * often; the ratios are medians of the per-round ratios, the rest medians
 * over the rounds), '#' lines with every variant's medians, and last
 *   e2e: ring_vs_gloo_n2=... ring_vs_gloo_n4=... ring_cpu_over_gloo_n2=...
 *        ring_cpu_over_gloo_n4=... (64 MiB; busbw ratio above 1 and CPU
 *        ratio below 1 favour the ring)
 * The ring runs f32 AVG (the daemon's), Gloo f32 sum.
 * Then, in fresh jobs, the per-step latency of a 4 KiB allreduce (one
 * trainer per node timing step_begin + allreduce + step_end, the slowest
 * trainer's median) at n = 2, 4, 8 ('e2e --step-latency' runs only
 * that: the trainer counts travel only when they change, so it no longer
 * pays an allgather of N-1 hops per step; it does pay the commit round's
 * N-1 hops, and a second job with --step-commit=false runs interleaved
 * for what they cost: step_us_4k_nN_nocommit), the per-step cost of a 1 GiB
 * state region (a trainer doing only step_begin/step_end, with and
 * without the state, at n = 2 and in a one-node job) and the daemons'
 * CPU per step while their trainers compute (sleep 20 ms, then a 1 MiB
 * allreduce), as '#' lines,
 * and a last line
 *   e2e: e2e_vs_ring_min=... (tensors >= 16 MiB, one trainer per node)
 *        e2e2_vs_ring_min=... (two trainers per node) ring_vs_gloo_n2=...
 *        ring_vs_gloo_n4=... e2e_vs_gloo_n4=... (64 MiB, one trainer)
 *        step_overhead_ms_1GiB=... (n = 2) step_overhead_ms_1GiB_n1=...
 *        daemon_cpu_ms_per_step=... loop_lag_max_ms=... (the worst
 *        main-loop lag of any daemon through the allreduce runs: the
 *        lateness of the daemon's 10 ms loop timer,
 *        ringd_loop_lag_max_seconds, scraped before and after each
 *        configuration; the largest size is 256 MiB with --full; it
 *        includes up to about 1 ms of libuv's millisecond timer
 *        rounding and any time the daemon was not scheduled)
 *        probe_lag_max_ms=... probe_lag_p50_ms=... (the wake-up probe:
 *        a thread of this coordinator that sleeps 1 ms at a time over
 *        the same windows and nothing else; its worst and median
 *        lateness. The machine's scheduling delay, which the daemons'
 *        loops suffer too: a loop_lag_max_ms near probe_lag_max_ms is
 *        the VM's, not the loop's) mem_per_state=...
 *        mem_per_state_ckpt=... (the daemons' largest RssAnon over the
 *        state size, n = 4, 256 MiB state, checkpoints off / every 10
 *        steps) ar_ckpt_vs_none=...
 *        (64 MiB allreduce time with checkpoints over without)
 *        ckpt_stall_ms_per_GiB=... (from the daemons' own clocks, in
 *        steps of one 4 KiB allreduce and no compute, the worst case:
 *        the time a completed collective was held until the checkpoint
 *        copy of the boundary's shards was done, the only wait
 *        checkpoints put on a step, ringd_checkpoint_hold_seconds_total
 *        over ringd_checkpoint_copies_total, per daemon, scaled from
 *        the 256 MiB state to 1 GiB of state; the worst daemon, and
 *        ckpt_stall_ms_per_GiB_min=... the best: durations summed,
 *        never below 0; "na" when no checkpoint was copied)
 *        ckpt_stall_diff_ms_per_GiB=... (secondary: an empty step's
 *        mean time with a checkpoint every 10 steps minus without, the
 *        median over the rounds, times the steps, over the checkpoints
 *        copied, scaled the same way; empty steps are never held, so
 *        this is the copy's and the encoders' contention, and noise
 *        can take it below 0) ckpt_stall_coll_ms_per_GiB=... (the same
 *        difference in the steps with a 4 KiB allreduce: the hold as
 *        the trainers see it, plus that contention)
 *        async_vs_one=... (n = 2, one
 *        trainer per node: the busbw of 64 MiB reduced as 64
 *        asynchronous allreduces of 1 MiB, all outstanding at once, over
 *        that of one blocking allreduce of 64 MiB; the median of the
 *        per-round ratios, both run in each round; the daemons fuse
 *        those queued behind the running one by arrival, ring-fuse-kib,
 *        and a '#' line says how many they fused and asked about)
 *        async_fused_vs_one=... (the same 64 in one fusion group:
 *        slices of one buffer end to end, which the daemon runs in the
 *        buffer) async_fused_pieces_vs_one=... (the same group issued
 *        last slice first: not end to end, so the ring addresses its
 *        chunks in the pieces, packing a chunk that crosses two)
 *        async_small_vs_blocking=... (128 allreduces of 8 KiB: the time
 *        of the blocking ones one after the other over the time of the
 *        asynchronous ones) fused_small_vs_blocking=... (the same
 *        over the time of the 128 in one fusion group)
 *   with the other keys as "na" until they are measured here.
 *
 * This file is the coordinator (its processes and clusters, the busbw
 * table, the loop lag, the command line); e2e-rows.c, e2e-mem.c and
 * e2e-vs-gloo.c hold the other rows, e2e-worker.c the measured processes.
 */
#include <errno.h>
#include <dirent.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench/e2e-coord.h"
#include "common/clock.h"
#include "common/status.h"
#include "include/ringd.h"
#include "ring/ring.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/mb-fixture.h"
#include "transport/tp.h"


/* ---- the coordinator -------------------------------------------------- */

static pid_t kids[64];
static int nkids;
static char *tmp_dir; /* removed at exit, also after e2e__die() */

void e2e__kill_kids(void)
{
    for (int i = 0; i < nkids; i++)
        th_kill(kids[i]);
    nkids = 0;
}

void e2e__kid_forget(pid_t pid)
{
    for (int i = 0; i < nkids; i++)
        if (kids[i] == pid) {
            kids[i] = kids[--nkids];
            return;
        }
}

static void at_exit(void)
{
    e2e__kill_kids();
    if (tmp_dir != NULL)
        th_rmtree(tmp_dir);
    free(tmp_dir);
    tmp_dir = NULL;
}

void e2e__worker_spawn(worker_t *w, char *const *argv, const char *log)
{
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0)
        e2e__die("pipe", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        e2e__die("fork", strerror(errno));
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        FILE *l = fopen(log, "a");
        if (l != NULL)
            dup2(fileno(l), 2);
        close(in[1]);
        close(out[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    w->pid = pid;
    w->to = fdopen(in[1], "w");
    w->from = out[0];
    if (nkids < 64)
        kids[nkids++] = pid;
}

void e2e__worker_line(worker_t *w, char *line, size_t cap)
{
    size_t len = 0;
    int64_t deadline = (int64_t)rd_now_ns() + (int64_t)CMD_TIMEOUT_MS * 1000000;
    while (len + 1 < cap) {
        int left = (int)((deadline - (int64_t)rd_now_ns()) / 1000000);
        struct pollfd p = {w->from, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            e2e__die("worker", "no answer in time (see the logs)");
        ssize_t n = read(w->from, line + len, 1);
        if (n <= 0)
            e2e__die("worker", "exited (see the logs)");
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
}

static int want_mean; /* group_run answers the slowest mean instead */
static double group_cpu_s; /* the last group run's CPU, all workers */

void e2e__group_want_mean(int on)
{
    want_mean = on;
}

double e2e__group_cpu(void)
{
    return group_cpu_s;
}

double e2e__group_run_ms(worker_t *w, int nw, size_t bytes, int iters,
                         int ms)
{
    for (int i = 0; i < nw; i++) {
        fprintf(w[i].to, "run %zu %d %d\n", bytes, iters, ms);
        fflush(w[i].to);
    }
    double worst = 0;
    group_cpu_s = 0;
    for (int i = 0; i < nw; i++) {
        char line[256];
        double us, mean, cpu;
        e2e__worker_line(&w[i], line, sizeof(line));
        if (sscanf(line, "ok %lf %lf %lf", &us, &mean, &cpu) != 3)
            e2e__die("worker run", line);
        group_cpu_s += cpu;
        if (want_mean)
            us = mean;
        if (us > worst)
            worst = us;
    }
    return worst;
}

double e2e__group_run(worker_t *w, int nw, size_t bytes, int iters)
{
    return e2e__group_run_ms(w, nw, bytes, iters, 0);
}

void e2e__group_quit(worker_t *w, int nw)
{
    for (int i = 0; i < nw; i++) {
        fprintf(w[i].to, "quit\n");
        fclose(w[i].to);
    }
    for (int i = 0; i < nw; i++) {
        int st;
        if (th_wait(w[i].pid, 30000, &st) != 0)
            th_kill(w[i].pid);
        close(w[i].from);
    }
}

/* CPU time of every thread of pid, in seconds (schedstat: ns). */
static double cpu_seconds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    double s = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[320];
        snprintf(p, sizeof(p), "/proc/%d/task/%s/schedstat", (int)pid,
                 e->d_name);
        FILE *f = fopen(p, "r");
        unsigned long long ns;
        if (f != NULL && fscanf(f, "%llu", &ns) == 1)
            s += (double)ns / 1e9;
        if (f != NULL)
            fclose(f);
    }
    if (d != NULL)
        closedir(d);
    return s;
}

typedef struct {
    double e2e_us, ring_us, ratio, cpu_per_gb;
    double ring_cpu_per_gb; /* the ring processes', timed iterations */
} row_t;

double e2e__cluster_cpu(const cluster_t *c)
{
    double s = 0;
    for (int i = 0; i < c->n; i++)
        s += cpu_seconds(c->d[i].pid);
    return s;
}

void e2e__cluster_up(bench_t *b, cluster_t *c, const char *job, int n,
                     int t, size_t max, size_t state)
{
    e2e__cluster_up_ckpt(b, c, job, n, t, max, state, NULL);
}

void e2e__cluster_up_ckpt(bench_t *b, cluster_t *c, const char *job, int n,
                          int t, size_t max, size_t state,
                          const char *ckpt_dir)
{
    char tstr[8], nstr[8], maxb[32], stb[32];
    c->n = n;
    c->t = t;
    snprintf(tstr, sizeof(tstr), "%d", t);
    snprintf(nstr, sizeof(nstr), "%d", n);
    snprintf(maxb, sizeof(maxb), "%zu", max);
    snprintf(stb, sizeof(stb), "%zu", state);
    for (int i = 0; i < n; i++) {
        char name[48];
        static char ids[MAXN][16];
        snprintf(name, sizeof(name), "e2e-n%d", i);
        snprintf(ids[i], sizeof(ids[i]), "n%d", i);
        td_init(&c->d[i], name);
        c->d[i].networked = 1;
        const char *flags[] = {"--etcd", b->etcd.url, "--job", job,
                               "--node-id", ids[i], "--trainers", tstr,
                               "--min-nodes", nstr, NULL, NULL, NULL, NULL,
                               NULL, NULL};
        int k = 10;
        if (ckpt_dir != NULL) {
            flags[k++] = "--ckpt-dir";
            flags[k++] = ckpt_dir;
            flags[k++] = "--ckpt-interval";
            flags[k++] = CKPT_INTERVAL;
        }
        flags[k] = c->flag;
        if (td_start(&c->d[i], flags) != 0)
            e2e__die("daemon", "did not start (log above)");
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < t; k++) {
            char *argv[] = {(char *)b->self, "--trainer", c->d[i].sock, maxb,
                            stb, NULL};
            char lg[16];
            snprintf(lg, sizeof(lg), "t%d.log", k);
            e2e__worker_spawn(&c->tr[i * t + k], argv,
                              td_path(&c->d[i], lg));
        }
}

double e2e__cluster_lag_ms(const cluster_t *c)
{
    double worst = 0;
    for (int i = 0; i < c->n; i++) {
        char *m = td_http_get(c->d[i].metrics_port, "/metrics");
        const char *key = "\nringd_loop_lag_max_seconds ";
        const char *p = m != NULL ? strstr(m, key) : NULL;
        double v = p != NULL ? strtod(p + strlen(key), NULL) * 1e3 : -1;
        if (v > worst)
            worst = v;
        free(m);
    }
    return worst;
}

static double lag_max_ms; /* over the allreduce configurations */
static probe_t lag_probe;  /* the wake-up probe over the same windows */

/*
 * The wake-up probe beside the daemons' loop lag: a thread of this
 * (otherwise idle) coordinator that sleeps 1 ms at a time, all signals
 * blocked, and records how late each wake-up is while a window is open,
 * in 10 us bins up to 100 ms (the last bin holds everything later). What
 * it sees is the machine's (the VM's, the scheduler's) delay in running a
 * thread that asked to run, which a daemon's loop suffers as well without
 * anything of its own blocking it. Its cost, measured on the 2-core
 * development VM: about 830 wake-ups a second (1 ms and the lateness),
 * 73 us of CPU each in the kernel's timer and wake-up path, 6% of one
 * core, which the measured processes lose; the 10 ms thread it replaced
 * cost a tenth of that but sampled a tenth as often.
 */
#define PROBE_PERIOD_NS 1000000
#define PROBE_BIN_NS 10000
#define PROBE_BINS 10000

static struct {
    pthread_mutex_t mu;
    int open;              /* a window is open: wake-ups count */
    uint64_t n;
    uint64_t max_ns;
    uint32_t bins[PROBE_BINS];
} probe = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *probe_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* no EINTR: whole sleeps */
    for (;;) {
        uint64_t due = rd_now_ns() + PROBE_PERIOD_NS;
        struct timespec ts = {0, PROBE_PERIOD_NS};
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
            ;
        uint64_t now = rd_now_ns(), late = now > due ? now - due : 0;
        uint64_t bin = late / PROBE_BIN_NS;
        pthread_mutex_lock(&probe.mu);
        if (probe.open) {
            probe.n++;
            probe.bins[bin < PROBE_BINS ? bin : PROBE_BINS - 1]++;
            if (late > probe.max_ns)
                probe.max_ns = late;
        }
        pthread_mutex_unlock(&probe.mu);
    }
    return NULL;
}

void e2e__probe_start(void)
{
    static int started;
    pthread_t th;
    if (!started && pthread_create(&th, NULL, probe_main, NULL) == 0) {
        pthread_detach(th);
        started = 1;
    }
}

void e2e__probe_reset(void)
{
    pthread_mutex_lock(&probe.mu);
    probe.n = 0;
    probe.max_ns = 0;
    memset(probe.bins, 0, sizeof(probe.bins));
    pthread_mutex_unlock(&probe.mu);
}

void e2e__probe_window(int open)
{
    pthread_mutex_lock(&probe.mu);
    probe.open = open;
    pthread_mutex_unlock(&probe.mu);
}

probe_t e2e__probe_get(void)
{
    probe_t r = {0, 0, 0};
    pthread_mutex_lock(&probe.mu);
    r.n = probe.n;
    r.max_ms = (double)probe.max_ns / 1e6;
    uint64_t seen = 0;
    for (int i = 0; i < PROBE_BINS && probe.n > 0; i++) {
        seen += probe.bins[i];
        if (2 * seen >= probe.n) { /* the bin's middle */
            r.p50_ms = ((double)i + 0.5) * PROBE_BIN_NS / 1e6;
            break;
        }
    }
    pthread_mutex_unlock(&probe.mu);
    return r;
}

void e2e__cluster_down(cluster_t *c)
{
    e2e__group_quit(c->tr, c->n * c->t);
    for (int i = 0; i < c->n; i++)
        if (td_stop(&c->d[i], 20000) != 0)
            fprintf(stderr, "e2e: daemon n%d did not drain cleanly\n", i);
}

void e2e__ring_group_up(bench_t *b, const char *job, int n, size_t max,
                        worker_t *rg)
{
    char nstr[8], ring_dir[512], maxb[32];
    snprintf(nstr, sizeof(nstr), "%d", n);
    snprintf(maxb, sizeof(maxb), "%zu", max);
    snprintf(ring_dir, sizeof(ring_dir), "%s/%s-ring", b->tmp, job);
    mkdir(ring_dir, 0700);
    for (int i = 0; i < n; i++) {
        char rk[12], lg[600];
        snprintf(rk, sizeof(rk), "%d", i);
        snprintf(lg, sizeof(lg), "%s/ring%d.log", ring_dir, i);
        char *argv[] = {(char *)b->self, "--ring", ring_dir, rk, nstr, maxb,
                        NULL};
        e2e__worker_spawn(&rg[i], argv, lg);
    }
}

/* n daemons, n*t trainers, n ring processes; every size, every round. */
static void run_config(bench_t *b, int n, int t, row_t *rows)
{
    cluster_t cl;
    worker_t rg[MAXN], *tr = cl.tr;
    td_daemon_t *d = cl.d;
    char job[32];
    size_t max = b->sizes[b->nsizes - 1];
    snprintf(job, sizeof(job), "e2e-n%d-t%d", n, t);
    cl.flag = NULL;
    e2e__cluster_up(b, &cl, job, n, t, max, 0);
    e2e__ring_group_up(b, job, n, max, rg);
    double e2e[MAXSIZES][MAXROUNDS], ring[MAXSIZES][MAXROUNDS];
    double ratio[MAXSIZES][MAXROUNDS], cpu[MAXSIZES][MAXROUNDS];
    double rcpu[MAXSIZES][MAXROUNDS];
    /* The job is formed after one collective; a scrape then starts the
     * daemons' lag window, so start-up is not counted. */
    e2e__group_run(tr, n * t, b->sizes[0], 1);
    (void)e2e__cluster_lag_ms(&cl);
    e2e__probe_window(1);
    for (int r = 0; r < b->rounds; r++)
        for (int s = 0; s < b->nsizes; s++) {
            size_t bytes = b->sizes[s];
            int it = iters_for(bytes);
            double c0 = 0, c1 = 0;
            for (int i = 0; i < n; i++)
                c0 += cpu_seconds(d[i].pid);
            e2e[s][r] = e2e__group_run(tr, n * t, bytes, it);
            for (int i = 0; i < n; i++)
                c1 += cpu_seconds(d[i].pid);
            ring[s][r] = e2e__group_run(rg, n, bytes, it);
            rcpu[s][r] = cpu_per_gb(group_cpu_s, n, bytes, it);
            ratio[s][r] = ring[s][r] / e2e[s][r];
            cpu[s][r] = (c1 - c0) / n / ((double)bytes * (it + 1) / 1e9);
        }
    for (int s = 0; s < b->nsizes; s++) {
        rows[s].e2e_us = e2e__median(e2e[s], b->rounds);
        rows[s].ring_us = e2e__median(ring[s], b->rounds);
        rows[s].ratio = e2e__median(ratio[s], b->rounds);
        rows[s].cpu_per_gb = e2e__median(cpu[s], b->rounds);
        rows[s].ring_cpu_per_gb = e2e__median(rcpu[s], b->rounds);
    }
    double lag = e2e__cluster_lag_ms(&cl);
    e2e__probe_window(0);
    if (lag > lag_max_ms)
        lag_max_ms = lag;
    e2e__group_quit(rg, n);
    e2e__cluster_down(&cl);
    e2e__kill_kids();
}


static void parse(bench_t *b, int argc, char **argv)
{
    b->rounds = -1; /* not given */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--full") == 0)
            b->full = 1;
        else if (strcmp(argv[i], "--quick") == 0)
            b->quick = 1;
        else if (strcmp(argv[i], "--step-latency") == 0)
            b->step_latency_only = 1;
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            b->rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--async-only") == 0)
            b->async_only = 1;
        else if (strcmp(argv[i], "--mem-only") == 0)
            b->mem_only = 1;
        else if (strcmp(argv[i], "--vs-gloo") == 0)
            b->vs_gloo = 1;
        else if (strcmp(argv[i], "--vs-ring") == 0)
            b->vs_ring = 1;
        else
            e2e__die("usage", "e2e [--full|--quick] [--step-latency] "
                              "[--async-only] [--mem-only] [--vs-gloo] "
                              "[--vs-ring] [--rounds R]");
    }
    if (b->rounds == -1)
        b->rounds = b->full || b->vs_gloo ? 5 : 3;
    if (b->quick)
        b->rounds = 1;
    if (b->rounds < 1 || b->rounds > MAXROUNDS)
        e2e__die("usage", "--rounds 1..16");
    static const size_t full[] = {1, 4, 16, 64, 256};
    static const size_t dflt[] = {1, 16, 64};
    const size_t *s = b->full ? full : dflt;
    b->nsizes = b->full ? 5 : b->quick ? 2 : 3;
    if (b->vs_gloo) {
        static const size_t vs[] = {16, 64};
        s = b->quick ? vs + 1 : vs;
        b->nsizes = b->quick ? 1 : 2;
    }
    for (int i = 0; i < b->nsizes; i++)
        b->sizes[i] = s[i] * MiB;
}

static void env_setup(void)
{
    /* Everything on loopback over tcp, in the daemon's error mode, so
     * the raw ring and the daemons use the same transport. */
    setenv("UCX_NET_DEVICES", "lo", 1);
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_TCP_CM_REUSEADDR", "y", 1);
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    setenv("RINGD_TP_ERR_MODE", "peer", 1);
    setenv("RINGD_LOG_LEVEL", "warn", 0);
}

static double min_ratio(row_t rows[2][2][MAXSIZES], const bench_t *b, int t)
{
    double m = 0;
    for (int ni = 0; ni < 2; ni++)
        for (int s = 0; s < b->nsizes; s++)
            if (b->sizes[s] >= 16 * MiB &&
                (m == 0 || rows[ni][t][s].ratio < m))
                m = rows[ni][t][s].ratio;
    return m;
}

/* A ratio or busbw with three decimals, "na" when not measured (NaN). */
static ms_str_t ratio3(double v)
{
    return e2e__na(v, 3);
}

/* The busbw table (TSV); rvg[ni]: ring over Gloo at 64 MiB, one trainer
 * per node, n = 2 and 4; *evg4_p: the product path over Gloo there, n = 4.
 */
static void print_table(const bench_t *b, row_t rows[2][2][MAXSIZES],
                        const gloo_t gloo[2], double rvg[2], double *evg4_p)
{
    printf("n\tt\tbytes\te2e_busbw\tring_busbw\tratio\tcpu_s_per_GB"
           "\tgloo_busbw\tgloo_algo\tring_vs_gloo\te2e_vs_gloo"
           "\tring_cpu_s_per_GB\tgloo_cpu_s_per_GB\n");
    for (int ni = 0; ni < 2; ni++)
        for (int t = 0; t < 2; t++)
            for (int s = 0; s < b->nsizes; s++) {
                int n = ni ? 4 : 2;
                row_t *r = &rows[ni][t][s];
                size_t by = b->sizes[s];
                const gloo_t *g = &gloo[ni];
                double gb = g->us[s] > 0 ? busbw(by, g->us[s], n) : 0;
                double rb = busbw(by, r->ring_us, n);
                double eb = busbw(by, r->e2e_us, n);
                /* Gloo's columns read "na" where it did not run
                 * (--quick has no 64 MiB, --vs-ring no Gloo): a ratio
                 * of 0 would read as a measurement. */
                printf("%d\t%d\t%zu\t%.3f\t%.3f\t%.3f\t%.3f\t%s\t%s"
                       "\t%s\t%s\t%.3f\t%s\n", n, t + 1, by, eb, rb,
                       r->ratio, r->cpu_per_gb, ratio3(gb > 0 ? gb : NAN).s,
                       gb > 0 && g->algo[s] != NULL ? g->algo[s] : "na",
                       ratio3(gb > 0 ? rb / gb : NAN).s,
                       ratio3(gb > 0 ? eb / gb : NAN).s, r->ring_cpu_per_gb,
                       ratio3(gb > 0 ? g->cpu[s] : NAN).s);
                if (by == 64 * MiB && t == 0 && gb > 0) {
                    rvg[ni] = rb / gb;
                    if (ni == 1)
                        *evg4_p = eb / gb;
                }
            }
}

/* The '#' lines of the rows that are not the table. */
static void print_notes(const steps_t *st, const mem_t *mem,
                        const async_t *as)
{
    printf("# step with a 1 GiB state minus one without: n=2 %.3f ms, "
           "one-node job %.3f ms\n", st->overhead_ms[0], st->overhead_ms[1]);
    printf("# daemon CPU per step while trainers compute %d ms "
           "(1 MiB allreduce, n=2): %.3f ms\n", COMPUTE_MS,
           st->cpu_ms_per_step);
    printf("# worst main-loop lag of a daemon during the allreduce runs: "
           "%.1f ms; the coordinator's 1 ms wake-up probe in the same "
           "windows: worst %.2f ms late, median %.2f ms (%llu wake-ups)\n",
           lag_max_ms, lag_probe.max_ms, lag_probe.p50_ms,
           (unsigned long long)lag_probe.n);
    printf("# daemon private memory (RssAnon) per state, n=4, 256 MiB "
           "state: checkpoints off %.2f, on %.2f; allreduce of 64 MiB "
           "with checkpoints / without: %.2f\n", mem->mem_off,
           mem->mem_on, mem->ar_ratio);
    e2e__print_mem_notes(mem);
    e2e__print_async(as);
}

/* The table's configurations and Gloo's, with the wake-up probe over the
 * daemons' lag windows (run_config opens and closes them). */
static void run_configs(bench_t *b, row_t rows[2][2][MAXSIZES],
                        gloo_t gloo[2])
{
    e2e__probe_start();
    e2e__probe_reset();
    for (int ni = 0; ni < 2; ni++) {
        int n = ni ? 4 : 2;
        run_config(b, n, 1, rows[ni][0]);
        /* Gloo gets as many iterations as the largest size's rounds. */
        e2e__run_gloo(b, n, iters_for(b->sizes[b->nsizes - 1]) * b->rounds,
                      &gloo[ni]);
        run_config(b, n, 2, rows[ni][1]);
    }
    lag_probe = e2e__probe_get();
}

/* --vs-ring: the product path and its own ring, interleaved as in the
 * default run, and nothing else (gloo[] stays empty: its columns 0). */
static int vs_ring(bench_t *b, row_t rows[2][2][MAXSIZES], gloo_t gloo[2])
{
    /* No wake-up probe: nothing here prints the lag, and its 1 ms
     * wake-ups would cost the runs being compared a share of a core. */
    for (int ni = 0; ni < 2; ni++)
        for (int t = 0; t < 2; t++)
            run_config(b, ni ? 4 : 2, t + 1, rows[ni][t]);
    double rvg[2] = {0, 0}, evg4 = 0;
    print_table(b, rows, gloo, rvg, &evg4);
    printf("e2e: e2e_vs_ring_min=%.3f e2e2_vs_ring_min=%.3f\n",
           min_ratio(rows, b, 0), min_ratio(rows, b, 1));
    fx_done();
    return 0;
}

static int coordinator(bench_t *b)
{
    row_t rows[2][2][MAXSIZES];
    static gloo_t gloo[2];
    b->tmp = tmp_dir = th_mkdtemp("ringd-e2e");
    if (b->tmp == NULL)
        e2e__die("temp dir", strerror(errno));
    if (b->vs_gloo)
        return e2e__run_vs_gloo(b);
    if (!b->async_only && !b->mem_only && !b->step_latency_only &&
        !b->vs_ring)
        e2e__need_gloo();
    fx_etcd_start(&b->etcd, 0);
    async_t as;
    if (b->async_only) {
        e2e__run_async(b, &as);
        e2e__print_async(&as);
        printf("e2e: async_vs_one=%.3f async_fused_vs_one=%.3f "
               "async_fused_pieces_vs_one=%.3f "
               "async_small_vs_blocking=%.2f fused_small_vs_blocking=%.2f\n",
               as.ratio, as.fused_one_ratio, as.back_one_ratio,
               as.small_ratio, as.fused_ratio);
        fx_done();
        return 0;
    }
    if (b->mem_only) {
        e2e__run_mem_only(b);
        fx_done();
        return 0;
    }
    if (b->vs_ring)
        return vs_ring(b, rows, gloo);
    double step_us[3], off_us[3];
    e2e__run_step_latency(b, step_us, off_us);
    if (b->step_latency_only) {
        printf("e2e: step_us_4k_n2=%.0f step_us_4k_n4=%.0f "
               "step_us_4k_n8=%.0f step_us_4k_n2_nocommit=%.0f "
               "step_us_4k_n4_nocommit=%.0f step_us_4k_n8_nocommit=%.0f\n",
               step_us[0], step_us[1], step_us[2], off_us[0], off_us[1],
               off_us[2]);
        fx_done();
        return 0;
    }
    run_configs(b, rows, gloo);
    steps_t st;
    e2e__run_steps(b, &st);
    mem_t mem;
    e2e__run_mem(b, &mem);
    e2e__run_async(b, &as);
    double rvg[2] = {NAN, NAN}, evg4 = NAN;
    print_table(b, rows, gloo, rvg, &evg4);
    print_notes(&st, &mem, &as);
    printf("e2e: e2e_vs_ring_min=%.3f e2e2_vs_ring_min=%.3f "
           "ring_vs_gloo_n2=%s ring_vs_gloo_n4=%s e2e_vs_gloo_n4=%s "
           "async_vs_one=%.3f async_fused_vs_one=%.3f "
           "async_fused_pieces_vs_one=%.3f "
           "async_small_vs_blocking=%.2f "
           "fused_small_vs_blocking=%.2f "
           "step_overhead_ms_1GiB=%.3f "
           "step_overhead_ms_1GiB_n1=%.3f daemon_cpu_ms_per_step=%.3f "
           "ckpt_stall_ms_per_GiB=%s ckpt_stall_ms_per_GiB_min=%s "
           "ckpt_stall_diff_ms_per_GiB=%s ckpt_stall_coll_ms_per_GiB=%s "
           "loop_lag_max_ms=%.1f probe_lag_max_ms=%.2f "
           "probe_lag_p50_ms=%.2f "
           "mem_per_state=%.2f mem_per_state_ckpt=%.2f "
           "ar_ckpt_vs_none=%.2f step_us_4k_n2=%.0f step_us_4k_n4=%.0f "
           "step_us_4k_n8=%.0f step_us_4k_n8_nocommit=%.0f\n",
           min_ratio(rows, b, 0), min_ratio(rows, b, 1), ratio3(rvg[0]).s,
           ratio3(rvg[1]).s, ratio3(evg4).s, as.ratio, as.fused_one_ratio,
           as.back_one_ratio,
           as.small_ratio,
           as.fused_ratio,
           st.overhead_ms[0], st.overhead_ms[1], st.cpu_ms_per_step,
           e2e__ms1(mem.stall_ms_per_gib).s,
           e2e__ms1(mem.stall_min_ms_per_gib).s,
           e2e__ms1(mem.diff_ms_per_gib).s,
           e2e__ms1(mem.diff_coll_ms_per_gib).s,
           lag_max_ms, lag_probe.max_ms, lag_probe.p50_ms,
           mem.mem_off, mem.mem_on,
           mem.ar_ratio, step_us[0], step_us[1], step_us[2], off_us[2]);
    fx_done();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--trainer") == 0)
        return e2e__trainer_main(argv[2], strtoull(argv[3], NULL, 10),
                            strtoull(argv[4], NULL, 10));
    if (argc == 6 && strcmp(argv[1], "--ring") == 0)
        return e2e__ring_main(argv[2], (uint32_t)atoi(argv[3]),
                         (uint32_t)atoi(argv[4]),
                         strtoull(argv[5], NULL, 10));
    bench_t b = {0};
    parse(&b, argc, argv);
    env_setup();
    signal(SIGPIPE, SIG_IGN);
    b.self = "/proc/self/exe";
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        b.self = self;
    }
    /* The daemon fixture finds ringd in the build root, above bench/. */
    static char root[4096];
    snprintf(root, sizeof(root), "%s", b.self);
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(root, '/');
        if (slash != NULL)
            *slash = '\0';
    }
    setenv("RINGD_BINDIR", root, 0);
    atexit(at_exit);
    return coordinator(&b);
}
