/*
 * backend.c - picks a backend from its spec. A new backend (the etcd + UCX
 * ring) adds one line to the table and its create function.
 */
#include "daemon/backend.h"

#include <string.h>

#include "common/log.h"
#include "common/status.h"

typedef struct {
    const char *name;   /* the spec is NAME or NAME:ARGS */
    int takes_args;
    int (*create)(uv_loop_t *loop, const char *args,
                  const dmn_backend_cbs_t *cbs, dmn_backend_t **be_p);
} backend_entry_t;

static int solo_create(uv_loop_t *loop, const char *args,
                       const dmn_backend_cbs_t *cbs, dmn_backend_t **be_p)
{
    (void)args;
    return dmn__backend_solo_create(loop, NULL, cbs, be_p);
}

static const backend_entry_t backends[] = {
    {"solo", 0, solo_create},
    {"fake", 1, dmn__backend_solo_create},
};

int dmn_backend_create(uv_loop_t *loop, const char *spec,
                       const dmn_backend_cbs_t *cbs, dmn_backend_t **be_p)
{
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
        return b->create(loop, colon ? colon + 1 : NULL, cbs, be_p);
    }
    RD_ERROR("unknown backend '%s' (solo; the ring backend is not built "
             "yet)", spec);
    return ST_ECONFIG;
}
