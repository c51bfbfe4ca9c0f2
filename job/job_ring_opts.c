/*
 * job_ring_opts.c - the ring options every node of a job must share
 * (chunk size, the second ring, the default wire compression, the grid,
 * the step's commit round, the daemon's fusion cap),
 * as the job's views carry them: the leader that writes the first view
 * puts its own in it as "opts", later views copy them (membership), and
 * every node runs its rings with the view's, whatever its own config says.
 * A node that disagreed would send messages of other sizes or on another
 * ring, which its neighbours drop until a deadline evicts someone.
 */
#include "job/job_ring-int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

/* The environment variables ring_opts_default() reads for these fields:
 * a daemon takes them from its config, so that a job can agree on them. */
static const char *const shared_env[] = {
    "RINGD_RING_CHUNK", "RINGD_RING_BIDIR", "RINGD_RING_WIRE",
    "RINGD_RING_GRID_MIN_NODES", "RINGD_RING_GRID_MAX_BYTES",
    "RINGD_RING_GRID_COLS", "RINGD_RING_SPLIT",
};

void job__opts_from_config(const job_config_t *cfg, ring_opts_t *o)
{
    for (size_t i = 0; i < sizeof(shared_env) / sizeof(shared_env[0]); i++)
        if (getenv(shared_env[i]) != NULL)
            RD_WARN("ring backend: %s is ignored: ringd takes the job's "
                    "ring options from its config and the job's view",
                    shared_env[i]);
    o->chunk_bytes = cfg->ring_chunk_bytes > 0
                         ? (size_t)cfg->ring_chunk_bytes : RING_CHUNK_DEFAULT;
    o->bidirectional = cfg->ring_bidirectional <= RING_BIDIR_AUTO
                           ? (int)cfg->ring_bidirectional : RING_BIDIR_AUTO;
    o->wire = rd_wire_concrete(cfg->ring_wire, RD_WIRE_NONE);
    o->grid_min_nodes = cfg->ring_grid_min_nodes;
    o->grid_max_bytes = (size_t)cfg->ring_grid_max_bytes;
    o->grid_cols = cfg->ring_grid_cols;
    o->split_lone = 1;
}

char *job__opts_json(const ring_opts_t *o, const job_xopts_t *x)
{
    char *s = NULL;
    if (asprintf(&s, "{\"chunk\":%zu,\"bidir\":%d,\"wire\":\"%s\","
                 "\"grid_min\":%u,\"grid_max\":%zu,\"grid_cols\":%u,"
                 "\"commit\":%d,\"fuse\":%llu,\"split\":%d}",
                 o->chunk_bytes, o->bidirectional,
                 rd_wire_name(o->wire), o->grid_min_nodes,
                 o->grid_max_bytes, o->grid_cols, x->commit ? 1 : 0,
                 (unsigned long long)x->fuse_bytes, o->split_lone ? 1 : 0) < 0)
        return NULL;
    return s;
}

/* One numeric field of the view's options into *x; absent: unchanged. */
static int take_num(const cJSON *o, const char *key, double lo, double hi,
                    uint64_t *x)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    long long v;
    if (j == NULL)
        return 0;
    if (rd_json_int(j, lo, hi, &v) != 0)
        return ST_EPROTO;
    *x = (uint64_t)v;
    return 0;
}

/* The view names a concrete format ("none", "bf16", "f16"). */
static int take_wire(const cJSON *o, rd_wire_t *w)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "wire");
    if (j == NULL)
        return 0;
    if (!cJSON_IsString(j) || rd_wire_parse(j->valuestring, w) != 0)
        return ST_EPROTO;
    return 0;
}

/* The fields of json over *o and *x; a field the view lacks keeps the
 * value given. */
static int parse_opts(const char *json, ring_opts_t *o, job_xopts_t *x)
{
    cJSON *j = cJSON_Parse(json);
    uint64_t chunk = o->chunk_bytes, bidir = (uint64_t)o->bidirectional;
    uint64_t com = (uint64_t)x->commit, fuse = x->fuse_bytes;
    uint64_t gmin = o->grid_min_nodes, gmax = o->grid_max_bytes;
    uint64_t gcols = o->grid_cols;
    /* Absent: a view of a ringd from before the rule, whose nodes send a
     * lone chunk whole; every node of that job must do the same. */
    uint64_t split = 0;
    rd_wire_t wire = o->wire;
    int rc = cJSON_IsObject(j) ? 0 : ST_EPROTO;
    if (rc == 0)
        rc = take_num(j, "chunk", 64, 1 << 30, &chunk);
    if (rc == 0)
        rc = take_num(j, "bidir", RING_BIDIR_OFF, RING_BIDIR_AUTO, &bidir);
    if (rc == 0)
        rc = take_num(j, "grid_min", 0, UINT32_MAX, &gmin);
    if (rc == 0)
        rc = take_num(j, "grid_max", 0, 9007199254740992.0, &gmax);
    if (rc == 0)
        rc = take_num(j, "grid_cols", 0, UINT32_MAX, &gcols);
    if (rc == 0)
        rc = take_num(j, "commit", 0, 1, &com);
    if (rc == 0)
        rc = take_num(j, "fuse", 0, (double)JOB_FUSE_MAX_BYTES, &fuse);
    if (rc == 0)
        rc = take_num(j, "split", 0, 1, &split);
    if (rc == 0)
        rc = take_wire(j, &wire);
    cJSON_Delete(j);
    if (rc != 0)
        return rc;
    x->commit = (int)com;
    x->fuse_bytes = fuse;
    o->chunk_bytes = (size_t)chunk;
    o->bidirectional = (int)bidir;
    o->grid_min_nodes = (uint32_t)gmin;
    o->grid_max_bytes = (size_t)gmax;
    o->grid_cols = (uint32_t)gcols;
    o->split_lone = (int)split;
    o->wire = wire;
    return 0;
}

