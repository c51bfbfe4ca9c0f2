/*
 * test-tp.c - the transport inside one process: two workers talking over
 * loopback, the tag layout, cancel, probe/drain, and the efd wakeup.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers.h"
#include "tests/task.h"
#include "transport/tp-int.h"
#include "transport/tp.h"

static void env_setup(void)
{
    th_ucx_loopback("tcp");
}

static void done_cb(tp_req_t *req)
{
    (*(int *)req->data)++;
}

/* Progress both workers until *flag reaches want (bounded). */
static void pump(tp_t *a, tp_t *b, int *flag, int want)
{
    int64_t deadline = th_now_ms() + 10000;
    while (*flag < want) {
        tp_progress(a);
        tp_progress(b);
        ASSERT_MSG(th_now_ms() < deadline, "no completion");
    }
}

TEST_IMPL(tp_tag_layout)
{
    uint64_t t = tp_tag_make(0xABCDEF, 2, 0x3FFFF, 0xFFFFF);
    ASSERT_EQ(tp_tag_gen(t), 0xABCDEF);
    ASSERT_EQ(tp_tag_chan(t), 2);
    ASSERT_EQ(tp_tag_seq(t), 0x3FFFF);
    ASSERT_EQ(tp_tag_idx(t), 0xFFFFF);
    /* Fields never bleed into each other. */
    t = tp_tag_make(1ULL << 24, 4, 1ULL << 18, 1ULL << 20);
    ASSERT_EQ(t, 0);
    ASSERT_EQ(TP_TAG_GEN_BITS + TP_TAG_CHAN_BITS + TP_TAG_SEQ_BITS +
                  TP_TAG_IDX_BITS, 64);
    return 0;
}

TEST_IMPL(tp_send_recv)
{
    env_setup();
    tp_t *a, *b;
    ASSERT_OK(tp_create(NULL, &a));
    ASSERT_OK(tp_create(NULL, &b));
    const void *addr;
    size_t len;
    tp_address(b, &addr, &len);
    ASSERT(len > 0);
    tp_peer_t *p;
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &p));

    size_t n = 8 << 20; /* big enough for the rendezvous protocol */
    char *src = malloc(n), *dst = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        src[i] = (char)(i * 13);
    tp_mem_t *m;
    ASSERT_OK(tp_mem_map(b, dst, n, &m));
    int done = 0;
    tp_req_t rs = {.cb = done_cb, .data = &done};
    tp_req_t rr = {.cb = done_cb, .data = &done};
    uint64_t tag = tp_tag_make(5, 0, 9, 3);
    ASSERT_OK(tp_recv(b, dst, n, tag, UINT64_MAX, m, &rr));
    ASSERT_OK(tp_send(p, src, n, tag, NULL, &rs));
    pump(a, b, &done, 2);
    ASSERT_OK(rs.status);
    ASSERT_OK(rr.status);
    ASSERT_EQ(rr.length, n);
    ASSERT_EQ(rr.tag, tag);
    ASSERT(memcmp(src, dst, n) == 0);

    /* A message longer than the buffer is reported, not overflowed. */
    done = 0;
    ASSERT_OK(tp_recv(b, dst, 16, tag + 1, UINT64_MAX, NULL, &rr));
    ASSERT_OK(tp_send(p, src, 64, tag + 1, NULL, &rs));
    pump(a, b, &done, 2);
    ASSERT_EQ(rr.status, ST_EPEER_FORGED);

    tp_mem_unmap(m);
    tp_peer_close(p, 1); /* b is not progressed: no flush */
    tp_destroy(a);
    tp_destroy(b);
    free(src);
    free(dst);
    return 0;
}

/* What the bench's "auto" rows stand on: with UCX_TLS unset, UCX would
 * use shared memory between two workers on one host, but the daemon's
 * PEER error mode leaves it only tcp, and tp_peer_lanes says so. */
TEST_IMPL(tp_peer_lanes_peer_mode)
{
    env_setup();
    unsetenv("UCX_TLS");
    setenv("RINGD_TP_ERR_MODE", "peer", 1);
    tp_t *a, *b;
    ASSERT_OK(tp_create(NULL, &a));
    ASSERT_OK(tp_create(NULL, &b));
    ASSERT_EQ(tp_err_mode_none(a), 0);
    const void *addr;
    size_t len;
    tp_address(b, &addr, &len);
    tp_peer_t *p;
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &p));
    char src[64] = "lanes", dst[64];
    int done = 0;
    tp_req_t rs = {.cb = done_cb, .data = &done};
    tp_req_t rr = {.cb = done_cb, .data = &done};
    uint64_t tag = tp_tag_make(1, 0, 1, 0);
    ASSERT_OK(tp_recv(b, dst, sizeof dst, tag, UINT64_MAX, NULL, &rr));
    ASSERT_OK(tp_send(p, src, sizeof src, tag, NULL, &rs));
    pump(a, b, &done, 2);
    char lanes[256];
    ASSERT_OK(tp_peer_lanes(p, lanes, sizeof lanes));
    ASSERT_MSG(strcmp(lanes, "tcp/lo") == 0, "lanes '%s', want tcp/lo",
               lanes);
    /* A short buffer truncates, never overflows. */
    char tiny[4];
    ASSERT_OK(tp_peer_lanes(p, tiny, sizeof tiny));
    ASSERT_STR_EQ(tiny, "tcp");
    tp_peer_close(p, 1);
    tp_destroy(a);
    tp_destroy(b);
    return 0;
}

