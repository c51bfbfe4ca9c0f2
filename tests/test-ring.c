/*
 * test-ring.c - the ring over real processes on loopback.
 *
 * Each test starts N ring-worker processes in a fresh temp directory (they
 * exchange worker addresses there), waits for them with a bound, kills any
 * that remain by pid, and removes the directory, on failure too: a failed
 * ASSERT exits the test process, whose whole process group the runner
 * kills, and the directory is removed by an atexit handler.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"
#include "tests/task.h"

#define MAX_RANKS 10

typedef struct {
    char *dir;
    int n;
    pid_t pid[MAX_RANKS];
} launch_t;

static launch_t *cleanup_l; /* for the atexit handler of this test process */

static void launch_cleanup(void)
{
    launch_t *l = cleanup_l;
    if (l == NULL)
        return;
    for (int i = 0; i < l->n; i++) {
        if (l->pid[i] > 0) {
            kill(l->pid[i], SIGCONT);
            th_kill(l->pid[i]);
            l->pid[i] = 0;
        }
    }
    if (getenv("RINGD_TEST_KEEP") == NULL)
        th_rmtree(l->dir);
    free(l->dir);
    l->dir = NULL;
    cleanup_l = NULL;
}

/* Loopback only; the transport list comes from the test. */
static void env_setup(const char *tls, int shm)
{
    th_ucx_loopback(tls);
    /* UCX 1.13 refuses shared memory in PEER error mode. */
    setenv("RINGD_TP_ERR_MODE", shm ? "none" : "peer", 1);
}

/* Start n workers: ring-worker DIR RANK N MODE extra... */
static void launch(launch_t *l, int n, const char *mode, const char *extra)
{
    memset(l, 0, sizeof(*l));
    l->n = n;
    l->dir = th_mkdtemp("ringd-ring");
    ASSERT(l->dir != NULL);
    cleanup_l = l;
    atexit(launch_cleanup);
    char bin[4096], rank[16], nr[16], log[4200];
    snprintf(bin, sizeof bin, "%s/tests/ring-worker", th_bindir());
    snprintf(nr, sizeof nr, "%d", n);
    for (int r = 0; r < n; r++) {
        char *argv[32];
        int a = 0;
        snprintf(rank, sizeof rank, "%d", r);
        argv[a++] = bin;
        argv[a++] = l->dir;
        argv[a++] = rank;
        argv[a++] = nr;
        argv[a++] = (char *)mode;
        char *copy = strdup(extra ? extra : "");
        for (char *t = strtok(copy, " "); t && a < 30; t = strtok(NULL, " "))
            argv[a++] = t;
        argv[a] = NULL;
        snprintf(log, sizeof log, "%s/log.%d", l->dir, r);
        l->pid[r] = th_spawn(argv, log);
        free(copy);
        ASSERT(l->pid[r] > 0);
    }
}

static void dump_logs(const launch_t *l)
{
    for (int r = 0; r < l->n; r++) {
        char path[4200], line[512];
        snprintf(path, sizeof path, "%s/log.%d", l->dir, r);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        int k = 0;
        while (fgets(line, sizeof line, f) && k++ < 20)
            fprintf(stderr, "  [%d] %s", r, line);
        fclose(f);
    }
}

/* Wait for rank r; returns its exit status, fails the test on a hang. */
static int wait_rank(launch_t *l, int r, int64_t timeout_ms)
{
    int st = 0;
    if (th_wait(l->pid[r], timeout_ms, &st) != 0) {
        dump_logs(l);
        ASSERT_MSG(0, "rank %d still running after %lld ms", r,
                   (long long)timeout_ms);
    }
    l->pid[r] = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        dump_logs(l);
    return st;
}

static void wait_all_ok(launch_t *l, int64_t timeout_ms)
{
    int64_t deadline = th_now_ms() + timeout_ms;
    for (int r = 0; r < l->n; r++) {
        int st = wait_rank(l, r, deadline - th_now_ms());
        ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                   "rank %d exited with status 0x%x", r, st);
    }
}

