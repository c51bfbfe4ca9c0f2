/*
 * ringbench.c - allreduce bandwidth against the ring's own link limit.
 *
 *   ringbench                 the full run (about 2 minutes)
 *   ringbench --quick         fewer sizes, for a smoke test
 *   ringbench --grid [--quick] the flat ring against the grid (below)
 *   ringbench --options [--rounds R] [--sizes B,...] [--chunks B,...]
 *                             one ring or two and the chunk, by turns in
 *                             the same processes (below)
 *
 * For tls in {tcp, auto} and n in {2, 4} it starts n copies of itself on
 * loopback (addresses exchanged through a temp directory) and prints
 *
 *   tls n bytes usec algbw_GBps busbw_GBps link_GBps ratio
 *
 * usec is one f32 sum allreduce (median of the slowest rank); busbw =
 * algbw * 2(n-1)/n. link_GBps is ONE ceiling per tls and n, the same on
 * every row of that pass: the best of several streaming runs in the same
 * processes, spread over the pass (before, between and after the sizes),
 * in which every rank at once streams 64 MiB in 4 MiB messages to its ring
 * successor and receives as much from its predecessor, no reduction.
 * ratio = busbw / link. Neither the message size nor the ring's options
 * touch the ceiling, so a bad option cannot lower its own denominator.
 *
 * Every endpoint is opened in the daemon's error mode, PEER. "tcp" asks
 * UCX for tcp; "auto" leaves UCX_TLS unset, as a daemon does by default:
 * UCX would use shared memory on one host, but no shared-memory transport
 * has a peer failure handler in UCX 1.13, so it picks tcp. A '#' line per
 * pass names the ceiling and the transports UCX really chose (the lanes
 * of rank 0's endpoint to its successor).
 *
 * Then a sweep of options (chunk size, one ring, spin time) at tcp, n = 4,
 * 64 MiB as '#'-prefixed lines, each variant in fresh processes, against
 * the tcp n=4 ceiling of the table pass, and last:
 * tcp_n4_64MiB_ratio=<ratio> (default options).
 *
 * --grid: tcp, n in {4, 6, 9} (--quick: 4 and 6), sizes 4 KiB to 16 MiB
 * (--quick: 4 KiB and 1 MiB). In the same processes a flat ring and a
 * grid ring (grid_min_nodes 4, the default layout) take turns, a fresh
 * ring for each size; each row is
 *
 *   grid n bytes flat_usec grid_usec grid_over_flat
 *
 * (medians of the slowest rank, as above; below 1 the grid is faster).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "ring/ring.h"
#include "transport/tp.h"

#define MiB (1024 * 1024)

typedef struct {
    const char *dir, *tls;
    uint32_t rank, n;
    int quick, sweep;
    tp_t *tp;
    void **addrs;
    size_t *lens;
    FILE *out;
    uint64_t gen;
    uint64_t raw_seq;  /* sequence of the next streaming run's tags */
    double ceiling;    /* GB/s: the best streaming run (or given) */
    int nceil;         /* streaming runs behind the ceiling */
} bench_t;

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "ringbench: %s: %s\n", what, st_strerror(rc));
    exit(1);
}

static void exchange(bench_t *b)
{
    const void *a;
    size_t len;
    char tmp[4096], fin[4096];
    tp_address(b->tp, &a, &len);
    snprintf(tmp, sizeof tmp, "%s/addr.%u.tmp", b->dir, b->rank);
    snprintf(fin, sizeof fin, "%s/addr.%u", b->dir, b->rank);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(a, 1, len, f) != len || fclose(f) || rename(tmp, fin))
        die("write address", -errno);
    b->addrs = calloc(b->n, sizeof(void *));
    b->lens = calloc(b->n, sizeof(size_t));
    for (uint32_t r = 0; r < b->n; r++) {
        struct stat st;
        snprintf(fin, sizeof fin, "%s/addr.%u", b->dir, r);
        int64_t deadline = now_ns() + 30000000000LL;
        while (stat(fin, &st) != 0) {
            if (now_ns() > deadline)
                die("peer address", ST_ETIMEDOUT);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        b->addrs[r] = malloc((size_t)st.st_size);
        f = fopen(fin, "rb");
        if (!f || fread(b->addrs[r], 1, (size_t)st.st_size, f) !=
                      (size_t)st.st_size)
            die("read address", -EIO);
        fclose(f);
        b->lens[r] = (size_t)st.st_size;
    }
}

