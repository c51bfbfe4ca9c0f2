/*
 * job.c - picks a job's backend from its spec (a new backend adds one line
 * to the table and its create function), the daemon's calls into the job
 * (one per op, each owning the op's "may be NULL"), and the node-local
 * halves of an allreduce that every backend shares.
 */
#include "job/job.h"

#include <string.h>

#include "common/log.h"
#include "common/status.h"
#include "ring/ring.h"

typedef struct {
    const char *name;   /* the spec is NAME or NAME:ARGS */
    int takes_args;
    int (*create)(uv_loop_t *loop, const char *args,
                  const job_config_t *cfg, const job_cbs_t *cbs,
                  job_t **job_p);
} backend_entry_t;

static int solo_create(uv_loop_t *loop, const char *args,
                       const job_config_t *cfg, const job_cbs_t *cbs,
                       job_t **job_p)
{
    (void)args;
    (void)cfg;
    return job__solo_create(loop, NULL, cbs, job_p);
}

static int fake_create(uv_loop_t *loop, const char *args,
                       const job_config_t *cfg, const job_cbs_t *cbs,
                       job_t **job_p)
{
    (void)cfg;
    return job__solo_create(loop, args, cbs, job_p);
}

static int ring_backend_create(uv_loop_t *loop, const char *args,
                               const job_config_t *cfg,
                               const job_cbs_t *cbs, job_t **job_p)
{
    (void)args;
    return job__ring_create(loop, cfg, cbs, job_p);
}

static const backend_entry_t backends[] = {
    {"solo", 0, solo_create},
    {"fake", 1, fake_create},
    {"ring", 0, ring_backend_create},
};

int job_create(uv_loop_t *loop, const job_config_t *cfg,
               const job_cbs_t *cbs, job_t **job_p)
{
    const char *spec = cfg->spec != NULL ? cfg->spec : "solo";
    const char *colon = strchr(spec, ':');
    size_t nlen = colon ? (size_t)(colon - spec) : strlen(spec);
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
        const backend_entry_t *b = &backends[i];
        if (strlen(b->name) != nlen || strncmp(b->name, spec, nlen) != 0)
            continue;
        if ((colon != NULL) != b->takes_args) {
            RD_ERROR("backend '%s': %s", spec, b->takes_args
                     ? "arguments required (NAME:ARGS)"
                     : "takes no arguments");
            return ST_ECONFIG;
        }
        return b->create(loop, colon ? colon + 1 : NULL, cfg, cbs, job_p);
    }
    RD_ERROR("unknown backend '%s' (solo, fake:ARGS, ring)", spec);
    return ST_ECONFIG;
}

/* ---- the daemon's calls (job.h) ---------------------------------------- */

const char *job_name(const job_t *job)
{
    return job->ops->name;
}

void job_set_local_trainers(job_t *job, uint32_t n)
{
    job->ops->set_local_trainers(job, n);
}

int job_ready(job_t *job, job_done_cb cb, void *arg)
{
    return job->ops->ready != NULL ? job->ops->ready(job, cb, arg) : 1;
}

void job_get_view(job_t *job, job_view_t *view_p)
{
    job->ops->get_view(job, view_p);
}

void job_set_step(job_t *job, uint64_t step)
{
    if (job->ops->set_step != NULL)
        job->ops->set_step(job, step);
}

void job_trainer_lost(job_t *job, int in_step, uint32_t remaining)
{
    if (job->ops->trainer_lost != NULL)
        job->ops->trainer_lost(job, in_step, remaining);
}

/*
 * The same checks whatever the backend, so a caller's mistake fails the
 * same way on one node as on many: an AVG without its divisor (or a SUM
 * with one) would otherwise be a silently wrong sum on one backend and an
 * error on another.
 */
