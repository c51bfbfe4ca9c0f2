/*
 * test-job-reduce.c - job_allreduce's checks of a job_reduce_t, made
 * before any backend sees it (job.h): a refused descriptor is ST_EINVAL
 * from the call itself, a backend's allreduce is never called, done_cb
 * never runs and no buffer changes. On a stub backend that counts its
 * calls, and on a solo job on a libuv loop, with the accepted
 * descriptors next to the refused ones so every probe is seen to work.
 */
#include <stdint.h>
#include <string.h>

#include <uv.h>

#include "common/status.h"
#include "common/wire.h"
#include "job/job.h"
#include "kernels/kern.h"
#include "tests/task.h"

#define RED_N 8     /* f32 elements of each buffer */
#define RED_MAX 24

typedef struct {
    const char *what;
    job_reduce_t r;
} red_case_t;

/*
 * The refused descriptors, each over bufs (two buffers of RED_N f32, so
 * of RED_N / 2 f64) and staging; base is a valid f32 SUM of them. Every
 * one differs from base in one field: that field is the reason.
 */
static size_t refused_cases(const job_reduce_t *base, red_case_t *c)
{
    size_t n = 0;
#define CASE(msg, ...)                                                       \
    do {                                                                     \
        c[n].what = msg;                                                     \
        c[n].r = *base;                                                      \
        __VA_ARGS__;                                                         \
        n++;                                                                 \
    } while (0)
    CASE("op past the enum", c[n].r.op = KERN_OP_COUNT);
    CASE("negative op", c[n].r.op = (kern_op_t)-1);
    CASE("AVG, divisor 0", c[n].r.op = KERN_AVG);
    CASE("SUM with a divisor", c[n].r.divisor = 2);
    CASE("PROD with a divisor", c[n].r.op = KERN_PROD, c[n].r.divisor = 2);
    CASE("MIN with a divisor", c[n].r.op = KERN_MIN, c[n].r.divisor = 1);
    CASE("MAX with a divisor", c[n].r.op = KERN_MAX, c[n].r.divisor = 2);
    CASE("bf16 wire on f64", c[n].r.dt = KERN_F64,
         c[n].r.count = RED_N / 2, c[n].r.wire = RD_WIRE_BF16);
    CASE("f16 wire on i32", c[n].r.dt = KERN_I32,
         c[n].r.wire = RD_WIRE_F16);
    CASE("bf16 wire on bf16", c[n].r.dt = KERN_BF16,
         c[n].r.wire = RD_WIRE_BF16);
    CASE("f16 wire on f16", c[n].r.dt = KERN_F16, c[n].r.wire = RD_WIRE_F16);
    CASE("wire past the enum", c[n].r.wire = RD_WIRE_COUNT);
    CASE("negative wire", c[n].r.wire = (rd_wire_t)-1);
    CASE("dtype past the enum", c[n].r.dt = KERN_DTYPE_COUNT);
    CASE("negative dtype", c[n].r.dt = (kern_dtype_t)-1);
    CASE("no buffer array", c[n].r.bufs = NULL);
    CASE("no buffers", c[n].r.nbufs = 0);
#undef CASE
    ASSERT_LE(n, RED_MAX);
    return n;
}

/* The accepted neighbours of the refusals: the same fields, in range. */
static size_t accepted_cases(const job_reduce_t *base, red_case_t *c)
{
    size_t n = 0;
    c[n++] = (red_case_t){"f32 SUM", *base};
    c[n] = (red_case_t){"AVG by 2", *base};
    c[n].r.op = KERN_AVG;
    c[n++].r.divisor = 2;
    c[n] = (red_case_t){"bf16 wire on f32", *base};
    c[n++].r.wire = RD_WIRE_BF16;
    c[n] = (red_case_t){"f16 wire on f32", *base};
    c[n++].r.wire = RD_WIRE_F16;
    /* Only a compressing wire needs f32: none and the default do not. */
    c[n] = (red_case_t){"none wire on f64", *base};
    c[n].r.dt = KERN_F64;
    c[n].r.count = RED_N / 2;
    c[n++].r.wire = RD_WIRE_NONE;
    c[n] = (red_case_t){"default wire on i32", *base};
    c[n++].r.dt = KERN_I32;
    return n;
}

/* ---- a stub backend: which descriptors reach one ---- */

typedef struct {
    job_t base;
    int calls;
    job_reduce_t last;
} stub_t;

static int stub_allreduce(job_t *job, const job_reduce_t *r, job_done_cb cb,
                          void *arg)
{
    (void)cb;
    (void)arg;
    stub_t *s = (stub_t *)job;
    s->calls++;
    s->last = *r;
    return 0;
}

static const job_ops_t stub_ops = {.name = "stub",
                                   .allreduce = stub_allreduce};

static void done_never(void *arg, int status)
{
    (void)arg;
    TEST_FAIL_("done_cb called (status %d)", status);
}