/* The config's words for o->bidirectional. */
static const char *bidir_name(int b)
{
    return b == RING_BIDIR_AUTO ? "auto" : b ? "true" : "false";
}

/* "name mine (job's theirs)" for each field that differs, into buf. */
static void describe_diff(const ring_opts_t *mine, const ring_opts_t *job,
                          const job_xopts_t *my_x, const job_xopts_t *x,
                          char *buf, size_t n)
{
    size_t at = 0;
    buf[0] = '\0';
#define DIFF(cond, ...)                                                  \
    do {                                                                 \
        if ((cond) && at < n) {                                          \
            int k = snprintf(buf + at, n - at, "%s", at ? ", " : "");    \
            at += k > 0 ? (size_t)k : 0;                                 \
            if (at < n)                                                  \
                k = snprintf(buf + at, n - at, __VA_ARGS__);             \
            at += k > 0 ? (size_t)k : 0;                                 \
        }                                                                \
    } while (0)
    DIFF(mine->chunk_bytes != job->chunk_bytes, "chunk %zu B (job's %zu)",
         mine->chunk_bytes, job->chunk_bytes);
    DIFF(mine->bidirectional != job->bidirectional,
         "bidirectional %s (job's %s)", bidir_name(mine->bidirectional),
         bidir_name(job->bidirectional));
    DIFF(mine->wire != job->wire, "wire %s (job's %s)",
         rd_wire_name(mine->wire), rd_wire_name(job->wire));
    DIFF(mine->grid_min_nodes != job->grid_min_nodes,
         "grid-min-nodes %u (job's %u)", mine->grid_min_nodes,
         job->grid_min_nodes);
    DIFF(mine->grid_max_bytes != job->grid_max_bytes,
         "grid-max %zu B (job's %zu)", mine->grid_max_bytes,
         job->grid_max_bytes);
    DIFF(mine->grid_cols != job->grid_cols, "grid-cols %u (job's %u)",
         mine->grid_cols, job->grid_cols);
    DIFF(my_x->commit != x->commit, "step-commit %d (job's %d)",
         my_x->commit, x->commit);
    DIFF(my_x->fuse_bytes != x->fuse_bytes, "fuse %llu B (job's %llu)",
         (unsigned long long)my_x->fuse_bytes,
         (unsigned long long)x->fuse_bytes);
#undef DIFF
}

/*
 * The options of view v over b->ring_opts, from this node's own
 * (b->my_opts) for what the view does not say. Said once per change of
 * the job's options: what they are, and a warning when this node's config
 * differs. A view whose options this node cannot read keeps the ones in
 * use (an error line): membership checked its shape, so only a newer
 * writer's values can get here.
 */
void job__opts_install(job_ring_t *b, const mb_view_t *v)
{
    ring_opts_t o = b->my_opts;
    job_xopts_t x = b->my_x;
    const char *text = v->opts != NULL ? v->opts : "";
    if (v->opts != NULL && parse_opts(v->opts, &o, &x) != 0) {
        RD_ERROR("ring backend: view %llu has ring options this node "
                 "cannot use (%.200s): keeping chunk %zu B, wire %s",
                 (unsigned long long)v->generation, v->opts,
                 b->ring_opts.chunk_bytes,
                 rd_wire_name(b->ring_opts.wire));
        return;
    }
    o.on_quiet = b->ring_opts.on_quiet;
    o.on_quiet_arg = b->ring_opts.on_quiet_arg;
    o.on_lossy = b->ring_opts.on_lossy;
    o.on_lossy_arg = b->ring_opts.on_lossy_arg;
    o.on_mismatch = b->ring_opts.on_mismatch;
    o.on_mismatch_arg = b->ring_opts.on_mismatch_arg;
    b->ring_opts = o;
    b->x = x;
    if (b->opts_seen != NULL && strcmp(b->opts_seen, text) == 0)
        return;
    free(b->opts_seen);
    b->opts_seen = strdup(text);
    RD_INFO("ring backend: the job's ring options: chunk %zu B, wire %s, "
            "bidirectional %s, grid from %u nodes (max %zu B, %u cols), "
            "step commit %s, fusion up to %llu B, lone chunks %s%s",
            o.chunk_bytes, rd_wire_name(o.wire), bidir_name(o.bidirectional),
            o.grid_min_nodes, o.grid_max_bytes, o.grid_cols,
            x.commit ? "on" : "off", (unsigned long long)x.fuse_bytes,
            o.split_lone ? "split" : "whole",
            v->opts != NULL ? "" : " (the view has none: this node's)");
    char diff[512];
    describe_diff(&b->my_opts, &o, &b->my_x, &x, diff,
                  sizeof(diff));
    if (diff[0] != '\0')
        RD_WARN("ring backend: this node's config differs from the job's "
                "ring options: %s; following the job's", diff);
}
