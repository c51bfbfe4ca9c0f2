/*
 * ring-worker.c - one rank of a multi-process ring test.
 *
 *   ring-worker DIR RANK N MODE [options]
 *
 * Ranks exchange UCX worker addresses through DIR (write addr.R.tmp, rename
 * to addr.R, poll for the others with a bounded deadline), form the ring and
 * run MODE:
 *   matrix   every dtype x op x count (--counts a,b,c): results checked
 *            against a double/exact reference; a hash of every result goes
 *            to DIR/out.R so the launcher can check ranks are bitwise equal
 *   coll     broadcast from every root, allgather, barrier (checked)
 *   big      f32 sum of --count elements in a loop, --iters times
 *            (DIR/started.R appears before the first call); with --expect-fail
 *            the first error is written to DIR/rc.R and is a pass
 *   forge    rank 0 first sends a stale-generation and a wrong-size message
 *            to rank 1, then all run matrix-like checks; rank 1 asserts
 *            both were counted
 *   late     rank 1 enters the first collective 1 s late, which a long
 *            ring_set_deadline() covers
 *   abort    like big, but a second thread calls ring_abort() once the
 *            collective runs (rank 0 only)
 *   regen    four rings of successive generations in the same processes
 *   spin     --iters broadcasts of 4 KiB from rank 1, which sleeps 10 ms
 *            before each (a peer still computing); rank 0 checks the
 *            bytes and its idle spells: with --spin-adapt 1 it busy-polls
 *            in vain at most once, with 0 (the fixed policy) at least in
 *            half of them
 *   rings    an f32 sum of each of --counts (checked) on one ring or two
 *            as --expect-rings says, a 0 or 1 per count (ring_stats'
 *            two_rings); --bidir-mode 0|1|2 sets ring_opts_t.bidirectional
 *   local    every dtype x op x count (--counts) with --locals L local
 *            sources per rank (whole buffers, or --fused: three pieces
 *            each): an allreduce of local sources must leave every
 *            source and its region bitwise equal to the staged path
 *            (gather all, allreduce, scatter all); integer sums are checked
 *            exactly; the hash of every result goes to DIR/out.R
 * Options: --gen G --chunk B --bidir --wire bf16|f16 --deadline MS
 *          --locals L --fused --f32 (local: f32 SUM and AVG only)
 *          --keyed (keyed tag generations, as with a job secret, and the
 *          ring_hello each such ring needs before its first collective)
 *          --deadline-of R:MS (rank R only; wins over --deadline)
 *          --live-of R:MS (rank R's live_ms; big mode: every rank has
 *          heard both neighbours' heartbeats before started.R appears)
 *          --counts LIST --count N --iters K --expect-fail
 *          --spin-adapt 0|1 (ring_opts_t.spin_adaptive)
 *          --grid MIN_NODES --grid-max BYTES --grid-cols C (ring_opts_t)
 *          --host-size H (host key r / H) --expect-grid (matrix: every
 *          allreduce ran on the grid) --expect-rows R (matrix: its rows)
 *          --recv-inplace 0|1 (ring_opts_t.recv_inplace) --expect-inplace
 *          0|1 (matrix: no receive / some receives landed in place)
 * Exit status 0 is a pass; failures print why on stderr. MODE local is in
 * ring-worker-local.c, the data and references all modes check against
 * in ring-worker-data.c.
 */
#include "tests/ring-worker.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"
#include "kernels/kern.h"
#include "ring/ring.h"
#include "transport/tp.h"

worker_t W; /* a test binary's own state, not library state */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void write_file(const char *name, const void *buf, size_t len)
{
    char tmp[4096], fin[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", W.dir, name);
    snprintf(fin, sizeof fin, "%s/%s", W.dir, name);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0)
        DIE("write %s: %s", tmp, strerror(errno));
    if (rename(tmp, fin) != 0)
        DIE("rename %s: %s", fin, strerror(errno));
}