static ring_t *make_ring(bench_t *b, const ring_opts_t *o)
{
    ring_view_t v = {.generation = ++b->gen, .nranks = b->n,
                     .rank = b->rank,
                     .addrs = (const void *const *)b->addrs,
                     .addr_lens = b->lens};
    ring_t *r;
    int rc = ring_create(b->tp, &v, o, &r, NULL);
    if (rc != 0)
        die("ring_create", rc);
    if ((rc = ring_barrier(r)) != 0)
        die("barrier", rc);
    return r;
}

#define LINK_WINDOW 4

typedef struct {
    int done;
    size_t posted_s, posted_r, done_s, done_r;
} link_state_t;

static void link_send_cb(tp_req_t *req)
{
    ((link_state_t *)req->data)->done_s++;
}

static void link_recv_cb(tp_req_t *req)
{
    ((link_state_t *)req->data)->done_r++;
}

/*
 * All ranks at once: bytes to the right, bytes from the left, in chunks of
 * the ring's size with a window of LINK_WINDOW each way, progressed the way
 * the ring is (spin, then sleep on the efd): the ring minus the reduction.
 */
static double link_once(bench_t *b, tp_peer_t *right, void *sbuf,
                        void *rbuf, size_t bytes, size_t chunk, uint64_t tag)
{
    link_state_t ls = {0};
    tp_req_t rs[LINK_WINDOW], rr[LINK_WINDOW];
    size_t nmsg = (bytes + chunk - 1) / chunk;
    int64_t t0 = now_ns(), deadline = t0 + 20000000000LL, idle = 0;
    while (ls.done_s < nmsg || ls.done_r < nmsg) {
        int work = 0;
        while (ls.posted_r < nmsg && ls.posted_r < ls.done_r + LINK_WINDOW) {
            size_t off = ls.posted_r * chunk;
            size_t len = bytes - off < chunk ? bytes - off : chunk;
            tp_req_t *q = &rr[ls.posted_r % LINK_WINDOW];
            *q = (tp_req_t){.cb = link_recv_cb, .data = &ls};
            int rc = tp_recv(b->tp, (char *)rbuf + off, len,
                             tag + ls.posted_r, UINT64_MAX, NULL, q);
            if (rc != 0)
                die("link recv", rc);
            ls.posted_r++;
            work = 1;
        }
        while (ls.posted_s < nmsg && ls.posted_s < ls.done_s + LINK_WINDOW) {
            size_t off = ls.posted_s * chunk;
            size_t len = bytes - off < chunk ? bytes - off : chunk;
            tp_req_t *q = &rs[ls.posted_s % LINK_WINDOW];
            *q = (tp_req_t){.cb = link_send_cb, .data = &ls};
            int rc = tp_send(right, (char *)sbuf + off, len,
                             tag + ls.posted_s, NULL, q);
            if (rc != 0)
                die("link send", rc);
            ls.posted_s++;
            work = 1;
        }
        if (tp_progress(b->tp) || work) {
            idle = 0;
            continue;
        }
        int64_t now = now_ns();
        if (now > deadline)
            die("link transfer", ST_ETIMEDOUT);
        if (idle == 0)
            idle = now;
        else if (now - idle > 50000)
            tp_wait(b->tp, 100);
    }
    return (double)(now_ns() - t0);
}

static double agree_max(ring_t *r, double ns);

#define CEIL_BYTES (64 * MiB)
#define CEIL_MSG (4 * MiB)