static char *slurp(const char *dir, const char *name, int r)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, name, r);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Every rank printed the same result hashes: bitwise identical results. */
static void check_same_outputs(const launch_t *l)
{
    char *first = slurp(l->dir, "out", 0);
    ASSERT(first != NULL);
    for (int r = 1; r < l->n; r++) {
        char *o = slurp(l->dir, "out", r);
        ASSERT(o != NULL);
        ASSERT_MSG(strcmp(first, o) == 0, "rank %d results differ", r);
        free(o);
    }
    free(first);
}

static void run_ok(int n, const char *mode, const char *extra,
                   const char *tls, int shm)
{
    launch_t l;
    env_setup(tls, shm);
    launch(&l, n, mode, extra);
    wait_all_ok(&l, 120000);
    check_same_outputs(&l);
    launch_cleanup();
}

/* Counts 0, 1, N-1, a small prime, and a prime spanning many chunks. */
static void matrix(int n, const char *tls, int shm, const char *more)
{
    char extra[256];
    snprintf(extra, sizeof extra, "--counts 0,1,%d,1009,40009 --chunk 8192 %s",
             n > 1 ? n - 1 : 2, more ? more : "");
    run_ok(n, "matrix", extra, tls, shm);
}

TEST_IMPL(ring_matrix_n1) { matrix(1, "tcp", 0, NULL); return 0; }
TEST_IMPL(ring_matrix_n2) { matrix(2, "tcp", 0, NULL); return 0; }
TEST_IMPL(ring_matrix_n3) { matrix(3, "tcp", 0, NULL); return 0; }
TEST_IMPL(ring_matrix_n4) { matrix(4, "tcp", 0, NULL); return 0; }
TEST_IMPL(ring_matrix_n5) { matrix(5, "tcp", 0, NULL); return 0; }
TEST_IMPL(ring_matrix_shm_n3) { matrix(3, "sm,self", 1, NULL); return 0; }
TEST_IMPL(ring_matrix_bidir_n3) { matrix(3, "tcp", 0, "--bidir"); return 0; }
TEST_IMPL(ring_matrix_bidir_n2) { matrix(2, "tcp", 0, "--bidir"); return 0; }

TEST_IMPL(ring_wire_bf16_n3)
{
    matrix(3, "tcp", 0, "--wire bf16");
    return 0;
}

TEST_IMPL(ring_wire_f16_n4)
{
    matrix(4, "tcp", 0, "--wire f16 --bidir");
    return 0;
}