/* Poll for a peer's address file: a bounded wait on a real event. */
static void *read_addr(uint32_t r, size_t *len_p)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/addr.%u", W.dir, r);
    int64_t deadline = now_ms() + 30000;
    struct stat st;
    while (stat(path, &st) != 0) {
        if (now_ms() > deadline)
            DIE("no address from rank %u", r);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    void *buf = malloc((size_t)st.st_size);
    FILE *f = fopen(path, "rb");
    if (buf == NULL || f == NULL ||
        fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
        DIE("read %s", path);
    fclose(f);
    *len_p = (size_t)st.st_size;
    return buf;
}

/* The daemon's hook: whom to report to membership. */
static void on_fail(void *arg, uint32_t rank, int status)
{
    (void)arg;
    (void)status;
    W.onfail_count++;
    W.onfail_rank = rank;
}

/* A stand-in for the job secret's tag generation (job_auth_tag_gen):
 * unordered, the same on every rank, consecutive ones differ. */
static uint32_t keyed_gen(uint64_t gen)
{
    return (uint32_t)((gen * 0x9E3779B97F4A7C15ull) >> 40);
}

/* The handshake a keyed ring runs first: each rank sends its number both
 * ways and checks its neighbours'. */
static void hello(void)
{
    uint32_t me = W.rank, l = 0, r = 0, who = 0;
    int rc = ring_hello(W.ring, &me, &me, &l, &r, sizeof(me), &who);
    if (rc != 0)
        DIE("ring_hello: %s (rank %u)", st_strerror(rc), who);
    if (W.n > 1 && (l != (W.rank + W.n - 1) % W.n || r != (W.rank + 1) % W.n))
        DIE("ring_hello: left %u right %u", l, r);
}

static void new_ring(uint64_t gen)
{
    ring_view_t v = {.generation = gen, .nranks = W.n, .rank = W.rank,
                     .addrs = (const void *const *)W.addrs,
                     .addr_lens = W.lens, .hosts = W.hosts,
                     .tag_keyed = W.keyed, .tag_gen = keyed_gen(gen)};
    int rc = ring_create(W.tp, &v, &W.opts, &W.ring, NULL);
    if (rc != 0)
        DIE("ring_create: %s", st_strerror(rc));
    if (W.keyed)
        hello();
}

static void form_ring(void)
{
    int rc = tp_create(NULL, &W.tp);
    if (rc != 0)
        DIE("tp_create: %s", st_strerror(rc));
    const void *a;
    size_t alen;
    tp_address(W.tp, &a, &alen);
    char name[64];
    snprintf(name, sizeof name, "addr.%u", W.rank);
    write_file(name, a, alen);
    void **addrs = calloc(W.n, sizeof(*addrs));
    size_t *lens = calloc(W.n, sizeof(*lens));
    for (uint32_t r = 0; r < W.n; r++)
        addrs[r] = read_addr(r, &lens[r]);
    W.addrs = addrs;
    W.lens = lens;
    if (W.host_size > 0) {
        W.hosts = calloc(W.n, sizeof(*W.hosts));
        for (uint32_t r = 0; r < W.n; r++)
            W.hosts[r] = r / W.host_size;
    }
    new_ring(W.gen);
}

/* The plain f32 sum most modes run. */
static int sum_f32(float *f, size_t count)
{
    ring_allreduce_t a = {.buf = f, .count = count, .dt = KERN_F32,
                          .op = KERN_SUM};
    return ring_allreduce(W.ring, &a);
}

/* ---- matrix: every dtype x op x count ---------------------------------- */

static void one_allreduce(kern_dtype_t dt, kern_op_t op, size_t count)
{
    size_t es = kern_dtype_size(dt);
    void *buf = malloc(count * es + 1);
    for (size_t i = 0; i < count; i++)
        put(dt, buf, i, gen_val(dt, op, W.rank, i));
    ring_allreduce_t a = {.buf = buf, .count = count, .dt = dt, .op = op};
    int rc = ring_allreduce(W.ring, &a);
    if (rc != 0)
        DIE("allreduce %s/%s count %zu: %s", kern_dtype_name(dt),
            kern_op_name(op), count, st_strerror(rc));
    /* Checking every element of a long prime count is slow under ASAN. */
    size_t step = count > 100000 ? 97 : 1;
    for (size_t i = 0; i < count; i += step) {
        if (is_float(dt)) {
            check_float(dt, op, buf, i, "allreduce");
        } else {
            int64_t want = int_ref(dt, op, i);
            int64_t got = (int64_t)get(dt, buf, i);
            if (got != want)
                DIE("allreduce %s/%s [%zu] = %" PRId64 ", want %" PRId64,
                    kern_dtype_name(dt), kern_op_name(op), i, got, want);
        }
    }
    fprintf(W.out, "%s %s %zu %016" PRIx64 "\n", kern_dtype_name(dt),
            kern_op_name(op), count, fnv(buf, count * es));
    free(buf);
}

static void mode_matrix(void)
{
    uint64_t calls = 0;
    for (int c = 0; c < W.ncounts; c++)
        for (int dt = 0; dt < KERN_DTYPE_COUNT; dt++)
            for (int op = 0; op < KERN_OP_COUNT; op++) {
                one_allreduce((kern_dtype_t)dt, (kern_op_t)op, W.counts[c]);
                calls += W.counts[c] > 0;
            }
    ring_stats_t st;
    ring_stats(W.ring, &st);
    if (st.collectives != calls || st.forged != 0 || st.stale_dropped != 0)
        DIE("stats: %" PRIu64 " collectives (want %" PRIu64 "), %" PRIu64
            " forged, %" PRIu64 " stale", st.collectives, calls, st.forged,
            st.stale_dropped);
    if (st.left_rank != (W.rank + W.n - 1) % W.n)
        DIE("stats: left rank %u", st.left_rank);
    if (W.expect_grid && st.grid != calls)
        DIE("stats: %" PRIu64 " of %" PRIu64 " allreduces on the grid",
            st.grid, calls);
    if (W.expect_rows && st.grid_rows != W.expect_rows)
        DIE("stats: a grid of %u rows, want %u", st.grid_rows,
            W.expect_rows);
    if (W.n > 1 && calls > 0 && st.total_wait_us < st.last_wait_us)
        DIE("stats: wait totals inconsistent");
    if (W.expect_inplace >= 0 && (st.recv_inplace > 0) != W.expect_inplace)
        DIE("stats: %" PRIu64 " receives in place, want %s", st.recv_inplace,
            W.expect_inplace ? "some" : "none");
}

/* The ring's choice of one ring or two, per size. */
static void mode_rings(void)
{
    if (W.nrings != W.ncounts)
        DIE("--expect-rings names %d counts, --counts %d", W.nrings,
            W.ncounts);
    for (int c = 0; c < W.ncounts; c++) {
        ring_stats_t a, b;
        ring_stats(W.ring, &a);
        one_allreduce(KERN_F32, KERN_SUM, W.counts[c]);
        ring_stats(W.ring, &b);
        if (b.two_rings - a.two_rings != (uint64_t)W.rings[c])
            DIE("an allreduce of %zu f32 ran on %s, want %s", W.counts[c],
                b.two_rings > a.two_rings ? "two rings" : "one",
                W.rings[c] ? "two" : "one");
    }
}

/* ---- broadcast, allgather, barrier -------------------------------------- */

static uint8_t pattern(uint32_t who, size_t i)
{
    return (uint8_t)(i * 31 + who * 7 + 1);
}

/*
 * KERN_AVG by a divisor of 2n + 1 (a daemon's divisor is the job's trainer
 * count, not the ring's rank count): small integers sum exactly, so the
 * result is that sum divided once, and the same bits on every rank.
 */
static void avg_by(size_t count)
{
    uint32_t div = 2 * W.n + 1;
    float *f = malloc(count * sizeof(float) + 1);
    for (size_t i = 0; i < count; i++)
        f[i] = (float)(W.rank + 1 + i % 7);
    ring_allreduce_t a = {.buf = f, .count = count, .dt = KERN_F32,
                          .op = KERN_AVG, .divisor = div};
    int rc = ring_allreduce(W.ring, &a);
    if (rc != 0)
        DIE("allreduce_avg %zu: %s", count, st_strerror(rc));
    for (size_t i = 0; i < count; i++) {
        double sum = W.n * (W.n + 1) / 2.0 + (double)W.n * (double)(i % 7);
        double want = sum / div;
        if (fabs(f[i] - want) > 1e-6 * want)
            DIE("allreduce_avg %zu [%zu] = %.9g, want %.9g", count, i,
                f[i], want);
    }
    fprintf(W.out, "avg %zu %016" PRIx64 "\n", count,
            fnv(f, count * sizeof(float)));
    free(f);
}

static void mode_coll(void)
{
    for (int c = 0; c < W.ncounts; c++) {
        size_t len = W.counts[c];
        uint8_t *buf = malloc(len * W.n + 1);
        for (uint32_t root = 0; root < W.n; root++) {
            for (size_t i = 0; i < len; i++)
                buf[i] = W.rank == root ? pattern(root, i) : 0xEE;
            int rc = ring_broadcast(W.ring, buf, len, root);
            if (rc != 0)
                DIE("broadcast %zu from %u: %s", len, root, st_strerror(rc));
            for (size_t i = 0; i < len; i++)
                if (buf[i] != pattern(root, i))
                    DIE("broadcast %zu from %u: byte %zu", len, root, i);
        }
        memset(buf, 0xEE, len * W.n);
        for (size_t i = 0; i < len; i++)
            buf[W.rank * len + i] = pattern(W.rank, i);
        int rc = ring_allgather(W.ring, buf, len);
        if (rc != 0)
            DIE("allgather %zu: %s", len, st_strerror(rc));
        for (uint32_t r = 0; r < W.n; r++)
            for (size_t i = 0; i < len; i++)
                if (buf[r * len + i] != pattern(r, i))
                    DIE("allgather %zu: block %u byte %zu", len, r, i);
        if ((rc = ring_barrier(W.ring)) != 0)
            DIE("barrier: %s", st_strerror(rc));
        fprintf(W.out, "coll %zu ok\n", len);
        free(buf);
        avg_by(len);
    }
}

/* ---- flags piggybacked on the messages ---------------------------------- */

/* After a collective: its flags reached every rank (want_all) and are
 * exactly want, the same OR on every rank. */
static void check_flags(const char *what, size_t len, int raiser,
                        int want_all, unsigned want)
{
    unsigned got = 99;
    int all = ring_flags_seen(W.ring, &got);
    if (all != want_all || (all && got != want))
        DIE("%s %zu raised by %d: flags_seen %d/%u, want %d/%u", what, len,
            raiser, all, got, want_all, want);
    fprintf(W.out, "flags %s %zu %d %d %u\n", what, len, raiser, all, got);
}

/*
 * For each size and each rank raising a flag alone (and nobody, and
 * everybody with a bit of its own parity), every collective that can
 * carry flags delivers their OR to every rank, whichever rank raised
 * them; broadcast and zero sizes report that they carry none.
 */
static void mode_flags(void)
{
    for (int c = 0; c < W.ncounts; c++) {
        size_t len = W.counts[c];
        float *f = malloc(len * sizeof(float) * W.n + 1);
        for (int raiser = -2; raiser < (int)W.n; raiser++) {
            unsigned mine = raiser == -2 ? 1u << (W.rank & 1)
                          : (int)W.rank == raiser ? 1u << (raiser & 1) : 0;
            unsigned want = raiser == -2 ? (W.n > 1 ? 3u : 1u)
                          : raiser < 0 ? 0 : 1u << (raiser & 1);
            ring_set_flags(W.ring, mine);
            for (size_t i = 0; i < len; i++)
                f[i] = (float)(W.rank + 1);
            int rc = sum_f32(f, len);
            if (rc != 0)
                DIE("flags allreduce %zu: %s", len, st_strerror(rc));
            for (size_t i = 0; i < len; i++)
                if (f[i] != (float)(W.n * (W.n + 1) / 2))
                    DIE("flags allreduce %zu [%zu] = %g", len, i, f[i]);
            check_flags("allreduce", len, raiser, len > 0, want);
            if ((rc = ring_allgather(W.ring, f, len)) != 0)
                DIE("flags allgather %zu: %s", len, st_strerror(rc));
            check_flags("allgather", len, raiser, len > 0, want);
            if ((rc = ring_barrier(W.ring)) != 0)
                DIE("flags barrier: %s", st_strerror(rc));
            check_flags("barrier", 1, raiser, 1, want);
            for (uint32_t root = 0; root < W.n; root++) {
                if ((rc = ring_broadcast(W.ring, f, len, root)) != 0)
                    DIE("flags broadcast %zu: %s", len, st_strerror(rc));
                check_flags("broadcast", len, raiser, 0, 0);
            }
        }
        ring_set_flags(W.ring, 0);
        free(f);
    }
}

/* ---- failure modes ------------------------------------------------------- */

static void report_failure(int rc)
{
    uint32_t who = UINT32_MAX;
    ring_suspect(W.ring, &who);
    char line[128];
    int len = snprintf(line, sizeof line, "%d %u %d %u\n", rc, who,
                       W.onfail_count, W.onfail_rank);
    char name[64];
    snprintf(name, sizeof name, "rc.%u", W.rank);
    write_file(name, line, (size_t)len);
    /* Every later call must fail fast, never hang. */
    float x = 1;
    int rc2 = sum_f32(&x, 1);
    if (rc2 == 0)
        DIE("collective on a failed ring succeeded");
}

static void *abort_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&W.running)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    struct timespec ts = {0, 50000000}; /* let the transfer get going */
    nanosleep(&ts, NULL);
    ring_abort(W.ring);
    return NULL;
}

