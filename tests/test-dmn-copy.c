/*
 * A collective's copies into and out of staging (a broadcast to several
 * trainers, the copying path RINGD_ZERO_COPY=0) against a real ringd
 * (--standalone): the large ones run on the copy pool, never on the main
 * loop (the daemon counts the bytes by the thread that copied them), the
 * small ones stay inline, and a trainer that dies while a large copy runs
 * leaves a daemon that serves on.
 *
 * Two clients in this one process act as the node's two trainers, as in
 * test-dmn-async.c; the dying trainer is a child process (a SIGKILL or
 * _exit must really end a peer).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "include/ringd.h"
#include "tests/dmn-util.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* Above and below the daemon's inline limit (step-queue.c, 256 KiB). */
enum { BIG = 4 << 20, SMALL = 4 << 10, STEPS = 3 };

#define LOOP_BYTES "ringd_collective_copy_bytes_total{thread=\"loop\"}"
#define POOL_BYTES "ringd_collective_copy_bytes_total{thread=\"pool\"}"

static void begin_both(ringd_client_t *c[2])
{
    ringd_view_t v[2];
    td_begin_both(c, v);
    ASSERT_EQ(v[0].world, 2);
}

static uint8_t pattern(int s, int k, size_t i)
{
    return (uint8_t)(s * 31 + k * 7 + i * 13 + (i >> 12));
}

/* Both trainers broadcast len bytes at off from global rank root. */
static void bcast_both(ringd_client_t *c[2], uint8_t *b[2], size_t off,
                       size_t len, uint32_t root, int s)
{
    for (size_t i = 0; i < len; i++) {
        b[root][off + i] = pattern(s, 1, i);
        b[1 - root][off + i] = pattern(s, 2, i);
    }
    ringd_handle_t h[2];
    for (int k = 0; k < 2; k++)
        ASSERT_OK(ringd_broadcast_async(c[k], b[k] + off, len, root,
                                        &h[k]));
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(ringd_wait(c[k], h[k]), 0);
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < len; i++)
            ASSERT_MSG(b[k][off + i] == pattern(s, 1, i),
                       "step %d trainer %d byte %zu: %u, want %u", s, k, i,
                       b[k][off + i], pattern(s, 1, i));
}

/*
 * Two trainers of one node broadcast a 4 MiB tensor from rank 1 and a
 * 4 KiB one from rank 0, three steps; then one trainer alone runs a 4 MiB
 * allreduce through the copying path. Every result is the closed form,
 * and the daemon's per-thread counters say where each byte was copied:
 * a broadcast copies the root's tensor into staging and staging into
 * both trainers (3 copies), the copying path in and out (2): the 4 MiB
 * ones all on the pool, the 4 KiB ones all on the loop. With the copies
 * back on the loop (the code before, or an inline limit above 4 MiB) the
 * loop's count is 3 * 3 * 4 MiB higher and the pool's 0: this fails.
 */
TEST_IMPL(dmn_coll_copy_off_loop)
{
    td_daemon_t t;
    td_init(&t, "dmn-copy");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c[2];
    uint8_t *b[2];
    for (int k = 0; k < 2; k++) {
        ASSERT_OK(ringd_connect(&c[k], t.sock, NULL));
        b[k] = ringd_buffer(c[k], BIG + SMALL);
        ASSERT(b[k] != NULL);
    }
    for (int s = 0; s < STEPS; s++) {
        begin_both(c);
        bcast_both(c, b, 0, BIG, 1, s);
        bcast_both(c, b, BIG, SMALL, 0, s);
        for (int k = 0; k < 2; k++)
            ASSERT_OK(ringd_step_end(c[k]));
    }
    ASSERT_EQ(td_metric(&t, POOL_BYTES), 3.0 * STEPS * BIG);
    ASSERT_EQ(td_metric(&t, LOOP_BYTES), 3.0 * STEPS * SMALL);
    for (int k = 0; k < 2; k++)
        ringd_close(c[k]);
    ASSERT_EQ(td_stop(&t, 30000), 0);

    /* The copying path: one trainer, its tensor via staging. */
    td_daemon_t u;
    td_init(&u, "dmn-copy-zc0");
    setenv("RINGD_ZERO_COPY", "0", 1);
    const char *one[] = {"--trainers", "1", NULL};
    int rc = td_start(&u, one);
    unsetenv("RINGD_ZERO_COPY");
    ASSERT_OK(rc);
    ringd_client_t *d;
    ASSERT_OK(ringd_connect(&d, u.sock, NULL));
    float *f = ringd_buffer(d, BIG);
    ASSERT(f != NULL);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(d, &v));
    for (size_t i = 0; i < BIG / sizeof(float); i++)
        f[i] = (float)(i % 1000);
    ASSERT_OK(ringd_allreduce(d, f, BIG / sizeof(float), RINGD_F32,
                              RINGD_SUM));
    for (size_t i = 0; i < BIG / sizeof(float); i++)
        ASSERT_MSG(f[i] == (float)(i % 1000), "[%zu]: %g", i, (double)f[i]);
    ASSERT_OK(ringd_step_end(d));
    ASSERT_EQ(td_metric(&u, "ringd_collectives_zero_copy_total"), 0);
    ASSERT_EQ(td_metric(&u, POOL_BYTES), 2.0 * BIG);
    ASSERT_EQ(td_metric(&u, LOOP_BYTES), 0);
    ringd_close(d);
    ASSERT_EQ(td_stop(&u, 30000), 0);
    return 0;
}

enum { HUGE = 64 << 20 };

