/*
 * job.c - picks a job's backend from its spec (a new backend adds one line
 * to the table and its create function), and the node-local halves of an
 * allreduce that every backend shares.
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

/* The ring's view of the node's buffers: one reduction order for the
 * staged path here and the ring's pipelined one (ring_allreduce_local). */
static ring_local_t local_of(const job_reduce_t *r)
{
    return (ring_local_t){.bufs = r->bufs, .nbufs = r->nbufs,
                          .nsegs = r->nsegs, .seg_counts = r->seg_counts};
}

void *job_reduce_local(const job_reduce_t *r)
{
    if (r->nbufs == 1 && r->nsegs <= 1)
        return r->bufs[0];
    ring_local_t l = local_of(r);
    ring_local_gather(&l, r->dt, r->op, r->staging, 0, r->count);
    return r->staging;
}

void job_reduce_copy_back(const job_reduce_t *r, void *buf)
{
    ring_local_t l = local_of(r);
    ring_local_scatter(&l, kern_dtype_size(r->dt), buf, 0, r->count);
}