/*
 * One streaming run (every rank to its successor at once, large messages);
 * the slowest rank's rate raises the ceiling if it beats it. The best run,
 * not a median: the ceiling is what the link can do on this machine, and
 * a run slowed by the other jobs on it says nothing about that.
 */
static void ceiling_run(bench_t *b, ring_t *r, tp_peer_t *right,
                        void *sbuf, void *rbuf)
{
    if (ring_barrier(r) != 0)
        die("barrier", ST_EABORTED);
    /* Tags on channel 3 ("raw") never meet the ring's. */
    uint64_t tag = tp_tag_make(b->gen, 3, ++b->raw_seq, 0);
    double ns = agree_max(r, link_once(b, right, sbuf, rbuf, CEIL_BYTES,
                                       CEIL_MSG, tag));
    double gbps = (double)CEIL_BYTES / ns;
    if (gbps > b->ceiling)
        b->ceiling = gbps;
    b->nceil++;
}

static int iters_for(size_t bytes)
{
    if (bytes >= 256 * MiB)
        return 3;
    if (bytes >= 16 * MiB)
        return 5;
    if (bytes >= MiB)
        return 15;
    return 41;
}

/* Mean ns per call of the slowest rank: an allreduce tells everyone. */
static double agree_max(ring_t *r, double ns)
{
    ring_allreduce_t a = {.buf = &ns, .count = 1, .dt = KERN_F64,
                          .op = KERN_MAX};
    int rc = ring_allreduce(r, &a);
    if (rc != 0)
        die("allreduce of timings", rc);
    return ns;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of the slowest rank's time for one allreduce of bytes. */
static double measure(ring_t *r, float *x, size_t bytes)
{
    int iters = iters_for(bytes);
    double ar[64];
    for (int i = -1; i < iters; i++) {
        if (ring_barrier(r) != 0)
            die("barrier", ST_EABORTED);
        int64_t t0 = now_ns();
        ring_allreduce_t s = {.buf = x, .count = bytes / 4, .dt = KERN_F32,
                              .op = KERN_SUM};
        int rc = ring_allreduce(r, &s);
        if (rc != 0)
            die("allreduce", rc);
        double a = agree_max(r, (double)(now_ns() - t0));
        if (i >= 0)
            ar[i] = a;
    }
    qsort(ar, (size_t)iters, sizeof(double), cmp_double);
    return ar[iters / 2];
}

static void row(bench_t *b, const char *prefix, size_t bytes, double ar_ns)
{
    double alg = (double)bytes / ar_ns;
    double bus = alg * 2.0 * (b->n - 1) / b->n;
    if (b->rank == 0)
        fprintf(b->out, "%s%s\t%u\t%zu\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\n",
                prefix, b->tls, b->n, bytes, ar_ns / 1000, alg, bus,
                b->ceiling, bus / b->ceiling);
}

/* The pass's '#' line: the ceiling and the transports UCX chose. */
static void ceiling_line(bench_t *b, tp_peer_t *right)
{
    char lanes[256];
    if (tp_peer_lanes(right, lanes, sizeof lanes) != 0)
        snprintf(lanes, sizeof lanes, "unknown");
    if (b->rank == 0)
        fprintf(b->out, "# ceiling %s n=%u link_GBps=%.3f: the best of %d "
                "streaming runs (%d MiB in %d MiB messages, every rank to "
                "its successor at once); lanes (what UCX chose, error "
                "mode PEER): %s\n", b->tls, b->n, b->ceiling, b->nceil,
                CEIL_BYTES / MiB, CEIL_MSG / MiB, lanes);
}

static void run_table(bench_t *b, tp_peer_t *right, float *x, void *rbuf)
{
    static const size_t full[] = {4096, 65536, MiB, 16 * MiB, 64 * MiB,
                                  256 * MiB};
    static const size_t quick[] = {4096, MiB, 64 * MiB};
    const size_t *sz = b->quick ? quick : full;
    int nsz = b->quick ? 3 : 6;
    ring_opts_t o;
    ring_opts_default(&o);
    ring_t *r = make_ring(b, &o);
    double ar[6];
    /* Streaming runs before, between and after the sizes: the ceiling
     * sees the machine at every point of the pass. */
    ceiling_run(b, r, right, x, rbuf);
    for (int i = 0; i < nsz; i++) {
        ceiling_run(b, r, right, x, rbuf);
        ar[i] = measure(r, x, sz[i]);
    }
    ceiling_run(b, r, right, x, rbuf);
    ceiling_line(b, right);
    for (int i = 0; i < nsz; i++)
        row(b, "", sz[i], ar[i]);
    /* Everyone is done with everything before anyone leaves. */
    if (ring_barrier(r) != 0)
        die("barrier", ST_EABORTED);
    ring_destroy(r);
}

/*
 * Option variant v (1..NVARIANTS) at 64 MiB, against the ceiling the table
 * pass measured (b->ceiling, given). Each variant runs in fresh processes.
 */
#define NVARIANTS 7
static void run_variant(bench_t *b, float *x)
{
    static const size_t chunks[] = {64 * 1024, 256 * 1024, MiB, 4 * MiB};
    /* Variants 5..7 change one thing from the default; 5: one ring (the
     * default runs 64 MiB on two, RING_BIDIR_AUTO). */
    size_t bytes = 64 * MiB;
    int v = b->sweep - 1;
    char label[128];
    ring_opts_t o;
    ring_opts_default(&o);
    if (v < 4)
        o.chunk_bytes = chunks[v];
    else if (v == 4)
        o.bidirectional = RING_BIDIR_OFF;
    else
        o.spin_us = v == 5 ? 0 : 1000;
    ring_t *r = make_ring(b, &o);
    double ar = measure(r, x, bytes);
    static const char *const bidir[] = {"off", "on", "auto"};
    snprintf(label, sizeof label, "# chunk=%zu bidir=%s spin_us=%d\t",
             o.chunk_bytes, bidir[o.bidirectional], o.spin_us);
    row(b, label, bytes, ar);
    if (ring_barrier(r) != 0)
        die("barrier", ST_EABORTED);
    ring_destroy(r);
}

/* One allreduce of bytes on a ring of its own with options o (a ring of
 * an older generation may not outlive the next one: its messages would
 * be dropped as stale). */
static double measure_with(bench_t *b, float *x, size_t bytes,
                           const ring_opts_t *o)
{
    ring_t *r = make_ring(b, o);
    double ns = measure(r, x, bytes);
    if (ring_barrier(r) != 0)
        die("barrier", ST_EABORTED);
    ring_destroy(r);
    return ns;
}

static double measure_on(bench_t *b, float *x, size_t bytes, uint32_t grid)
{
    ring_opts_t o;
    ring_opts_default(&o);
    o.grid_min_nodes = grid;
    return measure_with(b, x, bytes, &o);
}

/* --grid: a flat ring and a grid ring in the same processes, by turns. */
static void run_grid(bench_t *b, float *x)
{
    static const size_t full[] = {4096, 65536, MiB, 16 * MiB};
    static const size_t quick[] = {4096, MiB};
    const size_t *sz = b->quick ? quick : full;
    int nsz = b->quick ? 2 : 4;
    for (int i = 0; i < nsz; i++) {
        double f = measure_on(b, x, sz[i], 0);
        double g = measure_on(b, x, sz[i], 4);
        if (b->rank == 0)
            fprintf(b->out, "grid\t%u\t%zu\t%.0f\t%.0f\t%.3f\n", b->n,
                    sz[i], f / 1000, g / 1000, g / f);
    }
}

/*
 * --options: the ring's own choices, in the same processes and by turns
 * (a fresh ring for each run, as in --grid), rounds times: for each size,
 * each chunk on one ring and on two. Rank 0 prints each variant's median
 * over the rounds and its ratio to the first variant's median of the
 * same size (the first chunk, one ring; > 1: faster). Sizes and chunks
 * come from the launcher's --sizes and --chunks, through the environment
 * (RINGBENCH_SIZES, RINGBENCH_CHUNKS: comma-separated bytes).
 */
#define SWEEP_OPTIONS (-2) /* a pass's sweep argument: run_options */
#define MAX_LIST 8
#define MAX_ROUNDS 15
#define OPT_MAX_BYTES (256 * MiB)
#define OPT_SIZES "65536,1048576,16777216,67108864,268435456"
#define OPT_CHUNKS "1048576,4194304"

/* A list of up to MAX_LIST byte counts in [lo, hi]; its length, or -1. */
static int parse_list(const char *s, size_t lo, size_t hi, size_t *out)
{
    int n = 0;
    while (s != NULL && *s != '\0') {
        char *end;
        unsigned long long v = strtoull(s, &end, 0);
        if (end == s || n == MAX_LIST || v < lo || v > hi ||
            (*end != ',' && *end != '\0'))
            return -1;
        out[n++] = (size_t)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n > 0 ? n : -1;
}

static double options_run(bench_t *b, float *x, size_t bytes, size_t chunk,
                          int bidir)
{
    ring_opts_t o;
    ring_opts_default(&o);
    o.chunk_bytes = chunk;
    o.bidirectional = bidir ? RING_BIDIR_ON : RING_BIDIR_OFF;
    return measure_with(b, x, bytes, &o);
}

static void run_options(bench_t *b, float *x, int rounds)
{
    size_t sz[MAX_LIST], ch[MAX_LIST];
    int nsz = parse_list(getenv("RINGBENCH_SIZES"), 4, OPT_MAX_BYTES, sz);
    int nch = parse_list(getenv("RINGBENCH_CHUNKS"), 64, 1 << 30, ch);
    if (nsz < 0 || nch < 0)
        die("--options: sizes or chunks", ST_EINVAL);
    static double t[MAX_LIST][2 * MAX_LIST][MAX_ROUNDS];
    int nv = 2 * nch; /* variant v: chunk ch[v / 2], v % 2 rings + 1 */
    for (int k = 0; k < rounds; k++)
        for (int i = 0; i < nsz; i++)
            for (int v = 0; v < nv; v++)
                t[i][v][k] = options_run(b, x, sz[i], ch[v / 2], v % 2);
    for (int i = 0; b->rank == 0 && i < nsz; i++) {
        double med[2 * MAX_LIST];
        for (int v = 0; v < nv; v++) {
            qsort(t[i][v], (size_t)rounds, sizeof(double), cmp_double);
            med[v] = t[i][v][rounds / 2];
        }
        for (int v = 0; v < nv; v++) {
            double bus = (double)sz[i] / med[v] * 2.0 * (b->n - 1) / b->n;
            fprintf(b->out, "opts\t%u\t%zu\t%zu\t%d\t%.0f\t%.3f\t%.3f\n",
                    b->n, sz[i], ch[v / 2], v % 2, med[v] / 1000, bus,
                    med[0] / med[v]);
        }
    }
}

static int worker(bench_t *b)
{
    int rc = tp_create(NULL, &b->tp);
    if (rc != 0)
        die("tp_create", rc);
    exchange(b);
    /* The streaming runs' endpoint: one way only, which UCX pairs with
     * the successor's next endpoint to us (see ring_grid.c), so not in a
     * --grid pass, whose rings come and go. */
    tp_peer_t *right = NULL;
    uint32_t rr = (b->rank + 1) % b->n;
    if (b->sweep >= 0 &&
        (rc = tp_peer_connect(b->tp, b->addrs[rr], b->lens[rr], NULL, NULL,
                              &right)) != 0)
        die("connect", rc);
    size_t max = b->sweep == SWEEP_OPTIONS ? OPT_MAX_BYTES
                 : b->quick || b->sweep ? 64 * MiB : 256 * MiB;
    float *x = calloc(max / 4, 4);
    void *rbuf = calloc(max, 1);
    if (!x || !rbuf)
        die("allocate", ST_ENOMEM);
    if (b->rank == 0) {
        char path[4096];
        snprintf(path, sizeof path, "%s/rows", b->dir);
        b->out = fopen(path, "w");
    }
    if (b->sweep == SWEEP_OPTIONS)
        run_options(b, x, b->quick);
    else if (b->sweep < 0)
        run_grid(b, x);
    else if (b->sweep)
        run_variant(b, x);
    else
        run_table(b, right, x, rbuf);
    if (b->out)
        fclose(b->out);
    tp_peer_close(right, 0);
    tp_destroy(b->tp);
    return 0;
}

/* ---- launcher --------------------------------------------------------- */

static char *slurp_rows(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/rows", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void rmdir_all(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "ringbench: could not remove %s\n", dir);
}

/*
 * Run one pass with n processes; returns its rows (caller frees). A sweep
 * pass is given the ceiling (GB/s) its rows are divided by.
 */
static char *pass(const char *self, const char *tls, int n, int quick,
                  int sweep, double ceiling)
{
    char dir[] = "/tmp/ringbench.XXXXXX";
    if (!mkdtemp(dir))
        return NULL;
    setenv("UCX_NET_DEVICES", "lo", 1);
    if (strcmp(tls, "tcp") == 0)
        setenv("UCX_TLS", "tcp", 1);
    else
        unsetenv("UCX_TLS");
    /* The daemon's mode, whatever the caller's environment says. */
    setenv("RINGD_TP_ERR_MODE", "peer", 1);
    pid_t pid[16];
    for (int r = 0; r < n; r++) {
        char rs[16], ns[16];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(ns, sizeof ns, "%d", n);
        char vs[16], cs[32], qs[16];
        snprintf(vs, sizeof vs, "%d", sweep);
        snprintf(qs, sizeof qs, "%d", quick); /* --options: the rounds */
        snprintf(cs, sizeof cs, "%.6f", ceiling);
        char *argv[] = {(char *)self, "--worker", dir, rs, ns, (char *)tls,
                        qs, vs, cs, NULL};
        pid[r] = fork();
        if (pid[r] == 0) {
            execv(self, argv);
            _exit(127);
        }
    }
    int ok = 1;
    int64_t deadline = now_ns() + 150000000000LL;
    for (int r = 0; r < n; r++) {
        int st;
        for (;;) {
            pid_t w = waitpid(pid[r], &st, WNOHANG);
            if (w == pid[r])
                break;
            if (now_ns() > deadline) {
                kill(pid[r], SIGKILL);
                waitpid(pid[r], &st, 0);
                break;
            }
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    char *rows = ok ? slurp_rows(dir) : NULL;
    rmdir_all(dir);
    return rows;
}

static double find_ratio(const char *rows, size_t bytes)
{
    char key[64];
    snprintf(key, sizeof key, "tcp\t4\t%zu\t", bytes);
    const char *p = strstr(rows, key);
    double ratio = 0;
    if (p) {
        const char *nl = strchr(p, '\n');
        const char *tab = nl;
        while (tab > p && tab[-1] != '\t')
            tab--;
        ratio = strtod(tab, NULL);
    }
    return ratio;
}

/* The ceiling a pass's '#' line gives for tls and n; 0 if none. */
static double find_ceiling(const char *rows, const char *tls, int n)
{
    char key[64];
    snprintf(key, sizeof key, "# ceiling %s n=%d link_GBps=", tls, n);
    const char *p = strstr(rows, key);
    return p != NULL ? strtod(p + strlen(key), NULL) : 0;
}

static int main_grid(const char *self, int quick)
{
    static const int ns[] = {4, 6, 9};
    printf("mode\tn\tbytes\tflat_usec\tgrid_usec\tgrid_over_flat\n");
    fflush(stdout);
    for (int i = 0; i < (quick ? 2 : 3); i++) {
        char *rows = pass(self, "tcp", ns[i], quick, -1, 0);
        if (!rows) {
            fprintf(stderr, "ringbench: grid n=%d failed\n", ns[i]);
            return 1;
        }
        fputs(rows, stdout);
        fflush(stdout);
        free(rows);
    }
    return 0;
}

/* --options [--rounds R] [--sizes LIST] [--chunks LIST] */
static int main_options(const char *self, int argc, char **argv)
{
    int rounds = 5;
    const char *sizes = OPT_SIZES, *chunks = OPT_CHUNKS;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--sizes") == 0)
            sizes = argv[i + 1];
        else if (strcmp(argv[i], "--chunks") == 0)
            chunks = argv[i + 1];
        else
            argc = -1;
    }
    size_t tmp[MAX_LIST];
    if (argc < 0 || argc % 2 != 0 || rounds < 1 || rounds > MAX_ROUNDS ||
        parse_list(sizes, 4, OPT_MAX_BYTES, tmp) < 0 ||
        parse_list(chunks, 64, 1 << 30, tmp) < 0) {
        fprintf(stderr, "ringbench: --options [--rounds 1..%d] [--sizes "
                "BYTES,... (4 B to 256 MiB, at most %d)] [--chunks "
                "BYTES,... (at most %d)]\n", MAX_ROUNDS, MAX_LIST, MAX_LIST);
        return 2;
    }
    setenv("RINGBENCH_SIZES", sizes, 1);
    setenv("RINGBENCH_CHUNKS", chunks, 1);
    printf("mode\tn\tbytes\tchunk\tbidir\tmedian_usec\tbusbw_GBps\t"
           "vs_first\n");
    fflush(stdout);
    for (int n = 2; n <= 4; n += 2) {
        char *rows = pass(self, "tcp", n, rounds, SWEEP_OPTIONS, 0);
        if (!rows) {
            fprintf(stderr, "ringbench: options n=%d failed\n", n);
            return 1;
        }
        fputs(rows, stdout);
        fflush(stdout);
        free(rows);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 9 && strcmp(argv[1], "--worker") == 0) {
        bench_t b = {.dir = argv[2], .rank = (uint32_t)atoi(argv[3]),
                     .n = (uint32_t)atoi(argv[4]), .tls = argv[5],
                     .quick = atoi(argv[6]), .sweep = atoi(argv[7]),
                     .ceiling = strtod(argv[8], NULL)};
        return worker(&b);
    }
    int grid = argc > 1 && strcmp(argv[1], "--grid") == 0;
    int quick = argc > 1 + grid && strcmp(argv[1 + grid], "--quick") == 0;
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0)
        return 1;
    self[len] = '\0';
    setenv("RINGD_LOG_LEVEL", "error", 0);
    if (grid)
        return main_grid(self, quick);
    if (argc > 1 && strcmp(argv[1], "--options") == 0)
        return main_options(self, argc - 2, argv + 2);
    printf("tls\tn\tbytes\tusec\talgbw_GBps\tbusbw_GBps\tlink_GBps\tratio\n");
    fflush(stdout);
    double ratio = 0, ceiling = 0;
    static const char *tls[] = {"tcp", "auto"};
    for (int t = 0; t < 2; t++) {
        for (int n = 2; n <= 4; n += 2) {
            char *rows = pass(self, tls[t], n, quick, 0, 0);
            if (!rows) {
                fprintf(stderr, "ringbench: %s n=%d failed\n", tls[t], n);
                return 1;
            }
            fputs(rows, stdout);
            fflush(stdout);
            if (t == 0 && n == 4) {
                ratio = find_ratio(rows, 64 * MiB);
                ceiling = find_ceiling(rows, "tcp", 4);
            }
            free(rows);
        }
    }
    printf("# options at tcp n=4 64 MiB against the tcp n=4 ceiling above "
           "(label, then the columns above)\n");
    if (ceiling <= 0)
        printf("# no tcp n=4 ceiling in the table: options not run\n");
    for (int v = 1; ceiling > 0 && v <= NVARIANTS; v++) {
        char *rows = pass(self, "tcp", 4, quick, v, ceiling);
        if (rows) {
            fputs(rows, stdout);
            fflush(stdout);
            free(rows);
        }
    }
    printf("tcp_n4_64MiB_ratio=%.3f\n", ratio);
    return 0;
}