/* The child trainer (rank 1): waits for go on rfd before each move, then
 * posts its half of the broadcast and dies without a BYE. */
static void dying_trainer(const char *sock, int rfd)
{
    char go;
    ringd_client_t *c;
    if (read(rfd, &go, 1) != 1 || ringd_connect(&c, sock, NULL) != 0)
        _exit(2);
    uint8_t *b = ringd_buffer(c, HUGE);
    ringd_view_t v;
    ringd_handle_t h;
    if (b == NULL || ringd_step_begin(c, &v) != 0 || read(rfd, &go, 1) != 1 ||
        ringd_broadcast_async(c, b, HUGE, 0, &h) != 0)
        _exit(3);
    _exit(0); /* as a crash would: no BYE, the socket just closes */
}

/*
 * A trainer dies right after posting its half of a 64 MiB broadcast, so
 * that the daemon sees it go while the broadcast's copies (64 MiB into
 * staging, 2 x 64 MiB out) run on the pool: the mappings stay held until
 * the copy is done, the survivor's broadcast is answered (its result, or
 * RINGD_ERESHAPE), it redoes the step alone and broadcasts again, and the
 * daemon stops cleanly with no state move refused (td_stop). The moment
 * the death is seen is the scheduler's: the test prints the step state
 * the daemon logged it in ("reducing": during the collective's copies or
 * the backend), and passes either way.
 */
TEST_IMPL(dmn_coll_copy_trainer_dies)
{
    td_daemon_t t;
    td_init(&t, "dmn-copy-dies");
    const char *flags[] = {"--trainers", "2", NULL};
    ASSERT_OK(td_start(&t, flags));
    int p[2];
    ASSERT_OK(pipe(p));
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(p[1]);
        dying_trainer(t.sock, p[0]);
    }
    td_track(pid);
    close(p[0]);
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL)); /* rank 0: first */
    uint8_t *b = ringd_buffer(c, HUGE);
    ASSERT(b != NULL);
    ASSERT_EQ(write(p[1], "c", 1), 1);
    ringd_view_t v;
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.world, 2);
    for (size_t i = 0; i < HUGE; i++)
        b[i] = pattern(0, 1, i);
    ringd_handle_t h;
    ASSERT_OK(ringd_broadcast_async(c, b, HUGE, 0, &h));
    ASSERT_EQ(write(p[1], "g", 1), 1);
    ASSERT_EQ(td_exit_code(pid, 30000), 0);
    int rc = ringd_wait(c, h);
    ASSERT_MSG(rc == 0 || rc == RINGD_ERESHAPE, "broadcast: %d", rc);
    for (size_t i = 0; i < HUGE; i += 4093)
        ASSERT(b[i] == pattern(0, 1, i)); /* the root's own bytes */
    rc = ringd_step_end(c);
    ASSERT_MSG(rc == 0 || rc == RINGD_ERESHAPE, "step_end: %d", rc);
    ASSERT_OK(td_wait_file(t.log, " lost at step ", 10000));
    const char *states[] = {"(reducing)", "(running)", "(broken)",
                            "(aborting)", "(idle)"};
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
        if (td_file_has(t.log, states[i]))
            fprintf(stderr, "# the death was seen %s\n", states[i]);
    /* Alone now: the step again, or the next one. */
    ASSERT_OK(ringd_step_begin(c, &v));
    ASSERT_EQ(v.world, 1);
    for (size_t i = 0; i < HUGE; i++)
        b[i] = pattern(1, 1, i);
    ASSERT_OK(ringd_broadcast(c, b, HUGE, 0));
    for (size_t i = 0; i < HUGE; i += 4093)
        ASSERT(b[i] == pattern(1, 1, i));
    ASSERT_OK(ringd_step_end(c));
    ringd_close(c);
    close(p[1]);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}

#define UNMAP_POOL "ringd_buffer_unmap_bytes_total{thread=\"pool\"}"
#define UNMAP_LOOP "ringd_buffer_unmap_bytes_total{thread=\"loop\"}"

static int pool_unmapped(void *arg)
{
    return td_metric(arg, UNMAP_POOL) >= BIG;
}

/* A trainer's buffers are unmapped when it leaves: its 4 MiB one on the
 * pool (munmap freed a gone trainer's pages on the loop, up to 12 ms a
 * 64 MiB buffer), its 4 KiB one on the loop. With every unmap on the loop
 * again the pool's count stays 0 and the wait fails. */
TEST_IMPL(dmn_unmap_off_loop)
{
    td_daemon_t t;
    td_init(&t, "dmn-unmap");
    const char *flags[] = {"--trainers", "1", NULL};
    ASSERT_OK(td_start(&t, flags));
    ringd_client_t *c;
    ASSERT_OK(ringd_connect(&c, t.sock, NULL));
    uint8_t *big = ringd_buffer(c, BIG), *small = ringd_buffer(c, SMALL);
    ASSERT(big != NULL && small != NULL);
    big[0] = small[0] = 1; /* touched, as a trainer's are */
    ASSERT_EQ(td_metric(&t, UNMAP_POOL), 0);
    ringd_close(c);
    ASSERT_MSG(td_poll(pool_unmapped, &t, 10000) == 0,
               "the 4 MiB buffer was not unmapped on the pool: %g bytes "
               "there, %g on the loop", td_metric(&t, UNMAP_POOL),
               td_metric(&t, UNMAP_LOOP));
    ASSERT_EQ(td_metric(&t, UNMAP_POOL), BIG);
    ASSERT_EQ(td_metric(&t, UNMAP_LOOP), SMALL);
    ASSERT_EQ(td_stop(&t, 30000), 0);
    return 0;
}