TEST_IMPL(job_reduce_refused_before_backend)
{
    float a[RED_N], b[RED_N], staging[RED_N];
    void *const bufs[2] = {a, b};
    job_reduce_t base = {.bufs = bufs, .nbufs = 2, .staging = staging,
                         .count = RED_N, .dt = KERN_F32, .op = KERN_SUM};
    stub_t stub = {.base = {.ops = &stub_ops}};
    red_case_t c[RED_MAX];
    size_t n = refused_cases(&base, c);
    for (size_t i = 0; i < n; i++) {
        int rc = job_allreduce(&stub.base, &c[i].r, done_never, NULL);
        ASSERT_MSG(rc == ST_EINVAL, "%s: %s", c[i].what, st_strerror(rc));
        ASSERT_MSG(stub.calls == 0, "%s reached the backend", c[i].what);
    }
    n = accepted_cases(&base, c);
    for (size_t i = 0; i < n; i++) {
        int rc = job_allreduce(&stub.base, &c[i].r, done_never, NULL);
        ASSERT_MSG(rc == 0, "%s: %s", c[i].what, st_strerror(rc));
        ASSERT_EQ(stub.calls, (int)i + 1);
        ASSERT(memcmp(&stub.last, &c[i].r, sizeof(stub.last)) == 0);
    }
    return 0;
}

/* ---- a solo job: nothing runs, nothing changes, nothing stays busy ---- */

typedef struct {
    uv_loop_t *loop;
    int calls;
    int status;
} done_t;

static void on_done(void *arg, int status)
{
    done_t *d = arg;
    d->calls++;
    d->status = status;
    uv_stop(d->loop);
}

static void on_guard(uv_timer_t *t)
{
    uv_stop(t->loop);
}

/* Runs loop until a done_cb (which stops it) or for ms at most. */
static void run_loop(uv_loop_t *loop, uint64_t ms)
{
    uv_timer_t guard;
    ASSERT_OK(uv_timer_init(loop, &guard));
    ASSERT_OK(uv_timer_start(&guard, on_guard, ms, 0));
    uv_run(loop, UV_RUN_DEFAULT);
    uv_close((uv_handle_t *)&guard, NULL);
    uv_run(loop, UV_RUN_NOWAIT);
}

static void view_ignored(void *arg, const job_view_t *view)
{
    (void)arg;
    (void)view;
}

static void fill(float *a, float *b, float *staging)
{
    for (int i = 0; i < RED_N; i++) {
        a[i] = (float)(i + 1);
        b[i] = (float)(10 * (i + 1));
        staging[i] = -1.0f;
    }
}

TEST_IMPL(job_reduce_refused_solo)
{
    uv_loop_t loop;
    ASSERT_OK(uv_loop_init(&loop));
    job_config_t cfg = {.spec = "solo"};
    job_cbs_t cbs = {.on_view = view_ignored};
    job_t *job = NULL;
    ASSERT_OK(job_create(&loop, &cfg, &cbs, &job));
    job_set_local_trainers(job, 2);
    float a[RED_N], b[RED_N], staging[RED_N];
    float a0[RED_N], b0[RED_N], s0[RED_N];
    void *const bufs[2] = {a, b};
    job_reduce_t base = {.bufs = bufs, .nbufs = 2, .staging = staging,
                         .count = RED_N, .dt = KERN_F32, .op = KERN_SUM};
    fill(a, b, staging);
    memcpy(a0, a, sizeof(a));
    memcpy(b0, b, sizeof(b));
    memcpy(s0, staging, sizeof(staging));
    done_t done = {.loop = &loop};
    red_case_t c[RED_MAX];
    size_t n = refused_cases(&base, c);
    for (size_t i = 0; i < n; i++) {
        int rc = job_allreduce(job, &c[i].r, on_done, &done);
        ASSERT_MSG(rc == ST_EINVAL, "%s: %s", c[i].what, st_strerror(rc));
        run_loop(&loop, 20);
        ASSERT_MSG(done.calls == 0, "%s: done_cb ran", c[i].what);
        ASSERT_MSG(memcmp(a, a0, sizeof(a)) == 0 &&
                   memcmp(b, b0, sizeof(b)) == 0 &&
                   memcmp(staging, s0, sizeof(staging)) == 0,
                   "%s: a buffer changed", c[i].what);
    }
    /* The backend is free (a refusal that had reached solo would make
     * this "already in flight"), and a reduction is seen when it runs. */
    job_reduce_t avg = base;
    avg.op = KERN_AVG;
    avg.divisor = 2;
    ASSERT_OK(job_allreduce(job, &avg, on_done, &done));
    run_loop(&loop, 30000);
    ASSERT_EQ(done.calls, 1);
    ASSERT_EQ(done.status, 0);
    for (int i = 0; i < RED_N; i++) {
        ASSERT_EQ(a[i], (a0[i] + b0[i]) / 2);
        ASSERT_EQ(b[i], a[i]);
    }
    job_destroy(job);
    uv_run(&loop, UV_RUN_DEFAULT);
    ASSERT_OK(uv_loop_close(&loop));
    return 0;
}
