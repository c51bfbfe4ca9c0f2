/*
 * e2e-worker.c - bench/e2e's measured processes: a trainer (libringd, the
 * product path) or a raw ring rank (tp + ring, no daemon), each reading
 * one command per line on stdin (see worker_loop). e2e.c is the
 * coordinator that starts them.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench/e2e.h"
#include "common/clock.h"
#include "common/status.h"
#include "include/ringd.h"
#include "ring/ring.h"
#include "tests/helpers.h"
#include "transport/tp.h"

void e2e__die(const char *what, const char *detail)
{
    fprintf(stderr, "e2e: %s: %s\n", what, detail);
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double e2e__median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double e2e__cpu_self(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the worker side: one command per line on stdin ------------------- */

/*
 * "run BYTES ITERS [MS [PIECES]]": one warm-up and ITERS timed
 * collectives (a trainer first sleeps MS ms in each step, standing in for
 * compute; with PIECES > 1 it reduces BYTES as that many asynchronous
 * allreduces, all issued before the first wait, timed together (in one
 * fusion group with PIECES > RINGD_MAX_OUTSTANDING: PIECES minus that),
 * and with PIECES < -1 as -PIECES blocking ones, one after the other);
 * BYTES 0: a trainer's steps hold no collective and the whole step
 * (step_begin + step_end) is timed. "step BYTES ITERS": the same, with
 * the whole step of a trainer timed (step_begin, the allreduce,
 * step_end): the per-step latency. Answers "ok USEC MEAN CPU" (the
 * median, the mean, and the CPU seconds this process spent, every thread,
 * over the timed iterations) or "err TEXT". "quit" ends the process.
 * The coordinator never runs two groups at once, so the idle group sleeps
 * in read() and takes no CPU from the measured one.
 */
typedef int (*worker_op_t)(void *arg, void *buf, size_t bytes, int ms,
                           int pieces, double *us);

static int whole_step; /* "step": trainer_op times the whole step */

static void worker_loop(worker_op_t op, void *arg, void *buf, size_t max)
{
    char line[128];
    while (fgets(line, sizeof(line), stdin) != NULL) {
        size_t bytes;
        int iters, ms = 0, pieces = 1;
        if (strncmp(line, "quit", 4) == 0)
            break;
        whole_step = strncmp(line, "step ", 5) == 0;
        if (whole_step)
            memcpy(line, "run ", 4); /* "step X" -> "run  X" */
        if (sscanf(line, "run %zu %d %d %d", &bytes, &iters, &ms,
                   &pieces) < 2 ||
            bytes > max || iters < 1 || iters > 4096 || ms < 0 ||
            pieces == 0 || pieces > 3 * RINGD_MAX_OUTSTANDING ||
            pieces < -RINGD_MAX_OUTSTANDING) {
            printf("err bad command\n");
            fflush(stdout);
            continue;
        }
        double t[4097], cpu0 = 0;
        int rc = 0;
        for (int i = 0; i <= iters && rc == 0; i++) {
            if (i == 1)
                cpu0 = e2e__cpu_self();
            rc = op(arg, buf, bytes, ms, pieces, &t[i]);
        }
        double cpu = e2e__cpu_self() - cpu0;
        double mean = 0;
        for (int i = 1; i <= iters; i++)
            mean += t[i] / iters;
        if (rc != 0)
            printf("err %s\n", st_strerror(rc));
        else
            printf("ok %.1f %.1f %.6f\n", e2e__median(t + 1, iters), mean,
                   cpu);
        fflush(stdout);
    }
}

/* bytes of f32 at buf as `pieces` asynchronous AVG allreduces, issued
 * first, then waited for in order; pieces < 0: -pieces blocking ones;
 * pieces > RINGD_MAX_OUTSTANDING: pieces - that, in a fusion group;
 * > 2 * RINGD_MAX_OUTSTANDING: pieces - twice that, in a fusion group,
 * the last slice first. */