/* Whether UCX's description of p's endpoint holds want. */
static int ep_info_has(const tp_peer_t *p, const char *want)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ASSERT_MSG(f != NULL, "open_memstream");
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    int has = strstr(text, want) != NULL;
    if (!has)
        fprintf(stderr, "endpoint info without '%s':\n%s", want, text);
    free(text);
    return has;
}

/* tp_create's UCX defaults reach tcp (its 256 KiB send segment makes the
 * eager-short limit 256 KiB less the 7-byte header, UCX's own 8 KiB one
 * 8185), and a value set in the environment wins over them. */
TEST_IMPL(tp_ucx_defaults)
{
    env_setup();
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    tp_t *a, *b, *c;
    ASSERT_OK(tp_create(NULL, &a));
    ASSERT_OK(tp_create(NULL, &b));
    const void *addr;
    size_t len;
    tp_address(b, &addr, &len);
    tp_peer_t *pa, *pc;
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &pa));
    ASSERT_MSG(ep_info_has(pa, "<egr/short>..262137.."),
               "ringd's TX_SEG_SIZE default did not reach tcp");
    setenv("UCX_TCP_TX_SEG_SIZE", "8K", 1);
    int rc = tp_create(NULL, &c);
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    ASSERT_OK(rc);
    ASSERT_OK(tp_peer_connect(c, addr, len, NULL, NULL, &pc));
    ASSERT_MSG(ep_info_has(pc, "<egr/short>..8185.."),
               "UCX_TCP_TX_SEG_SIZE=8K from the environment was overridden");
    tp_peer_close(pa, 1);
    tp_peer_close(pc, 1);
    tp_destroy(a);
    tp_destroy(b);
    tp_destroy(c);
    return 0;
}

TEST_IMPL(tp_cancel)
{
    env_setup();
    tp_t *a;
    ASSERT_OK(tp_create(NULL, &a));
    int done = 0;
    char buf[8];
    tp_req_t r = {.cb = done_cb, .data = &done};
    ASSERT_OK(tp_recv(a, buf, sizeof buf, 42, UINT64_MAX, NULL, &r));
    tp_cancel(a, &r);
    pump(a, a, &done, 1);
    ASSERT_EQ(r.status, ST_EABORTED);
    tp_destroy(a);
    return 0;
}

static int stale_below_gen5(void *arg, uint64_t tag)
{
    (void)arg;
    return tp_tag_gen(tag) < 5;
}

TEST_IMPL(tp_drain_stale)
{
    env_setup();
    tp_t *a, *b;
    ASSERT_OK(tp_create(NULL, &a));
    ASSERT_OK(tp_create(NULL, &b));
    const void *addr;
    size_t len;
    tp_address(b, &addr, &len);
    tp_peer_t *p;
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &p));
    int done = 0;
    char src[32] = "x";
    tp_req_t s[3];
    uint64_t tags[3] = {tp_tag_make(3, 0, 0, 0), tp_tag_make(4, 0, 0, 0),
                        tp_tag_make(5, 0, 0, 0)};
    for (int i = 0; i < 3; i++) {
        s[i] = (tp_req_t){.cb = done_cb, .data = &done};
        ASSERT_OK(tp_send(p, src, sizeof src, tags[i], NULL, &s[i]));
    }
    pump(a, b, &done, 3);
    size_t l;
    int64_t deadline = th_now_ms() + 10000;
    while (!tp_probe(b, tags[2], UINT64_MAX, &l)) {
        tp_progress(a);
        tp_progress(b);
        ASSERT(th_now_ms() < deadline);
    }
    ASSERT_EQ(tp_drain(b, stale_below_gen5, NULL), 2);
    ASSERT(!tp_probe(b, tags[0], UINT64_MAX, &l));
    ASSERT(tp_probe(b, tags[2], UINT64_MAX, &l));
    tp_peer_close(p, 1); /* b is not progressed: no flush */
    tp_destroy(a);
    tp_destroy(b);
    return 0;
}

/*
 * 1 while thread tid sleeps in poll(2)/ppoll(2): the first field of
 * /proc/self/task/TID/syscall is the number of the syscall it is blocked
 * in ("running" when it is not in one).
 */
