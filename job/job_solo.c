/*
 * job_solo.c - the one-node backend (--standalone) and its test twin.
 *
 * solo: the node is the job. Every collective is complete once the local
 * reduction is done, so allreduce does that and broadcast nothing, both
 * deferred (backends never call back re-entrantly). The reduction runs on
 * libuv's thread pool: the loop keeps answering the trainers and /metrics
 * meanwhile, and copies or sums no tensor byte itself.
 *
 * fake: solo plus scripted view changes. "fake:reshape=3,7" makes the first
 * collective of step 3 and of step 7 fail with ST_ERESHAPE and bumps the
 * generation, exactly what the ring backend does when a member dies
 * mid-collective; tests use it to check that trainers redo the step.
 * "fake:late_view=5" makes the first collective of step 5 complete with
 * its result while a newer generation has arrived (newest_generation):
 * the ring backend's view that comes after the ring finished, before its
 * abort could stop it. "fake:hold=5@PATH" holds the first collective of
 * step 5 in flight until a file exists at PATH (looked for every 5 ms, at
 * most 60 s), so a test can act while a collective is with the backend
 * (a trainer going back to step_begin, say) instead of racing it.
 */
#include "job/job.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/status.h"

#define SOLO_MAX_RESHAPES 16
#define SOLO_HOLD_POLL_MS 5
#define SOLO_HOLD_MAX_MS 60000

typedef struct {
    job_t base;
    uv_loop_t *loop;
    uv_timer_t timer;      /* defers completions */
    uv_work_t work;        /* the local reduction, on the pool */
    int working;           /* work queued, its after-callback not run */
    int closed;            /* destroyed: the last of timer/work frees */
    int timer_closed;
    pthread_mutex_t mu;    /* reduced, for a destroy that must wait */
    pthread_cond_t cv;
    int reduced;           /* the pool thread is done with the buffers */
    job_cbs_t cbs;
    job_view_t view;
    job_done_cb done_cb;   /* the in-flight collective, or NULL */
    void *done_arg;
    int done_status;
    job_reduce_t red;      /* the in-flight allreduce (nbufs 0: none) */
    uint64_t reshape_at[SOLO_MAX_RESHAPES];
    int nreshape;
    int late_view;         /* reshape_at: complete, newer view known */
    uint64_t hold_step;    /* hold its first collective (UINT64_MAX: no) */
    char *hold_path;       /* ... until this file exists */
    int holding;           /* ms the in-flight collective has been held */
    int ckpt_req;          /* a checkpoint was asked for */
    int ckpt_in_step;      /* ... and the current step's view says so */
} solo_t;

static void solo_set_local_trainers(job_t *be, uint32_t n)
{
    solo_t *s = (solo_t *)be;
    if (n == s->view.global_trainers)
        return;
    /* One node: the local trainers are the job, a new count a new view. */
    s->view.global_trainers = n;
    s->view.generation++;
}

static void solo_set_step(job_t *be, uint64_t step)
{
    ((solo_t *)be)->view.step = step;
}

static void solo_get_view(job_t *be, job_view_t *view_p)
{
    solo_t *s = (solo_t *)be;
    *view_p = s->view;
    view_p->ckpt_requested = (uint32_t)s->ckpt_req;
    s->ckpt_in_step = s->ckpt_req;
}

/* Kept until a step whose view carried it completes: a step broken and
 * redone still ends with the checkpoint. */
static void solo_request_ckpt(job_t *be)
{
    ((solo_t *)be)->ckpt_req = 1;
}

static void solo_finish(solo_t *s, int status)
{
    job_done_cb cb = s->done_cb;
    s->done_cb = NULL;
    s->red.nbufs = 0;
    if (cb == NULL)
        return;
    cb(s->done_arg, status);
    if (status == ST_ERESHAPE && s->cbs.on_view != NULL)
        s->cbs.on_view(s->cbs.arg, &s->view);
}