static int allreduce_pieces(ringd_client_t *c, float *buf, size_t bytes,
                            int pieces)
{
    size_t n = bytes / sizeof(float);
    int fuse = pieces > RINGD_MAX_OUTSTANDING;
    int back = pieces > 2 * RINGD_MAX_OUTSTANDING;
    if (fuse) {
        pieces -= back ? 2 * RINGD_MAX_OUTSTANDING : RINGD_MAX_OUTSTANDING;
        int rc = ringd_group_start(c);
        if (rc != 0)
            return rc;
    }
    if (pieces < 0) {
        int rc = 0;
        for (int k = 0; k < -pieces && rc == 0; k++) {
            size_t lo = n * (size_t)k / (size_t)-pieces;
            size_t hi = n * (size_t)(k + 1) / (size_t)-pieces;
            rc = ringd_allreduce(c, buf + lo, hi - lo, RINGD_F32,
                                 RINGD_AVG);
        }
        return rc;
    }
    ringd_handle_t h[RINGD_MAX_OUTSTANDING];
    int rc = 0, k = 0;
    for (; k < pieces && rc == 0; k++) {
        size_t j = (size_t)(back ? pieces - 1 - k : k);
        size_t lo = n * j / (size_t)pieces;
        size_t hi = n * (j + 1) / (size_t)pieces;
        rc = ringd_allreduce_async(c, buf + lo, hi - lo, RINGD_F32,
                                   RINGD_AVG, &h[k]);
    }
    if (rc != 0)
        k--;
    if (fuse) {
        int e = ringd_group_end(c);
        if (rc == 0)
            rc = e;
    }
    for (int i = 0; i < k; i++) {
        int w = ringd_wait(c, h[i]);
        if (rc == 0)
            rc = w;
    }
    return rc;
}

/* A trainer: one step per collective, the allreduce timed alone. */
static int trainer_op(void *arg, void *buf, size_t bytes, int ms,
                      int pieces, double *us)
{
    ringd_client_t *c = arg;
    float *f = buf;
    for (int tries = 0; tries < 100; tries++) {
        ringd_view_t v;
        int64_t t0 = (int64_t)rd_now_ns(), step0 = t0;
        int rc = ringd_step_begin(c, &v);
        if (rc != 0) {
            fprintf(stderr, "e2e trainer: step_begin: %s\n",
                    ringd_last_error(c));
            return -EIO;
        }
        if (bytes == 0) {
            if ((rc = ringd_step_end(c)) != 0)
                return -EIO;
            *us = (double)((int64_t)rd_now_ns() - t0) / 1000.0;
            return 0;
        }
        struct timespec compute = {ms / 1000, (long)(ms % 1000) * 1000000};
        if (ms > 0)
            nanosleep(&compute, NULL);
        f[0] = 1.0f;
        t0 = (int64_t)rd_now_ns();
        rc = pieces != 1 ? allreduce_pieces(c, buf, bytes, pieces)
                        : ringd_allreduce(c, buf, bytes / sizeof(float),
                                          RINGD_F32, RINGD_AVG);
        int64_t t1 = (int64_t)rd_now_ns();
        if (rc == RINGD_ERESHAPE)
            continue;
        if (rc != 0) {
            fprintf(stderr, "e2e trainer: allreduce: %s\n",
                    ringd_last_error(c));
            return -EIO;
        }
        /* Every trainer wrote 1 into f[0], so the average is 1: a result
         * that is not means the path dropped or doubled a contribution. */
        if (f[0] != 1.0f) {
            fprintf(stderr, "e2e trainer: f[0] = %g, want 1\n", f[0]);
            return -EIO;
        }
        if ((rc = ringd_step_end(c)) != 0) {
            fprintf(stderr, "e2e trainer: step_end: %s\n",
                    ringd_last_error(c));
            return -EIO;
        }
        *us = (double)(t1 - t0) / 1000.0;
        if (whole_step)
            *us = (double)((int64_t)rd_now_ns() - step0) / 1000.0;
        return 0;
    }
    return ST_ETIMEDOUT;
}