static int thread_in_poll(pid_t tid)
{
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    int ok = fgets(buf, sizeof(buf), f) != NULL;
    fclose(f);
    if (!ok)
        return 0;
    char *end;
    long nr = strtol(buf, &end, 10);
    if (end == buf)
        return 0;
#ifdef SYS_poll
    if (nr == SYS_poll)
        return 1;
#endif
    return nr == SYS_ppoll;
}

typedef struct {
    tp_t *tp;
    pid_t waiter;
    atomic_int signalled; /* set just before tp_signal */
    int saw_blocked;
} sig_arg_t;

/* Signal only once the waiter is asleep in the poll, so the wake-up can
 * come from nothing but the signal. */
static void *signaller(void *arg)
{
    sig_arg_t *s = arg;
    int64_t deadline = th_now_ms() + 10000;
    while (!thread_in_poll(s->waiter) && th_now_ms() < deadline) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    s->saw_blocked = thread_in_poll(s->waiter);
    atomic_store(&s->signalled, 1);
    tp_signal(s->tp);
    return NULL;
}

/*
 * An idle worker's tp_wait sleeps for its whole timeout; tp_signal from
 * another thread ends a 20 s wait that is known to be asleep.
 */
TEST_IMPL(tp_signal_wakes)
{
    env_setup();
    tp_t *a;
    ASSERT_OK(tp_create(NULL, &a));
    while (tp_progress(a))
        ;
    /* Unsignalled: times out (an early return would be 0, not a
     * timeout), and poll never returns before its timeout. */
    int rc = 0;
    int64_t t0 = 0;
    for (int i = 0; i < 10 && rc != ST_ETIMEDOUT; i++) {
        while (tp_progress(a))
            ;
        t0 = th_now_ms();
        rc = tp_wait(a, 200);
        ASSERT_MSG(rc == 0 || rc == ST_ETIMEDOUT, "tp_wait: %d", rc);
    }
    ASSERT_EQ(rc, ST_ETIMEDOUT);
    ASSERT_GE(th_now_ms() - t0, 199);

    sig_arg_t s = {.tp = a, .waiter = (pid_t)syscall(SYS_gettid)};
    atomic_init(&s.signalled, 0);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, signaller, &s), 0);
    /* A return before the signaller saw us asleep (pending events) is not
     * the wake-up under test: wait again. */
    int waits = 0;
    do {
        while (tp_progress(a))
            ;
        rc = tp_wait(a, 20000);
        waits++;
    } while (rc == 0 && !atomic_load(&s.signalled) && waits < 100);
    pthread_join(th, NULL);
    ASSERT_MSG(s.saw_blocked, "the waiter was never seen asleep in poll");
    ASSERT_MSG(rc == 0, "tp_wait after tp_signal: %d (%s)", rc,
               st_strerror(rc));
    ASSERT(atomic_load(&s.signalled));
    tp_destroy(a);
    return 0;
}

/*
 * Two endpoints from one worker to the same peer: closing one must leave
 * the other working (a ring re-formed while another user keeps its own
 * endpoint to the same neighbour).
 */
static void two_eps(int force)
{
    env_setup();
    tp_t *a, *b;
    ASSERT_OK(tp_create(NULL, &a));
    ASSERT_OK(tp_create(NULL, &b));
    const void *addr;
    size_t len;
    tp_address(b, &addr, &len);
    tp_peer_t *p1, *p2;
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &p1));
    ASSERT_OK(tp_peer_connect(a, addr, len, NULL, NULL, &p2));
    char src[4096] = "hello", dst[4096];
    int done = 0;
    tp_req_t s = {.cb = done_cb, .data = &done};
    tp_req_t r = {.cb = done_cb, .data = &done};
    for (int i = 0; i < 2; i++) {
        done = 0;
        ASSERT_OK(tp_recv(b, dst, sizeof dst, 100 + i, UINT64_MAX, NULL, &r));
        ASSERT_OK(tp_send(i ? p2 : p1, src, sizeof src, 100 + i, NULL, &s));
        pump(a, b, &done, 2);
    }
    tp_peer_close(p1, force);
    for (int i = 0; i < 3; i++) {
        done = 0;
        ASSERT_OK(tp_recv(b, dst, sizeof dst, 200 + i, UINT64_MAX, NULL, &r));
        ASSERT_OK(tp_send(p2, src, sizeof src, 200 + i, NULL, &s));
        pump(a, b, &done, 2);
        ASSERT_OK(s.status);
        ASSERT_OK(r.status);
    }
    tp_peer_close(p2, 1);
    tp_destroy(a);
    tp_destroy(b);
}

TEST_IMPL(tp_two_eps_close_one_force) { two_eps(1); return 0; }
TEST_IMPL(tp_two_eps_close_one_flush) { two_eps(0); return 0; }