/* Heartbeats taken from both neighbours (one when n == 2), bounded: a
 * fault injected after started.R then lands on a rank already heard. */
static void heard_wait(void)
{
    if (ring_barrier(W.ring) != 0)
        DIE("warm-up barrier failed");
    uint64_t want = W.n > 2 ? 4 : 2; /* two periods */
    int64_t deadline = now_ms() + 10000;
    for (;;) {
        ring_stats_t st;
        ring_stats(W.ring, &st);
        if (st.hb_recv >= want)
            return;
        if (now_ms() > deadline)
            DIE("no heartbeats from the neighbours within 10 s");
        ring_service(W.ring);
        tp_progress(W.tp);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static void mode_big(int abort_it)
{
    float *buf = malloc(W.count * sizeof(float));
    pthread_t th;
    /*
     * Finish connection setup before the abort: UCX 1.13 asserts
     * (wireup_ep.c "pending_count == 0") when an endpoint is closed by the
     * peer while its wireup is still pending, a UCX bug, not the ring's.
     */
    if (abort_it && ring_barrier(W.ring) != 0)
        DIE("warm-up barrier failed");
    /* A grid's first allreduce exchanges the addresses over the flat
     * ring and connects: the faults below are to land on the grid. */
    float warm[1024] = {0};
    if (W.opts.grid_min_nodes > 0 &&
        sum_f32(warm, 1024) != 0)
        DIE("warm-up allreduce failed");
    /* Filled before the heartbeats are awaited: 256 MiB take over a
     * second under ASan, a second in which nobody services the ring, and
     * both neighbours would look silent past live_ms when the collective
     * starts (the test then names whichever was heard last, not the rank
     * it stopped). */
    for (size_t i = 0; i < W.count; i++)
        buf[i] = (float)(i % 8);
    if (W.live_test)
        heard_wait();
    abort_it = abort_it && W.rank == 0;
    if (abort_it && pthread_create(&th, NULL, abort_thread, NULL) != 0)
        DIE("pthread_create");
    char name[64];
    snprintf(name, sizeof name, "started.%u", W.rank);
    for (int it = 0; it < W.iters; it++) {
        if (it == 0)
            write_file(name, "1\n", 2);
        atomic_store(&W.running, 1);
        int rc = sum_f32(buf, W.count);
        /* Complete, but a neighbour died after we no longer needed it
         * (a grid row can finish while another row fails): the ring is
         * dead for the next one, with its cause. */
        if (rc == 0 && W.expect_fail)
            rc = ring_suspect(W.ring, NULL);
        if (rc != 0) {
            if (!W.expect_fail)
                DIE("allreduce: %s", st_strerror(rc));
            report_failure(rc);
            if (abort_it)
                pthread_join(th, NULL);
            free(buf);
            return;
        }
    }
    if (W.expect_fail)
        DIE("no failure seen in %d iterations", W.iters);
    /* Closed form: after k sums of n ranks, x * n^k. */
    double scale = pow((double)W.n, W.iters);
    for (size_t i = 0; i < W.count; i++)
        if (buf[i] != (float)((double)(i % 8) * scale))
            DIE("big [%zu] = %g, want %g", i, buf[i], (i % 8) * scale);
    fprintf(W.out, "big %zu %016" PRIx64 "\n", W.count,
            fnv(buf, W.count * sizeof(float)));
    free(buf);
}

static void forge_cb(tp_req_t *r)
{
    (void)r;
}

static void wait_file(const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", W.dir, name);
    int64_t deadline = now_ms() + 20000;
    struct stat st;
    while (stat(path, &st) != 0) {
        if (now_ms() > deadline)
            DIE("no %s", path);
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
}

/*
 * Rank 0 impersonates an old view and a liar before any real traffic, then
 * waits until rank 1 has both messages queued, so the order is fixed.
 */
/* The wrong-size message also sets both of the ring's flag bits (the top
 * of the index field): rejected for its size all the same, its flags must
 * not count. */
#define FORGED_FLAGS (3u << 18)

static void forge_send(void)
{
    size_t alen;
    void *addr = read_addr(1, &alen);
    tp_peer_t *p;
    int rc = tp_peer_connect(W.tp, addr, alen, NULL, NULL, &p);
    free(addr);
    if (rc != 0)
        DIE("forge connect: %s", st_strerror(rc));
    static uint8_t junk[8] = {0xAB};
    tp_req_t req[2] = {{0}};
    uint64_t tags[2] = {tp_tag_make(W.gen - 1, 0, 0, 0),
                        tp_tag_make(W.gen, 0, 0, FORGED_FLAGS)};
    for (int i = 0; i < 2; i++) {
        req[i].cb = forge_cb;
        if ((rc = tp_send(p, junk, 3, tags[i], NULL, &req[i])) != 0)
            DIE("forge send: %s", st_strerror(rc));
    }
    int64_t deadline = now_ms() + 10000;
    while (req[0].status == ST_AGAIN || req[1].status == ST_AGAIN) {
        tp_progress(W.tp);
        if (now_ms() > deadline)
            DIE("forged sends did not complete");
    }
    wait_file("forge-seen");
    tp_peer_close(p, 0);
}

static void forge_wait_seen(void)
{
    uint64_t stale = tp_tag_make(W.gen - 1, 0, 0, 0);
    uint64_t cur = tp_tag_make(W.gen, 0, 0, FORGED_FLAGS);
    size_t l1 = 0, l2 = 0;
    int64_t deadline = now_ms() + 10000;
    while (!tp_probe(W.tp, stale, UINT64_MAX, &l1) ||
           !tp_probe(W.tp, cur, UINT64_MAX, &l2)) {
        tp_progress(W.tp);
        if (now_ms() > deadline)
            DIE("forged messages never arrived");
    }
    if (l1 != 3 || l2 != 3)
        DIE("probed %zu/%zu bytes, want the forged 3", l1, l2);
    write_file("forge-seen", "1\n", 2);
}

static void mode_forge(void)
{
    if (W.rank == 0)
        forge_send();
    else if (W.rank == 1)
        forge_wait_seen();
    one_allreduce(KERN_F32, KERN_SUM, W.counts[0]);
    unsigned flags = 99;
    if (ring_flags_seen(W.ring, &flags) != 1 || flags != 0)
        DIE("flags %u after a forged flagged message, want 0", flags);
    one_allreduce(KERN_I32, KERN_SUM, W.counts[0]);
    int rc = ring_barrier(W.ring);
    if (rc != 0)
        DIE("barrier: %s", st_strerror(rc));
    ring_stats_t st;
    ring_stats(W.ring, &st);
    fprintf(stderr, "forged %" PRIu64 " stale %" PRIu64 "\n", st.forged,
            st.stale_dropped);
    if (W.rank == 1 && (st.forged < 1 || st.stale_dropped < 1))
        DIE("forged %" PRIu64 " stale %" PRIu64 ", want >= 1 each",
            st.forged, st.stale_dropped);
}

/*
 * Views come and go: the same processes build a ring per generation, the
 * way a daemon does on every view change, and the old one's late or
 * leftover messages must not disturb the new one.
 */
static void mode_regen(void)
{
    for (int g = 0; g < 4; g++) {
        if (g > 0) {
            ring_destroy(W.ring);
            new_ring(W.gen + (uint64_t)g);
        }
        one_allreduce(KERN_F32, KERN_SUM, W.counts[0]);
        one_allreduce(KERN_I64, KERN_MAX, W.counts[0] + 1);
        if (g % 2 == 0) {
            int rc = ring_barrier(W.ring);
            if (rc != 0)
                DIE("barrier gen %d: %s", g, st_strerror(rc));
        }
    }
}

/*
 * A peer that is late for every collective: rank 0 only receives (n = 2,
 * root 1), so each broadcast is one idle spell of about 10 ms on rank 0,
 * longer than spin_us. The adaptive policy stops spinning after the
 * first such spell; the fixed one spins spin_us in each before sleeping.
 * Rank 0 may miss a wait when it is descheduled past rank 1's sleep, so
 * the fixed policy is held to half of them, not all.
 */
static void mode_spin(void)
{
    enum { LEN = 4096 };
    uint8_t buf[LEN];
    if (W.n != 2)
        DIE("spin: n must be 2");
    for (int it = 0; it < W.iters; it++) {
        if (W.rank == 1) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
        for (size_t i = 0; i < LEN; i++)
            buf[i] = W.rank == 1 ? pattern((uint32_t)it, i) : 0xEE;
        int rc = ring_broadcast(W.ring, buf, LEN, 1);
        if (rc != 0)
            DIE("broadcast %d: %s", it, st_strerror(rc));
        for (size_t i = 0; i < LEN; i++)
            if (buf[i] != pattern((uint32_t)it, i))
                DIE("broadcast %d: byte %zu", it, i);
    }
    fprintf(W.out, "spin %d ok\n", W.iters);
    if (W.rank != 0)
        return;
    ring_stats_t st;
    ring_stats(W.ring, &st);
    uint64_t k = (uint64_t)W.iters;
    fprintf(stderr, "spin adaptive=%d: %" PRIu64 " hits, %" PRIu64
            " sleeps, %" PRIu64 " misses, %" PRIu64 " us in vain\n",
            W.opts.spin_adaptive, st.spin_hits, st.sleeps, st.spin_misses,
            st.spin_waste_us);
    if (st.sleeps < k / 2)
        DIE("spin: %" PRIu64 " of %" PRIu64 " waits slept", st.sleeps, k);
    if (W.opts.spin_adaptive && st.spin_misses > 1)
        DIE("spin: adaptive policy spun in vain %" PRIu64 " times in %"
            PRIu64 " late broadcasts", st.spin_misses, k);
    if (!W.opts.spin_adaptive && st.spin_misses < k / 2)
        DIE("spin: fixed policy spun in vain only %" PRIu64 " times in %"
            PRIu64 " late broadcasts", st.spin_misses, k);
}

/*
 * A late rank: the ring runs with a 500 ms deadline (--deadline), but the
 * first collective gets 5 s and rank 1 enters it 1 s late; then the short
 * deadline holds again.
 */
static void mode_late(void)
{
    int short_ms = W.opts.deadline_ms;
    if (ring_set_deadline(W.ring, 5000) != 0 ||
        ring_set_deadline(W.ring, 0) != ST_EINVAL)
        DIE("ring_set_deadline");
    if (W.rank == 1) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    int64_t t0 = now_ms();
    one_allreduce(KERN_I64, KERN_MAX, 4);
    if (W.rank != 1 && now_ms() - t0 < 800)
        DIE("the first collective did not wait for rank 1");
    if (ring_set_deadline(W.ring, short_ms) != 0)
        DIE("ring_set_deadline");
    one_allreduce(KERN_F32, KERN_SUM, 1000);
}

/* ---- main ------------------------------------------------------------- */

/* --deadline-of / --live-of RANK:MS: MS into *ms_p when RANK is ours. */
static void rank_ms(const char *opt, const char *v, int min, int *ms_p)
{
    unsigned r;
    int ms;
    if (sscanf(v, "%u:%d", &r, &ms) != 2 || ms < min)
        DIE("%s wants RANK:MS, not %s", opt, v);
    if (r == W.rank)
        *ms_p = ms;
}

static void parse_rings(const char *s)
{
    W.nrings = 0;
    for (; *s && W.nrings < 16; s += *s == ',')
        if (*s == '0' || *s == '1')
            W.rings[W.nrings++] = *s++ - '0';
        else
            DIE("bad --expect-rings %s", s);
}

static void parse_counts(const char *s)
{
    W.ncounts = 0;
    while (*s && W.ncounts < 16) {
        char *end;
        W.counts[W.ncounts++] = strtoull(s, &end, 0);
        s = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            DIE("bad --counts");
    }
}

static void parse(int argc, char **argv)
{
    if (argc < 5)
        DIE("usage: ring-worker DIR RANK N MODE [options]");
    W.dir = argv[1];
    W.rank = (uint32_t)atoi(argv[2]);
    W.n = (uint32_t)atoi(argv[3]);
    W.mode = argv[4];
    W.gen = 7;
    W.iters = 1;
    W.count = 1 << 20;
    ring_opts_default(&W.opts);
    W.expect_inplace = -1;
    W.opts.on_fail = on_fail;
    /*
     * Correctness runs share two cores with ASAN and other jobs: a long
     * deadline keeps a slow scheduler from looking like a hung peer. The
     * fault tests pass --deadline 2000, the product default.
     */
    W.opts.deadline_ms = 10000;
    parse_counts("0,1,7");
    int own_ms = 0;
    for (int i = 5; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--bidir")) W.opts.bidirectional = 1;
        else if (!strcmp(a, "--keyed")) W.keyed = 1;
        else if (!strcmp(a, "--expect-fail")) W.expect_fail = 1;
        else if (!strcmp(a, "--gen")) W.gen = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--chunk"))
            W.opts.chunk_bytes = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--deadline")) W.opts.deadline_ms = atoi(v), i++;
        else if (!strcmp(a, "--deadline-of"))
            rank_ms(a, v, 1, &own_ms), i++;
        else if (!strcmp(a, "--live-of"))
            rank_ms(a, v, 0, &W.opts.live_ms), W.live_test = 1, i++;
        else if (!strcmp(a, "--count")) W.count = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--grid"))
            W.opts.grid_min_nodes = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--grid-max"))
            W.opts.grid_max_bytes = strtoull(v, NULL, 0), i++;
        else if (!strcmp(a, "--grid-cols"))
            W.opts.grid_cols = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--host-size"))
            W.host_size = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--expect-grid")) W.expect_grid = 1;
        else if (!strcmp(a, "--recv-inplace"))
            W.opts.recv_inplace = atoi(v), i++;
        else if (!strcmp(a, "--expect-inplace"))
            W.expect_inplace = atoi(v), i++;
        else if (!strcmp(a, "--expect-rows"))
            W.expect_rows = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--iters")) W.iters = atoi(v), i++;
        else if (!strcmp(a, "--spin-adapt"))
            W.opts.spin_adaptive = atoi(v), i++;
        else if (!strcmp(a, "--locals"))
            W.locals = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--fused")) W.fused = 1;
        else if (!strcmp(a, "--f32")) W.f32_only = 1;
        else if (!strcmp(a, "--counts")) parse_counts(v), i++;
        else if (!strcmp(a, "--expect-rings")) parse_rings(v), i++;
        else if (!strcmp(a, "--bidir-mode"))
            W.opts.bidirectional = atoi(v), i++;
        else if (!strcmp(a, "--wire")) {
            W.opts.wire = !strcmp(v, "bf16") ? RD_WIRE_BF16 : RD_WIRE_F16;
            i++;
        } else DIE("unknown option %s", a);
    }
    if (own_ms > 0)
        W.opts.deadline_ms = own_ms;
}

int main(int argc, char **argv)
{
    parse(argc, argv);
    form_ring();
    char name[64];
    snprintf(name, sizeof name, "%s/out.%u", W.dir, W.rank);
    W.out = fopen(name, "w");
    if (W.out == NULL)
        DIE("open %s", name);
    if (!strcmp(W.mode, "matrix"))
        mode_matrix();
    else if (!strcmp(W.mode, "coll"))
        mode_coll();
    else if (!strcmp(W.mode, "rings"))
        mode_rings();
    else if (!strcmp(W.mode, "flags"))
        mode_flags();
    else if (!strcmp(W.mode, "big"))
        mode_big(0);
    else if (!strcmp(W.mode, "abort"))
        mode_big(1);
    else if (!strcmp(W.mode, "forge"))
        mode_forge();
    else if (!strcmp(W.mode, "regen"))
        mode_regen();
    else if (!strcmp(W.mode, "late"))
        mode_late();
    else if (!strcmp(W.mode, "local"))
        mode_local();
    else if (!strcmp(W.mode, "spin"))
        mode_spin();
    else
        DIE("unknown mode %s", W.mode);
    /*
     * A survivor of a failure test has recorded its outcome; it leaves
     * without tearing UCX down, because UCX 1.13 can abort inside
     * ucp_worker_destroy ("got REP message") after a transfer that was
     * cut in the middle, which would turn a correct run into a crash.
     */
    if (W.expect_fail) {
        fclose(W.out);
        _exit(0);
    }
    /*
     * Leave together, so nobody's exit looks like a failure to the rest.
     * One barrier is not enough: the first rank out of it may close its
     * endpoints while a neighbour still waits for its last message, and
     * UCX can report the closed endpoint before that message lands (the
     * two directions of a link can be separate connections). So a second
     * barrier follows, whose failures are expected (it only delays the
     * exit): nobody leaves before finishing or failing the second one,
     * and the first rank to finish it proves that every rank finished
     * the first, which must therefore succeed everywhere.
     */
    int rc = ring_barrier(W.ring);
    if (rc != 0)
        DIE("final barrier: %s", st_strerror(rc));
    (void)ring_barrier(W.ring);
    fclose(W.out);
    ring_destroy(W.ring);
    tp_destroy(W.tp);
    for (uint32_t r = 0; r < W.n; r++)
        free(W.addrs[r]);
    free(W.addrs);
    free(W.lens);
    free(W.hosts);
    return 0;
}