static int reduce_check(const job_reduce_t *r)
{
    if ((unsigned)r->op >= KERN_OP_COUNT ||
        (r->op == KERN_AVG) != (r->divisor != 0) ||
        (unsigned)r->wire >= RD_WIRE_COUNT ||
        kern_dtype_size(r->dt) == 0 ||
        (rd_wire_compresses(r->wire) && r->dt != KERN_F32) ||
        r->bufs == NULL || r->nbufs == 0) {
        RD_ERROR("job_allreduce: bad op %s, divisor %u, wire %s, dtype %s "
                 "or %u buffers", kern_op_name(r->op), r->divisor,
                 rd_wire_name(r->wire), kern_dtype_name(r->dt), r->nbufs);
        return ST_EINVAL;
    }
    return 0;
}

int job_allreduce(job_t *job, const job_reduce_t *r, job_done_cb cb,
                  void *arg)
{
    int rc = reduce_check(r);
    return rc != 0 ? rc : job->ops->allreduce(job, r, cb, arg);
}

int job_broadcast(job_t *job, void *buf, size_t bytes, uint32_t root,
                  job_done_cb cb, void *arg)
{
    return job->ops->broadcast(job, buf, bytes, root, cb, arg);
}

void job_step_end(job_t *job, uint64_t step)
{
    job->ops->step_end(job, step);
}

int job_commits(const job_t *job)
{
    return job->ops->commit != NULL;
}

int job_commit(job_t *job, job_done_cb cb, void *arg)
{
    return job->ops->commit != NULL ? job->ops->commit(job, cb, arg) : 1;
}

int job_leave(job_t *job, job_done_cb cb, void *arg)
{
    return job->ops->leave(job, cb, arg);
}

int job_takes_ckpt_requests(const job_t *job)
{
    return job->ops->request_ckpt != NULL;
}

void job_request_ckpt(job_t *job)
{
    if (job->ops->request_ckpt != NULL)
        job->ops->request_ckpt(job);
}

int job_records_ckpts(const job_t *job)
{
    return job->ops->ckpt_report != NULL;
}

int job_ckpt_report(job_t *job, const job_ckpt_files_t *f, job_done_cb cb,
                    void *arg)
{
    if (job->ops->ckpt_report == NULL)
        return ST_ENOTSUP;
    return job->ops->ckpt_report(job, f, cb, arg);
}

int job_hop_stats(job_t *job, job_hops_t *out)
{
    if (job->ops->hop_stats == NULL)
        return ST_ENOTSUP;
    job->ops->hop_stats(job, out);
    return 0;
}

int job_blame_stats(job_t *job, job_blame_t *out)
{
    if (job->ops->blame_stats == NULL)
        return ST_ENOTSUP;
    job->ops->blame_stats(job, out);
    return 0;
}

uint64_t job_newest_generation(job_t *job)
{
    return job->ops->newest_generation != NULL
               ? job->ops->newest_generation(job)
               : 0;
}

/* The ring's view of the node's buffers: one reduction order for the
 * staged path here and the ring's pipelined one (ring_allreduce_t's
 * local). */
static ring_local_t local_of(const job_reduce_t *r)
{
    return (ring_local_t){.bufs = r->bufs, .nbufs = r->nbufs,
                          .nsegs = r->nsegs, .seg_counts = r->seg_counts};
}

void *job_reduce_region(const job_reduce_t *r)
{
    return r->nsegs <= 1 ? r->bufs[0] : r->staging;
}

void *job_reduce_local(const job_reduce_t *r)
{
    void *region = job_reduce_region(r);
    if (r->nbufs == 1 && r->nsegs <= 1)
        return region;
    ring_local_t l = local_of(r);
    ring_local_gather(&l, r->dt, r->op, region, 0, r->count);
    return region;
}

void job_reduce_copy_back(const job_reduce_t *r, void *buf)
{
    ring_local_t l = local_of(r);
    ring_local_scatter(&l, kern_dtype_size(r->dt), buf, 0, r->count);
}
