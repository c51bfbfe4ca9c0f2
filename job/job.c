/*
 * job.c - picks a job's backend from its spec (a new backend adds one line
 * to the table and its create function), and the node-local halves of an
 * allreduce that every backend shares.
 */
#include "job/job.h"

#include <string.h>

#include "common/log.h"
#include "common/status.h"

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

static int ring_create(uv_loop_t *loop, const char *args,
                       const job_config_t *cfg, const job_cbs_t *cbs,
                       job_t **job_p)
{
    (void)args;
    return job__ring_create(loop, cfg, cbs, job_p);
}

static const backend_entry_t backends[] = {
    {"solo", 0, solo_create},
    {"fake", 1, fake_create},
    {"ring", 0, ring_create},
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

/* Fused: segment s of every trainer reduced into its place in staging. */
static void *reduce_fused(const job_reduce_t *r)
{
    size_t esz = kern_dtype_size(r->dt), off = 0;
    uint32_t g = r->nsegs;
    for (uint32_t s = 0; s < g; s++) {
        size_t n = r->seg_counts[s];
        char *dst = (char *)r->staging + off * esz;
        if (r->nbufs == 2)
            kern_reduce3(r->dt, r->op, dst, r->bufs[s], r->bufs[g + s], n);
        else
            memcpy(dst, r->bufs[s], n * esz);
        for (uint32_t t = r->nbufs == 2 ? 2 : 1; t < r->nbufs; t++)
            kern_reduce(r->dt, r->op, dst, r->bufs[t * g + s], n);
        off += n;
    }
    return r->staging;
}

void *job_reduce_local(const job_reduce_t *r)
{
    if (r->nsegs > 1)
        return reduce_fused(r);
    if (r->nbufs == 1)
        return r->bufs[0];
    if (r->nbufs == 2) {
        kern_reduce3(r->dt, r->op, r->staging, r->bufs[0], r->bufs[1],
                     r->count);
        return r->staging;
    }
    memcpy(r->staging, r->bufs[0], r->count * kern_dtype_size(r->dt));
    for (uint32_t i = 1; i < r->nbufs; i++)
        kern_reduce(r->dt, r->op, r->staging, r->bufs[i], r->count);
    return r->staging;
}

void job_reduce_copy_back(const job_reduce_t *r, void *buf)
{
    if (r->nsegs > 1) {
        size_t esz = kern_dtype_size(r->dt), off = 0;
        for (uint32_t s = 0; s < r->nsegs; s++) {
            size_t n = r->seg_counts[s];
            for (uint32_t t = 0; t < r->nbufs; t++)
                memcpy(r->bufs[t * r->nsegs + s], (char *)buf + off * esz,
                       n * esz);
            off += n;
        }
        return;
    }
    size_t bytes = r->count * kern_dtype_size(r->dt);
    for (uint32_t i = 0; i < r->nbufs; i++)
        if (r->bufs[i] != buf)
            memcpy(r->bufs[i], buf, bytes);
}