/* The node is the job: the local reduction is the whole allreduce. */
static void solo_reduce(uv_work_t *w)
{
    solo_t *s = w->data;
    void *buf = job_reduce_local(&s->red);
    if (s->red.op == KERN_AVG)
        (void)kern_avg_finish(s->red.dt, buf, s->red.count,
                              s->red.divisor);
    job_reduce_copy_back(&s->red, buf);
    pthread_mutex_lock(&s->mu);
    s->reduced = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void solo_free(solo_t *s)
{
    free(s->hold_path);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static void solo_reduced(uv_work_t *w, int status)
{
    solo_t *s = w->data;
    s->working = 0;
    if (s->closed) {
        if (s->timer_closed)
            solo_free(s);
        return;
    }
    solo_finish(s, status == 0 ? 0 : ST_EABORTED);
}

static void solo_fire(uv_timer_t *t);

/* The scripted hold: 1 while the in-flight collective must wait (the
 * timer is re-armed), 0 once it may complete. */
static int solo_hold(solo_t *s)
{
    if (s->holding < 0)
        return 0;
    if (s->holding == 0)
        RD_INFO("fake backend: holding the collective of step %llu until "
                "%s exists", (unsigned long long)s->view.step, s->hold_path);
    if (access(s->hold_path, F_OK) == 0 || s->holding >= SOLO_HOLD_MAX_MS) {
        RD_INFO("fake backend: released the collective of step %llu after "
                "%d ms", (unsigned long long)s->view.step, s->holding);
        s->holding = -1;
        return 0;
    }
    s->holding += SOLO_HOLD_POLL_MS;
    uv_timer_start(&s->timer, solo_fire, SOLO_HOLD_POLL_MS, 0);
    return 1;
}

static void solo_fire(uv_timer_t *t)
{
    solo_t *s = t->data;
    if (s->done_cb == NULL || solo_hold(s))
        return;
    if (s->done_status == 0 && s->red.nbufs > 0) {
        s->work.data = s;
        s->reduced = 0;
        int rc = uv_queue_work(s->loop, &s->work, solo_reduce,
                               solo_reduced);
        if (rc == 0) {
            s->working = 1;
            return;
        }
        RD_WARN("backend: local reduction not queued: %s",
                uv_strerror(rc));
        solo_finish(s, ST_EABORTED);
        return;
    }
    solo_finish(s, s->done_status);
}

/* The scripted fault: is this the first collective of a listed step? */
static int solo_take_reshape(solo_t *s)
{
    for (int i = 0; i < s->nreshape; i++) {
        if (s->reshape_at[i] == s->view.step) {
            s->reshape_at[i] = UINT64_MAX; /* once */
            s->view.generation++;
            RD_INFO("fake backend: view change at step %llu (generation "
                    "%llu)%s", (unsigned long long)s->view.step,
                    (unsigned long long)s->view.generation,
                    s->late_view ? ", after the collective finished" : "");
            return 1;
        }
    }
    return 0;
}

static int solo_start(solo_t *s, job_done_cb cb, void *arg)
{
    if (s->done_cb != NULL) {
        RD_ERROR("backend: a collective is already in flight");
        return ST_EINVAL;
    }
    s->done_cb = cb;
    s->done_arg = arg;
    s->done_status = solo_take_reshape(s) && !s->late_view ? ST_ERESHAPE
                                                            : 0;
    s->holding = -1;
    if (s->hold_path != NULL && s->hold_step == s->view.step) {
        s->hold_step = UINT64_MAX; /* once */
        s->holding = 0;
    }
    return uv_timer_start(&s->timer, solo_fire, 0, 0);
}

static int solo_allreduce(job_t *be, const job_reduce_t *r, job_done_cb cb,
                          void *arg)
{
    solo_t *s = (solo_t *)be;
    int rc = solo_start(s, cb, arg);
    if (rc == 0)
        s->red = *r;
    return rc;
}

static int solo_broadcast(job_t *be, void *buf, size_t bytes,
                          uint32_t root, job_done_cb cb, void *arg)
{
    (void)buf;
    (void)bytes;
    (void)root;
    return solo_start((solo_t *)be, cb, arg);
}

static void solo_step_end(job_t *be, uint64_t step)
{
    solo_t *s = (solo_t *)be;
    s->view.step = step + 1;
    if (s->ckpt_in_step)
        s->ckpt_req = 0; /* this step's end takes the checkpoint */
    s->ckpt_in_step = 0;
}

static int solo_leave(job_t *be, job_done_cb cb, void *arg)
{
    return solo_start((solo_t *)be, cb, arg);
}

static void solo_closed(uv_handle_t *h)
{
    solo_t *s = h->data;
    s->timer_closed = 1;
    if (!s->working)
        solo_free(s);
}

/*
 * The daemon unmaps the trainers' buffers once its handles are closed, so
 * a reduction still running on the pool is waited for here (a bounded
 * sum); one not started is cancelled. Its after-callback frees s.
 */
static void solo_destroy(job_t *be)
{
    solo_t *s = (solo_t *)be;
    s->done_cb = NULL;
    s->closed = 1;
    if (s->working && uv_cancel((uv_req_t *)&s->work) != 0) {
        pthread_mutex_lock(&s->mu);
        while (!s->reduced)
            pthread_cond_wait(&s->cv, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    uv_close((uv_handle_t *)&s->timer, solo_closed);
}

static const job_ops_t solo_ops = {
    .name = "solo",
    .set_local_trainers = solo_set_local_trainers,
    .get_view = solo_get_view,
    .set_step = solo_set_step,
    .allreduce = solo_allreduce,
    .broadcast = solo_broadcast,
    .step_end = solo_step_end,
    .request_ckpt = solo_request_ckpt,
    .leave = solo_leave,
    .destroy = solo_destroy,
};

static uint64_t fake_newest_generation(job_t *be)
{
    return ((solo_t *)be)->view.generation;
}

static const job_ops_t fake_ops = {
    .name = "fake",
    .set_local_trainers = solo_set_local_trainers,
    .get_view = solo_get_view,
    .set_step = solo_set_step,
    .allreduce = solo_allreduce,
    .broadcast = solo_broadcast,
    .step_end = solo_step_end,
    .request_ckpt = solo_request_ckpt,
    .leave = solo_leave,
    .destroy = solo_destroy,
    .newest_generation = fake_newest_generation,
};

/* "reshape=3,7" -> reshape_at = {3, 7}; "late_view=5" the same with
 * late_view set. */
static int fake_parse(solo_t *s, const char *args)
{
    const char *p = args;
    if (strncmp(p, "hold=", 5) == 0) {
        char *end;
        s->hold_step = strtoull(p + 5, &end, 10);
        if (end == p + 5 || *end != '@' || end[1] == '\0')
            goto bad;
        s->hold_path = strdup(end + 1);
        return s->hold_path != NULL ? 0 : ST_ENOMEM;
    }
    if (strncmp(p, "late_view=", 10) == 0) {
        s->late_view = 1;
        p += 10;
    } else if (strncmp(p, "reshape=", 8) == 0) {
        p += 8;
    } else {
        goto bad;
    }
    while (*p != '\0') {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || s->nreshape == SOLO_MAX_RESHAPES)
            goto bad;
        s->reshape_at[s->nreshape++] = v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p != '\0')
            goto bad;
    }
    return 0;
bad:
    RD_ERROR("backend: bad fake spec '%s' (want reshape=STEP[,STEP...], "
             "late_view=STEP[,STEP...] or hold=STEP@PATH)", args);
    return ST_ECONFIG;
}

int job__solo_create(uv_loop_t *loop, const char *fake_args,
                     const job_cbs_t *cbs, job_t **be_p)
{
    solo_t *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return ST_ENOMEM;
    s->cbs = *cbs;
    s->loop = loop;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    /* Generation 0: no view yet; the first trainers make generation 1. */
    s->view = (job_view_t){.generation = 0, .node_count = 1};
    s->hold_step = UINT64_MAX;
    s->holding = -1;
    s->base.ops = fake_args != NULL ? &fake_ops : &solo_ops;
    int rc = ST_ECONFIG;
    if (fake_args != NULL && fake_parse(s, fake_args) != 0)
        goto err_free;
    rc = uv_timer_init(loop, &s->timer);
    if (rc != 0) {
        RD_ERROR("backend: uv_timer_init: %s", uv_strerror(rc));
        goto err_free;
    }
    s->timer.data = s;
    *be_p = &s->base;
    return 0;

err_free:
    solo_free(s);
    return rc;
}