int e2e__trainer_main(const char *sock, size_t max, size_t state)
{
    ringd_client_t *c;
    ringd_opts_t o;
    ringd_opts_init(&o);
    o.name = "e2e";
    int rc = ringd_connect(&c, sock, &o);
    if (rc != 0)
        e2e__die("trainer connect", ringd_strerror(rc));
    void *buf = ringd_buffer(c, max);
    if (buf == NULL)
        e2e__die("trainer buffer", ringd_last_error(c));
    memset(buf, 0, max);
    if (state > 0) {
        /* Touched, so the daemon's copies of it move real pages. */
        void *st = ringd_buffer(c, state);
        if (st == NULL)
            e2e__die("trainer state", ringd_last_error(c));
        memset(st, 0x3c, state);
        if (ringd_state(c, st, state) != 0)
            e2e__die("trainer state", ringd_last_error(c));
    }
    worker_loop(trainer_op, c, buf, max);
    ringd_close(c);
    return 0;
}

typedef struct {
    tp_t *tp;
    ring_t *ring;
} raw_t;

static int ring_op(void *arg, void *buf, size_t bytes, int ms, int pieces,
                   double *us)
{
    raw_t *r = arg;
    (void)ms;
    (void)pieces;
    ((float *)buf)[0] = 1.0f;
    int64_t t0 = (int64_t)rd_now_ns();
    ring_allreduce_t a = {.buf = buf, .count = bytes / sizeof(float),
                          .dt = KERN_F32, .op = KERN_AVG};
    int rc = ring_allreduce(r->ring, &a);
    *us = (double)((int64_t)rd_now_ns() - t0) / 1000.0;
    if (rc == 0 && ((float *)buf)[0] != 1.0f)
        return -EIO;
    return rc;
}

/* Worker addresses through files in dir, as bench/ringbench does. */
static void ring_exchange(tp_t *tp, const char *dir, uint32_t rank,
                          uint32_t n, void **addrs, size_t *lens)
{
    const void *a;
    size_t len;
    char tmp[4096], fin[4096];
    tp_address(tp, &a, &len);
    snprintf(tmp, sizeof(tmp), "%s/addr.%u.tmp", dir, rank);
    snprintf(fin, sizeof(fin), "%s/addr.%u", dir, rank);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(a, 1, len, f) != len || fclose(f) || rename(tmp, fin))
        e2e__die("ring address", strerror(errno));
    for (uint32_t r = 0; r < n; r++) {
        struct stat st;
        snprintf(fin, sizeof(fin), "%s/addr.%u", dir, r);
        int64_t deadline = (int64_t)rd_now_ns() + 60000000000LL;
        /* The peer's rename is the event; nothing signals it but the
         * file itself. */
        while (stat(fin, &st) != 0) {
            if ((int64_t)rd_now_ns() > deadline)
                e2e__die("ring address", "peer never wrote its address");
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
        addrs[r] = malloc((size_t)st.st_size);
        f = fopen(fin, "rb");
        if (!f || fread(addrs[r], 1, (size_t)st.st_size, f) !=
                      (size_t)st.st_size)
            e2e__die("ring address", "short read");
        fclose(f);
        lens[r] = (size_t)st.st_size;
    }
}

int e2e__ring_main(const char *dir, uint32_t rank, uint32_t n, size_t max)
{
    raw_t r = {0};
    void *addrs[MAXN];
    size_t lens[MAXN];
    int rc = tp_create(NULL, &r.tp);
    if (rc != 0)
        e2e__die("tp_create", st_strerror(rc));
    ring_exchange(r.tp, dir, rank, n, addrs, lens);
    ring_view_t v = {.generation = 1, .nranks = n, .rank = rank,
                     .addrs = (const void *const *)addrs,
                     .addr_lens = lens};
    ring_opts_t o;
    ring_opts_default(&o);
    if ((rc = ring_create(r.tp, &v, &o, &r.ring, NULL)) != 0)
        e2e__die("ring_create", st_strerror(rc));
    if ((rc = ring_barrier(r.ring)) != 0)
        e2e__die("ring barrier", st_strerror(rc));
    void *buf = calloc(1, max);
    if (buf == NULL)
        e2e__die("ring buffer", "out of memory");
    worker_loop(ring_op, &r, buf, max);
    ring_barrier(r.ring);
    ring_destroy(r.ring);
    tp_destroy(r.tp);
    free(buf);
    for (uint32_t i = 0; i < n; i++)
        free(addrs[i]);
    return 0;
}