/* 64 MiB of f32 with the default chunk. */
TEST_IMPL(ring_large_n2)
{
    run_ok(2, "big", "--count 16777216 --iters 2", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_large_n4)
{
    run_ok(4, "big", "--count 16777216 --iters 1", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_coll_n1)
{
    run_ok(1, "coll", "--counts 1,1000", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_coll_n4)
{
    run_ok(4, "coll", "--counts 1,3,4099,300007 --chunk 16384", "tcp", 0);
    return 0;
}

/*
 * Flags ORed into the messages hop by hop reach every rank in an
 * allreduce, an allgather and a barrier, whichever rank raised them, at
 * sizes below the rank count (zero-length chunks) and over many chunks;
 * broadcast and zero sizes say they carried none (ring_flags_seen).
 */
TEST_IMPL(ring_flags_n1)
{
    run_ok(1, "flags", "--counts 0,1,5", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_flags_n4)
{
    run_ok(4, "flags", "--counts 0,1,3,5,4099 --chunk 1024", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_flags_bidir_n3)
{
    run_ok(3, "flags", "--counts 1,2,7,3001 --chunk 1024 --bidir --wire bf16",
           "tcp", 0);
    return 0;
}

/*
 * One ring or two: auto (the default) takes two for allreduces of 1 MiB
 * to 128 MiB of data only, on every rank alike (the sums are checked);
 * on (--bidir) two from 2 elements, off never.
 */
TEST_IMPL(ring_bidir_auto_n3)
{
    run_ok(3, "rings", "--counts 1,16384,4194303,4194304,33554432,33554433 "
           "--expect-rings 0,0,0,1,1,0", "tcp", 0);
    /* 3 MiB: 1 MiB segments, each in two chunks (RING_SPLIT_MIN). */
    run_ok(3, "rings", "--counts 786432,786431 --expect-rings 0,0", "tcp",
           0);
    run_ok(3, "rings", "--bidir-mode 1 --counts 1,2,262143 "
           "--expect-rings 0,1,1", "tcp", 0);
    run_ok(3, "rings", "--bidir-mode 0 --counts 262144,4194304 "
           "--expect-rings 0,0", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_coll_shm_n3)
{
    run_ok(3, "coll", "--counts 1,3,300007 --chunk 16384", "sm,self", 1);
    return 0;
}

TEST_IMPL(ring_regen_n3)
{
    run_ok(3, "regen", "--counts 100003 --chunk 65536", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_regen_n2)
{
    run_ok(2, "regen", "--counts 1000", "tcp", 0);
    return 0;
}

/* Keyed tag generations (a job secret's): successive rings in the same
 * processes, on two rings at once, each after its handshake. */
TEST_IMPL(ring_keyed_regen_n3)
{
    run_ok(3, "regen", "--counts 100003 --chunk 65536 --bidir --keyed",
           "tcp", 0);
    return 0;
}

/* ring_set_deadline: a long first collective for a late rank. */
TEST_IMPL(ring_deadline_late_n3)
{
    run_ok(3, "late", "--deadline 500", "tcp", 0);
    return 0;
}

/*
 * The adaptive spin: a peer late for every collective costs no busy
 * polling after the first wait, where the fixed policy (the premise
 * check) spins spin_us in most of them; the bytes arrive either way.
 */
TEST_IMPL(ring_spin_late_n2)
{
    run_ok(2, "spin", "--iters 20 --spin-adapt 1", "tcp", 0);
    run_ok(2, "spin", "--iters 20 --spin-adapt 0", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_forged_n2)
{
    run_ok(2, "forge", "--counts 1000", "tcp", 0);
    return 0;
}

/*
 * The pipelined local reduce (ring_allreduce_t.local): 2 or 3 local
 * sources per rank, whole or in the fused layout, counts that are no
 * multiple of the chunk, odd n, two rings, wire compression and AVG by
 * the job's trainer count: every source ends bitwise as the staged path
 * leaves it, on every rank; the grid keeps the staged path.
 */
TEST_IMPL(ring_local_n1)
{
    run_ok(1, "local", "--counts 1,1009,40009 --chunk 8192 --locals 3",
           "tcp", 0);
    return 0;
}

TEST_IMPL(ring_local_n3)
{
    run_ok(3, "local", "--counts 0,1,2,1009,40009 --chunk 8192 --locals 2",
           "tcp", 0);
    return 0;
}

TEST_IMPL(ring_local_n5)
{
    run_ok(5, "local", "--counts 4,1009,40009 --chunk 4000 --locals 3",
           "tcp", 0);
    return 0;
}

TEST_IMPL(ring_local_fused_bidir_n2)
{
    run_ok(2, "local", "--counts 1,7,40009 --chunk 8192 --locals 3 --fused "
           "--bidir", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_local_wire_n3)
{
    run_ok(3, "local", "--counts 3,40009 --chunk 8192 --locals 2 --wire "
           "bf16", "tcp", 0);
    run_ok(3, "local", "--counts 40009 --chunk 8192 --locals 3 --fused "
           "--wire f16 --bidir", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_local_grid_n4)
{
    run_ok(4, "local", "--counts 5,4099 --chunk 4096 --locals 2 --grid 4 "
           "--expect-grid", "tcp", 0);
    return 0;
}

/* One source in pieces (a fused group of one trainer whose pieces are not
 * end to end): the flat ring runs in the pieces, chunks across two of them
 * packed into the send slot and applied piece by piece, every dtype × op,
 * two rings, wire compression; bitwise the staged path. */
TEST_IMPL(ring_local_pieces_in_place)
{
    run_ok(2, "local", "--counts 1,7,4099,40009 --chunk 8192 --locals 1 "
           "--fused", "tcp", 0);
    run_ok(3, "local", "--counts 3,40009 --chunk 8192 --locals 1 --fused "
           "--bidir", "tcp", 0);
    run_ok(3, "local", "--counts 40009 --chunk 4000 --locals 1 --fused "
           "--wire bf16", "tcp", 0);
    run_ok(1, "local", "--counts 1009 --chunk 8192 --locals 1 --fused",
           "tcp", 0);
    return 0;
}

/* 16 MiB of f32 with the default chunk (rendezvous-sized messages). */
TEST_IMPL(ring_local_big_n2)
{
    /* 2 MiB: 1 MiB segments, each in two chunks. */
    run_ok(2, "local", "--counts 4194305,524288 --locals 2 --f32", "tcp",
           0);
    return 0;
}

/* Wait until every rank has entered its first big collective. */
static void wait_started(launch_t *l)
{
    int64_t deadline = th_now_ms() + 30000;
    for (int r = 0; r < l->n; r++) {
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/started.%d", l->dir, r);
        while (stat(path, &st) != 0) {
            ASSERT_MSG(th_now_ms() < deadline, "rank %d never started", r);
            int s;
            ASSERT_MSG(waitpid(l->pid[r], &s, WNOHANG) == 0,
                       "rank %d died early", r);
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
}

/*
 * Every rank but `victim` must return an error (recorded in rc.R) and exit
 * within bound_ms of the fault.
 */
static void check_survivors(launch_t *l, int victim, int64_t t_fault,
                            int64_t bound_ms, int must_name)
{
    int named = 0;
    for (int r = 0; r < l->n; r++) {
        if (r == victim)
            continue;
        int st = wait_rank(l, r, t_fault + bound_ms - th_now_ms());
        ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                   "survivor %d exited with status 0x%x", r, st);
        char *rc = slurp(l->dir, "rc", r);
        ASSERT_MSG(rc != NULL, "survivor %d recorded no error", r);
        int code = 0, count = 0;
        unsigned who = 0, cb_rank = 0;
        ASSERT_EQ(sscanf(rc, "%d %u %d %u", &code, &who, &count, &cb_rank),
                  4);
        ASSERT_MSG(code < 0, "survivor %d: rc %s", r, rc);
        named += (int)who == victim;
        fprintf(stderr, "survivor %d: %s (%s)\n", r, rc, st_strerror(code));
        /* on_fail: once, with the suspect; never for a local abort. */
        ASSERT_EQ(count, code == ST_EABORTED ? 0 : 1);
        if (count == 1)
            ASSERT_EQ(cb_rank, who);
        free(rc);
    }
    /*
     * The abort cascades (a failing rank force-closes its endpoints), so a
     * survivor may blame a neighbour that merely gave up first; but the
     * victim's own neighbours see it first, and one of them must say so.
     */
    /*
     * A failed endpoint (SIGKILL over tcp) names the victim reliably. A
     * deadline does not always: on a loaded machine a survivor can give up
     * on its quiet neighbour before the victim's own neighbour gives up on
     * the victim. Membership, not the ring, decides who is dead, so there
     * naming is only reported.
     */
    if (victim >= 0 && must_name)
        ASSERT_MSG(named >= 1, "no survivor named rank %d", victim);
    else if (victim >= 0 && named == 0)
        fprintf(stderr, "note: no survivor named rank %d (deadline race)\n",
                victim);
}

/* 256 MiB of f32: long enough that the fault lands mid-collective. */
#define BIG "--count 67108864 --iters 1000 --expect-fail --deadline 2000"

static void kill_one_mode(const char *mode, const char *extra,
                          const char *tls, int shm, int n, int victim)
{
    launch_t l;
    env_setup(tls, shm);
    /*
     * In error mode NONE a force-closed endpoint never completes its
     * rendezvous sends, so the survivors leak them on purpose (see
     * transport/README.md); LeakSanitizer would call that a failure.
     */
    if (shm)
        setenv("LSAN_OPTIONS", "detect_leaks=0", 1);
    launch(&l, n, mode, extra);
    wait_started(&l);
    int64_t t = th_now_ms();
    th_kill(l.pid[victim]);
    l.pid[victim] = 0;
    /* Deadline 2 s, plus the cascade and process exit: 8 s is generous. */
    check_survivors(&l, victim, t, 8000, !shm);
    launch_cleanup();
}

static void kill_one(const char *tls, int shm, int n, int victim)
{
    kill_one_mode("big", BIG, tls, shm, n, victim);
}

TEST_IMPL(ring_kill_n3) { kill_one("tcp", 0, 3, 1); return 0; }

TEST_IMPL(ring_kill_shm_n3) { kill_one("sm,self", 1, 3, 2); return 0; }

/*
 * SIGSTOP of one rank: its right neighbour starves first and its deadline
 * names the hung rank (ST_EPEER_TIMEOUT, on_fail with that rank). With
 * equal deadlines a loaded machine can let another survivor's deadline
 * fire first (see check_survivors), so the right neighbour alone gets the
 * product's 2 s and everyone else 8 s: the others then end only through
 * the cascade of force-closed endpoints, and the naming is deterministic.
 *
 * With live (ring/README.md, "Liveness") only the right neighbour has
 * live_ms 500 and everyone the 8 s deadline: it names the stopped rank
 * with ST_EPEER_SILENT once that sent neither data nor heartbeats for
 * 500 ms, not ST_EPEER_TIMEOUT at 8 s (what it got without heartbeats).
 */
static void stop_one(int n, int victim, int live)
{
    launch_t l;
    env_setup("tcp", 0);
    int right = (victim + 1) % n;
    char extra[256];
    snprintf(extra, sizeof extra,
             "--count 67108864 --iters 1000 --expect-fail --deadline 8000 "
             "--%s-of %d:%d", live ? "live" : "deadline", right,
             live ? 500 : 2000);
    launch(&l, n, "big", extra);
    wait_started(&l);
    int64_t t = th_now_ms();
    kill(l.pid[victim], SIGSTOP);
    check_survivors(&l, victim, t, 15000, 1);
    char *rc = slurp(l.dir, "rc", right);
    ASSERT(rc != NULL);
    int code = 0, count = 0;
    unsigned who = 0, cb_rank = 0;
    ASSERT_EQ(sscanf(rc, "%d %u %d %u", &code, &who, &count, &cb_rank), 4);
    free(rc);
    int want = live ? ST_EPEER_SILENT : ST_EPEER_TIMEOUT;
    ASSERT_MSG(code == want, "right neighbour %d: %s", right,
               st_strerror(code));
    ASSERT_MSG(who == (unsigned)victim,
               "right neighbour %d suspects %u, not the stopped rank %d",
               right, who, victim);
    ASSERT_EQ(count, 1);
    ASSERT_EQ(cb_rank, victim);
    kill(l.pid[victim], SIGCONT);
    th_kill(l.pid[victim]);
    l.pid[victim] = 0;
    launch_cleanup();
}

TEST_IMPL(ring_stop_n3) { stop_one(3, 0, 0); return 0; }
TEST_IMPL(ring_stop_n4) { stop_one(4, 2, 0); return 0; }
/* With live_ms 500: the stopped rank is named silent (its right
 * neighbour blames the longer-silent of its two neighbours). */
TEST_IMPL(ring_live_stop_n3)
{
    stop_one(3, 1, 1);
    return 0;
}

/* ring_abort() from a second thread of rank 0 ends everyone's collective. */
TEST_IMPL(ring_abort_thread_n2)
{
    launch_t l;
    env_setup("tcp", 0);
    launch(&l, 2, "abort", BIG);
    wait_started(&l);
    check_survivors(&l, -1, th_now_ms(), 10000, 0);
    char *rc = slurp(l.dir, "rc", 0);
    ASSERT(rc != NULL);
    ASSERT_EQ(atoi(rc), ST_EABORTED);
    free(rc);
    launch_cleanup();
    return 0;
}

/*
 * The two-level ring: every dtype and op, counts 0, 1, N-1 (fewer
 * elements than segments: empty segments and column rings), a prime and
 * a prime over many 8 KiB chunks, against the reference and bitwise equal
 * on every rank; every allreduce must have run on the grid.
 */
static void grid_matrix(int n, const char *more)
{
    char extra[128];
    snprintf(extra, sizeof extra, "--grid 4 --expect-grid %s",
             more ? more : "");
    matrix(n, "tcp", 0, extra);
}

TEST_IMPL(ring_grid_matrix_n4) { grid_matrix(4, NULL); return 0; }
TEST_IMPL(ring_grid_matrix_n6) { grid_matrix(6, NULL); return 0; }
TEST_IMPL(ring_grid_matrix_n7) { grid_matrix(7, NULL); return 0; }
TEST_IMPL(ring_grid_matrix_n9) { grid_matrix(9, NULL); return 0; }
TEST_IMPL(ring_grid_matrix_n10) { grid_matrix(10, NULL); return 0; }
/* One row per host of 5: two rows, not sqrt's three. */
TEST_IMPL(ring_grid_hosts_n10)
{
    grid_matrix(10, "--host-size 5 --expect-rows 2");
    return 0;
}
/* Rows at most 3 wide over 7 ranks: widths 3, 2 and 2. */
TEST_IMPL(ring_grid_cols_n7)
{
    grid_matrix(7, "--grid-cols 3 --expect-rows 3");
    return 0;
}

/* Broadcast and allgather (flat), barrier and avg by 2n + 1 (grid). */
TEST_IMPL(ring_grid_coll_n7)
{
    run_ok(7, "coll", "--counts 1,3,4099,30011 --chunk 16384 --grid 4",
           "tcp", 0);
    return 0;
}

/* 16 MiB per allreduce until a fault. The deadline is out of reach: the
 * survivors must end by endpoint failures and the cascade of force-closed
 * endpoints over the rows and the column rings alone. */
#define GRID_BIG "--count 4194304 --iters 1000 --expect-fail " \
                 "--deadline 60000 --grid 4"

TEST_IMPL(ring_grid_kill_n7)
{
    kill_one_mode("big", GRID_BIG, "tcp", 0, 7, 5);
    return 0;
}

/* 3 x 3, the centre killed: its column rings' lower members only receive
 * from it (up and down differ), so only its endpoint's failure ends them. */
TEST_IMPL(ring_grid_kill_n9)
{
    kill_one_mode("big", GRID_BIG, "tcp", 0, 9, 4);
    return 0;
}

TEST_IMPL(ring_grid_abort_thread_n6)
{
    launch_t l;
    env_setup("tcp", 0);
    launch(&l, 6, "abort", GRID_BIG);
    wait_started(&l);
    check_survivors(&l, -1, th_now_ms(), 10000, 0);
    char *rc = slurp(l.dir, "rc", 0);
    ASSERT(rc != NULL);
    ASSERT_EQ(atoi(rc), ST_EABORTED);
    free(rc);
    launch_cleanup();
    return 0;
}

/* Grid rings of four successive generations in the same processes, with
 * messages of rendezvous size (default chunk). */
TEST_IMPL(ring_grid_regen_n4)
{
    run_ok(4, "regen", "--counts 262144 --grid 4", "tcp", 0);
    return 0;
}

TEST_IMPL(ring_grid_keyed_regen_n4)
{
    run_ok(4, "regen", "--counts 262144 --grid 4 --keyed", "tcp", 0);
    return 0;
}

/* The default 1 MiB chunk: rendezvous-sized messages on every sub-ring. */
TEST_IMPL(ring_grid_big_n4)
{
    run_ok(4, "big", "--count 262144 --iters 3 --grid 4", "tcp", 0);
    return 0;
}

/* Flags piggybacked on a grid allreduce reach every rank: the row, then
 * the column rings, then the row again carry them (counts below the
 * row width leave ranks without a column ring). */
TEST_IMPL(ring_grid_flags_n7)
{
    run_ok(7, "flags", "--counts 0,1,3,5,4099 --chunk 1024 --grid 4", "tcp",
           0);
    return 0;
}

/*
 * SIGSTOP of rank 0 of a 2 x 2 grid (rows 0 1 | 2 3; for this size the
 * column rings are {0, 2} and {1, 3}) during 16 MiB allreduces. Rank 1
 * needs rank 0 in both row phases and rank 2 in the column phase, and
 * neither ever waits on anyone else that rank 0 holds up, so the two
 * (deadline 2 s, rank 3 8 s: it ends by the cascade) must each return
 * ST_EPEER_TIMEOUT naming rank 0: the peer waited on, in the row and in
 * the column.
 */
TEST_IMPL(ring_grid_stop_n4)
{
    launch_t l;
    env_setup("tcp", 0);
    launch(&l, 4, "big", "--count 4194304 --iters 1000 --expect-fail "
           "--deadline 8000 --deadline-of 1:2000 --deadline-of 2:2000 "
           "--grid 4");
    wait_started(&l);
    int64_t t = th_now_ms();
    kill(l.pid[0], SIGSTOP);
    check_survivors(&l, 0, t, 15000, 1);
    for (int r = 1; r <= 2; r++) {
        char *rc = slurp(l.dir, "rc", r);
        ASSERT(rc != NULL);
        int code = 0, count = 0;
        unsigned who = 0, cb_rank = 0;
        ASSERT_EQ(sscanf(rc, "%d %u %d %u", &code, &who, &count, &cb_rank),
                  4);
        free(rc);
        ASSERT_MSG(code == ST_EPEER_TIMEOUT, "rank %d: %s", r,
                   st_strerror(code));
        ASSERT_MSG(who == 0, "rank %d suspects %u, not the stopped rank 0",
                   r, who);
        ASSERT_EQ(count, 1);
        ASSERT_EQ(cb_rank, 0);
    }
    kill(l.pid[0], SIGCONT);
    th_kill(l.pid[0]);
    l.pid[0] = 0;
    launch_cleanup();
    return 0;
}

/*
 * Receives that only copy land in the user's buffer (recv_inplace, the
 * default): the counter says some did, and the results are bitwise those
 * of the staging path (recv_inplace 0: none in place).
 */
TEST_IMPL(ring_recv_inplace_n3)
{
    const char *extra = "--counts 1,2,1009,40009 --chunk 8192";
    char a[256], b[256];
    snprintf(a, sizeof a, "%s --expect-inplace 1", extra);
    snprintf(b, sizeof b, "%s --recv-inplace 0 --expect-inplace 0", extra);
    launch_t l;
    env_setup("tcp", 0);
    launch(&l, 3, "matrix", a);
    wait_all_ok(&l, 120000);
    check_same_outputs(&l);
    char *inplace = slurp(l.dir, "out", 0);
    ASSERT(inplace != NULL && inplace[0] != '\0');
    launch_cleanup();
    launch(&l, 3, "matrix", b);
    wait_all_ok(&l, 120000);
    check_same_outputs(&l);
    char *staged = slurp(l.dir, "out", 0);
    ASSERT(staged != NULL);
    ASSERT_MSG(strcmp(inplace, staged) == 0,
               "results in place differ from the staged ones");
    free(inplace);
    free(staged);
    launch_cleanup();
    return 0;
}
