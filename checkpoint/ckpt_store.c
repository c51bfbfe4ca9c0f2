/*
 * ckpt_store.c - the on-disk layout of checkpoints, retention and restore.
 *
 * A step directory is complete when MANIFEST.json exists; the manifest is
 * written last and atomically, so a crash at any moment leaves either a
 * complete checkpoint or a directory that restore ignores. Delta shards
 * name their base step; retention keeps every base a kept checkpoint
 * still needs, and restore decodes the chain from the full shard up.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"

#define MANIFEST_NAME "MANIFEST.json"
#define MANIFEST_MAX (64u << 20)
#define MAX_CHAIN 64 /* delta chain length we are willing to follow */

int ckpt_store_step_dir(const char *root, uint64_t step, char *buf,
                        size_t len)
{
    int n = snprintf(buf, len, "%s/step-%020" PRIu64, root, step);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static void shard_name(char *buf, size_t len, uint32_t shard, int replica)
{
    snprintf(buf, len, "%s-%05u.rckp", replica ? "replica" : "shard", shard);
}

int ckpt_store_put(const char *root, uint64_t step, uint32_t shard,
                   int replica, const void *file, size_t len)
{
    char dir[PATH_MAX], name[64];
    int rc = ckpt_store_step_dir(root, step, dir, sizeof(dir));
    if (rc == 0)
        rc = ckpt_mkdirs(dir);
    if (rc != 0) {
        RD_ERROR("checkpoint: cannot create %s: %s", dir, st_strerror(rc));
        return rc;
    }
    shard_name(name, sizeof(name), shard, replica);
    return ckpt_write_atomic(dir, name, file, len);
}

int ckpt_store_shard_path(const char *root, uint64_t step, uint32_t shard,
                          int replica, char *buf, size_t len)
{
    char dir[PATH_MAX], name[64];
    int rc = ckpt_store_step_dir(root, step, dir, sizeof(dir));
    if (rc != 0)
        return rc;
    shard_name(name, sizeof(name), shard, replica);
    if (snprintf(buf, len, "%s/%s", dir, name) >= (int)len)
        return -ENAMETOOLONG;
    return 0;
}

int ckpt_store_open(const char *root, uint64_t step, uint32_t shard,
                    int replica, ckpt_afile_t **f_p)
{
    char dir[PATH_MAX], name[64];
    int rc = ckpt_store_step_dir(root, step, dir, sizeof(dir));
    if (rc == 0)
        rc = ckpt_mkdirs(dir);
    if (rc != 0) {
        RD_ERROR("checkpoint: cannot create %s: %s", dir, st_strerror(rc));
        return rc;
    }
    shard_name(name, sizeof(name), shard, replica);
    return ckpt_afile_open(dir, name, f_p);
}

/* Two manifests of one checkpoint: every field restore reads. */
static int manifest_same(const ckpt_manifest_t *a, const ckpt_manifest_t *b)
{
    if (a->step != b->step || a->generation != b->generation ||
        a->total_size != b->total_size || a->elem_size != b->elem_size ||
        a->nshards != b->nshards)
        return 0;
    for (uint32_t i = 0; i < a->nshards; i++) {
        const ckpt_manifest_shard_t *x = &a->shards[i], *y = &b->shards[i];
        if (x->offset != y->offset || x->size != y->size ||
            x->raw_xxh64 != y->raw_xxh64 || x->base_step != y->base_step ||
            x->owner != y->owner || x->replica != y->replica ||
            x->flags != y->flags)
            return 0;
    }
    return 1;
}

/* 1 if the step's MANIFEST.json describes m's checkpoint, else 0. */
static int manifest_there(const char *root, const ckpt_manifest_t *m)
{
    ckpt_manifest_t *old = NULL;
    int same = ckpt_store_load_manifest(root, m->step, &old) == 0 &&
               manifest_same(old, m);
    ckpt_manifest_free(old);
    return same;
}

/*
 * Several writers complete one step (the directory's record and the
 * job's, every node of a shared directory) and their manifests differ in
 * the member names only: the first one in place stays. Create-if-absent
 * closes the race of two writers that both found none.
 */
int ckpt_store_put_manifest(const char *root, const ckpt_manifest_t *m)
{
    char dir[PATH_MAX], *json = NULL;
    if (manifest_there(root, m))
        return 0;
    int rc = ckpt_store_step_dir(root, m->step, dir, sizeof(dir));
    if (rc == 0)
        rc = ckpt_mkdirs(dir);
    if (rc == 0)
        rc = ckpt_manifest_to_json(m, &json);
    if (rc == 0)
        rc = ckpt_write_atomic_new(dir, MANIFEST_NAME, json, strlen(json));
    if (rc == -EEXIST) /* one was there, or came meanwhile */
        rc = manifest_there(root, m)
                 ? 0
                 : ckpt_write_atomic(dir, MANIFEST_NAME, json, strlen(json));
    free(json);
    return rc;
}

int ckpt_store_load_manifest(const char *root, uint64_t step,
                             ckpt_manifest_t **m_p)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    int rc = ckpt_store_step_dir(root, step, dir, sizeof(dir));
    if (rc != 0)
        return rc;
    snprintf(path, sizeof(path), "%s/%s", dir, MANIFEST_NAME);
    void *data;
    size_t len;
    rc = ckpt_read_file(path, MANIFEST_MAX, &data, &len);
    if (rc != 0)
        return rc;
    rc = ckpt_manifest_from_json(data, len, m_p);
    free(data);
    if (rc == 0 && (*m_p)->step != step) {
        RD_WARN("checkpoint: %s names step %" PRIu64, path, (*m_p)->step);
        ckpt_manifest_free(*m_p);
        return ST_ECORRUPT;
    }
    return rc;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Step numbers of every step-* directory; complete ones only if asked. */
static int list_steps(const char *root, int complete_only, uint64_t **out,
                      size_t *n_out)
{
    DIR *d = opendir(root);
    if (d == NULL) {
        *out = NULL;
        *n_out = 0;
        return errno == ENOENT ? 0 : -errno;
    }
    size_t n = 0, cap = 16;
    uint64_t *steps = malloc(cap * sizeof(*steps));
    struct dirent *e;
    while (steps != NULL && (e = readdir(d)) != NULL) {
        uint64_t s;
        char tail;
        if (sscanf(e->d_name, "step-%" SCNu64 "%c", &s, &tail) != 1 ||
            strlen(e->d_name) != 25)
            continue;
        if (complete_only) {
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "%s/%s/%s", root, e->d_name,
                     MANIFEST_NAME);
            if (access(path, F_OK) != 0)
                continue;
        }
        if (n == cap) {
            uint64_t *bigger = realloc(steps, 2 * cap * sizeof(*steps));
            if (bigger == NULL)
                break;
            steps = bigger;
            cap *= 2;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (steps == NULL)
        return ST_ENOMEM;
    qsort(steps, n, sizeof(*steps), cmp_desc);
    *out = steps;
    *n_out = n;
    return 0;
}

int ckpt_store_list(const char *root, uint64_t **steps_p, size_t *n_p)
{
    return list_steps(root, 1, steps_p, n_p);
}

static int restore_shard(const char *root, const ckpt_manifest_t *m,
                         uint32_t i, void *dst, int depth,
                         int *from_replica_p);

/*
 * Decode shard i of `step` into dst (size bytes at offset) trusting only
 * the files: for a delta base whose checkpoint never completed (a node
 * skipped that step under back pressure), so no manifest names it. Each
 * file is self-checked (header, zstd frame, raw xxh64) and must be shard
 * i of the same layout.
 */
static int decode_by_header(const char *root, uint64_t step, uint32_t i,
                            uint64_t offset, uint64_t size, void *dst,
                            int depth)
{
    char dir[PATH_MAX], name[64], path[PATH_MAX + 64];
    if (depth > MAX_CHAIN ||
        ckpt_store_step_dir(root, step, dir, sizeof(dir)) != 0)
        return ST_ECORRUPT;
    for (int replica = 0; replica < 2; replica++) {
        shard_name(name, sizeof(name), i, replica);
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        void *file, *base = NULL;
        size_t len;
        ckpt_shard_info_t info;
        if (ckpt_read_file(path, 128 + ZSTD_compressBound(size), &file,
                           &len) != 0)
            continue;
        int rc = ckpt_shard_peek(file, len, &info);
        if (rc == 0 && (info.step != step || info.shard != i ||
                        info.offset != offset || info.raw_size != size))
            rc = ST_ECORRUPT;
        if (rc == 0 && (info.flags & CKPT_F_DELTA)) {
            base = malloc(size ? size : 1);
            rc = base == NULL ? ST_ENOMEM
                              : decode_by_header(root, info.base_step, i,
                                                 offset, size, base,
                                                 depth + 1);
        }
        if (rc == 0)
            rc = ckpt_shard_decode(file, len, base, dst, size, &info);
        free(base);
        free(file);
        if (rc == 0)
            return 0;
    }
    return ST_ECORRUPT;
}

/* The decoded base (malloc'd) of shard i encoded with `flags` against
 * `base_step`, or NULL for a full shard. */
static int decode_base_at(const char *root, const ckpt_manifest_t *m,
                          uint32_t i, uint32_t flags, uint64_t base_step,
                          int depth, void **base_p)
{
    const ckpt_manifest_shard_t *s = &m->shards[i];
    *base_p = NULL;
    if (!(flags & CKPT_F_DELTA))
        return 0;
    ckpt_manifest_t *bm = NULL;
    int rc = ckpt_store_load_manifest(root, base_step, &bm);
    if (rc != 0) {
        void *base = malloc(s->size ? s->size : 1);
        rc = base == NULL ? ST_ENOMEM
                          : decode_by_header(root, base_step, i,
                                             s->offset, s->size, base,
                                             depth + 1);
        if (rc != 0) {
            free(base);
            return rc;
        }
        *base_p = base;
        return 0;
    }
    if (rc == 0 && (bm->nshards != m->nshards ||
                    bm->shards[i].offset != s->offset ||
                    bm->shards[i].size != s->size))
        rc = ST_ECORRUPT; /* a delta needs the same layout */
    void *base = rc == 0 ? malloc(s->size ? s->size : 1) : NULL;
    int dummy;
    if (rc == 0 && base == NULL)
        rc = ST_ENOMEM;
    if (rc == 0)
        rc = restore_shard(root, bm, i, base, depth + 1, &dummy);
    ckpt_manifest_free(bm);
    if (rc != 0) {
        free(base);
        return rc;
    }
    *base_p = base;
    return 0;
}

/* The decoded base of delta shard i as the manifest lists it. */
static int decode_base(const char *root, const ckpt_manifest_t *m,
                       uint32_t i, int depth, void **base_p)
{
    return decode_base_at(root, m, i, m->shards[i].flags,
                          m->shards[i].base_step, depth, base_p);
}

/*
 * The manifest lists the base of one copy (the primary's), but the two
 * copies come from two writers on two nodes: one whose node skipped a
 * checkpoint under back pressure encoded against an older shard, or wrote
 * a full one, and only its own header says so. Returns 1 with that base
 * in *own_p (NULL: a full shard) when the copy's header differs from the
 * manifest, 0 when the listed base applies (or the header is unreadable:
 * read_copy reports it), or an error decoding its own base.
 */
static int copy_base(const char *root, const ckpt_manifest_t *m, uint32_t i,
                     int replica, int depth, void **own_p)
{
    const ckpt_manifest_shard_t *s = &m->shards[i];
    char dir[PATH_MAX], name[64], path[PATH_MAX + 64];
    ckpt_shard_info_t info;
    *own_p = NULL;
    if (ckpt_store_step_dir(root, m->step, dir, sizeof(dir)) != 0)
        return 0;
    shard_name(name, sizeof(name), i, replica);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (ckpt_shard_peek_file(path, &info) != 0)
        return 0;
    uint32_t delta = info.flags & CKPT_F_DELTA;
    if (delta == (s->flags & CKPT_F_DELTA) &&
        (!delta || info.base_step == s->base_step))
        return 0;
    int rc = decode_base_at(root, m, i, info.flags, info.base_step, depth,
                            own_p);
    return rc == 0 ? 1 : rc;
}

/* Decode one copy (primary or replica) of shard i into dst and check it
 * is the shard the manifest lists. */
static int read_copy(const char *root, const ckpt_manifest_t *m, uint32_t i,
                     int replica, const void *base, void *dst)
{
    const ckpt_manifest_shard_t *s = &m->shards[i];
    char dir[PATH_MAX], name[64], path[PATH_MAX + 64];
    int r = ckpt_store_step_dir(root, m->step, dir, sizeof(dir));
    if (r != 0)
        return r;
    shard_name(name, sizeof(name), i, replica);
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    void *file;
    size_t len;
    ckpt_shard_info_t info;
    r = ckpt_read_file(path, 128 + ZSTD_compressBound(s->size), &file,
                       &len);
    if (r == 0) {
        r = ckpt_shard_decode(file, len, base, dst, s->size, &info);
        free(file);
    }
    if (r == 0 && (info.step != m->step || info.offset != s->offset ||
                   info.raw_size != s->size ||
                   info.raw_xxh64 != s->raw_xxh64))
        r = ST_ECORRUPT; /* a valid shard, but not the one listed */
    if (r == -ENOENT) /* normal with per-node directories */
        RD_DEBUG("checkpoint: step %" PRIu64 " %s not here", m->step, name);
    else if (r != 0)
        RD_WARN("checkpoint: step %" PRIu64 " %s unusable: %s", m->step,
                name, st_strerror(r));
    return r;
}

/*
 * Decode shard i of step into dst (size bytes), from the primary file or
 * else the replica; a delta shard first decodes its base (recursively).
 * *from_replica_p is set when the primary was unusable.
 */
static int restore_shard(const char *root, const ckpt_manifest_t *m,
                         uint32_t i, void *dst, int depth,
                         int *from_replica_p)
{
    if (depth > MAX_CHAIN)
        return ST_ECORRUPT;
    void *base = NULL;
    int listed = decode_base(root, m, i, depth, &base);
    for (int replica = 0; replica < 2; replica++) {
        void *own = NULL;
        int rc = copy_base(root, m, i, replica, depth, &own);
        if (rc < 0 || (rc == 0 && listed != 0))
            continue; /* the base this copy needs cannot be decoded */
        rc = read_copy(root, m, i, replica, rc == 1 ? own : base, dst);
        free(own);
        if (rc == 0) {
            *from_replica_p = replica;
            free(base);
            return 0;
        }
    }
    free(base);
    return listed != 0 ? listed : ST_ECORRUPT;
}

int ckpt_store_read_shard(const char *root, const ckpt_manifest_t *m,
                          uint32_t i, void *dst, int *from_replica_p)
{
    int dummy;
    if (i >= m->nshards)
        return ST_EINVAL;
    return restore_shard(root, m, i, dst, 0,
                         from_replica_p ? from_replica_p : &dummy);
}

int ckpt_store_check(const char *root, const ckpt_manifest_t *m,
                     ckpt_copy_state_t *states)
{
    int bad = 0;
    for (uint32_t i = 0; i < m->nshards; i++) {
        void *base = NULL, *buf = malloc(m->shards[i].size ? m->shards[i].size
                                                           : 1);
        int ok[2] = {0, 0};
        int listed = buf != NULL ? decode_base(root, m, i, 0, &base)
                                 : ST_ENOMEM;
        for (int replica = 0; buf != NULL && replica < 2; replica++) {
            void *own = NULL;
            int rc = copy_base(root, m, i, replica, 0, &own);
            if (rc == 1 || (rc == 0 && listed == 0))
                ok[replica] = read_copy(root, m, i, replica,
                                        rc == 1 ? own : base, buf) == 0;
            free(own);
        }
        free(base);
        free(buf);
        states[i] = ok[0] ? (ok[1] ? CKPT_COPY_OK : CKPT_COPY_REPLICA_BAD)
                          : (ok[1] ? CKPT_COPY_REPAIRED : CKPT_COPY_BAD);
        bad += !ok[0] && !ok[1];
    }
    return bad ? ST_ECORRUPT : 0;
}

int ckpt_store_restore(const char *root, void *state, size_t cap,
                       uint64_t *step_p, unsigned *repaired_p)
{
    uint64_t *steps;
    size_t n;
    int rc = list_steps(root, 1, &steps, &n);
    if (rc != 0)
        return rc;
    if (n == 0) {
        free(steps);
        RD_INFO("checkpoint: no complete checkpoint under %s", root);
        return -ENOENT;
    }
    /* Decode into scratch and copy only a whole checkpoint: a step that
     * fails half-way must not leave part of it in the caller's state. */
    char *out = malloc(cap ? cap : 1);
    if (out == NULL) {
        free(steps);
        return ST_ENOMEM;
    }
    for (size_t k = 0; k < n; k++) {
        ckpt_manifest_t *m;
        if (ckpt_store_load_manifest(root, steps[k], &m) != 0)
            continue;
        if (m->total_size != cap) {
            RD_WARN("checkpoint: step %" PRIu64 " holds %" PRIu64
                    " bytes, the state has %zu; skipped", m->step,
                    m->total_size, cap);
            ckpt_manifest_free(m);
            continue;
        }
        unsigned repaired = 0;
        int ok = 1;
        for (uint32_t i = 0; ok && i < m->nshards; i++) {
            int from_replica = 0;
            if (restore_shard(root, m, i, out + m->shards[i].offset, 0,
                              &from_replica) != 0)
                ok = 0;
            repaired += (unsigned)from_replica;
        }
        ckpt_manifest_free(m);
        if (ok) {
            memcpy(state, out, cap);
            free(out);
            *step_p = steps[k];
            if (repaired_p)
                *repaired_p = repaired;
            free(steps);
            RD_INFO("checkpoint: restored step %" PRIu64 " (%u shard%s from "
                    "replicas)", *step_p, repaired, repaired == 1 ? "" : "s");
            return 0;
        }
        RD_WARN("checkpoint: step %" PRIu64 " is not restorable; trying "
                "an older one", steps[k]);
    }
    free(out);
    free(steps);
    RD_WARN("checkpoint: no usable checkpoint under %s", root);
    return ST_ECORRUPT;
}

int ckpt_store_verify(const char *root, uint64_t step, unsigned *bad_p)
{
    ckpt_manifest_t *m;
    int rc = ckpt_store_load_manifest(root, step, &m);
    if (rc != 0)
        return rc;
    unsigned bad = 0;
    char dir[PATH_MAX];
    ckpt_store_step_dir(root, step, dir, sizeof(dir));
    for (uint32_t i = 0; i < m->nshards; i++) {
        void *buf = malloc(m->shards[i].size ? m->shards[i].size : 1);
        int from_replica = 0;
        if (buf == NULL || restore_shard(root, m, i, buf, 0,
                                         &from_replica) != 0)
            bad += 2; /* neither copy */
        else if (from_replica)
            bad += 1; /* the primary is bad */
        free(buf);
        /* A good primary says nothing of the replica: check it alone. */
        if (!from_replica && !(m->shards[i].flags & CKPT_F_DELTA)) {
            char name[64], path[PATH_MAX + 64];
            shard_name(name, sizeof(name), i, 1);
            snprintf(path, sizeof(path), "%s/%s", dir, name);
            void *file;
            size_t len;
            void *raw = malloc(m->shards[i].size ? m->shards[i].size : 1);
            int r = raw ? ckpt_read_file(path, 128 + ZSTD_compressBound(
                                                         m->shards[i].size),
                                         &file, &len)
                        : ST_ENOMEM;
            if (r == 0) {
                r = ckpt_shard_decode(file, len, NULL, raw,
                                      m->shards[i].size, NULL);
                free(file);
            }
            free(raw);
            bad += r != 0;
        }
    }
    ckpt_manifest_free(m);
    if (bad_p)
        *bad_p = bad;
    return bad ? ST_ECORRUPT : 0;
}

static int rm_entry(const char *p, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

/* Mark in keep[] (parallel to steps[]) every base step m depends on. */
/* Keep the bases of an incomplete step's delta files (found from their
 * headers): a later complete step may be a delta against it. */
static void mark_bases_hdr(const char *root, uint64_t step,
                           const uint64_t *steps, size_t n, char *keep,
                           int depth)
{
    char dir[PATH_MAX];
    if (depth >= MAX_CHAIN ||
        ckpt_store_step_dir(root, step, dir, sizeof(dir)) != 0)
        return;
    DIR *dp = opendir(dir);
    if (dp == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        char path[PATH_MAX + 256];
        ckpt_shard_info_t info;
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 5, ".rckp") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (ckpt_shard_peek_file(path, &info) != 0 ||
            !(info.flags & CKPT_F_DELTA))
            continue;
        for (size_t k = 0; k < n; k++) {
            if (steps[k] != info.base_step || keep[k])
                continue;
            keep[k] = 1;
            mark_bases_hdr(root, steps[k], steps, n, keep, depth + 1);
        }
    }
    closedir(dp);
}

static void mark_bases(const char *root, const ckpt_manifest_t *m,
                       const uint64_t *steps, size_t n, char *keep, int depth)
{
    for (uint32_t i = 0; depth < MAX_CHAIN && i < m->nshards; i++) {
        if (!(m->shards[i].flags & CKPT_F_DELTA))
            continue;
        for (size_t k = 0; k < n; k++) {
            if (steps[k] != m->shards[i].base_step || keep[k])
                continue;
            keep[k] = 1;
            ckpt_manifest_t *bm;
            if (ckpt_store_load_manifest(root, steps[k], &bm) == 0) {
                mark_bases(root, bm, steps, n, keep, depth + 1);
                ckpt_manifest_free(bm);
            } else {
                mark_bases_hdr(root, steps[k], steps, n, keep, depth + 1);
            }
        }
    }
}

int ckpt_store_retain(const char *root, unsigned keep_n)
{
    uint64_t *all, *done;
    size_t na, nd;
    int rc = list_steps(root, 0, &all, &na);
    if (rc != 0)
        return rc;
    rc = list_steps(root, 1, &done, &nd);
    if (rc != 0) {
        free(all);
        return rc;
    }
    char *keep = calloc(na ? na : 1, 1);
    if (keep == NULL) {
        free(all);
        free(done);
        return ST_ENOMEM;
    }
    uint64_t newest_done = nd ? done[0] : 0;
    for (size_t k = 0; k < na; k++) {
        int complete = 0;
        size_t rank = 0;
        for (size_t j = 0; j < nd; j++)
            if (done[j] == all[k])
                complete = 1, rank = j;
        /* In-flight (newer than the newest complete) and the newest
         * keep_n complete ones stay. */
        if ((!complete && (nd == 0 || all[k] > newest_done)) ||
            (complete && rank < keep_n))
            keep[k] = 1;
    }
    /*
     * A kept step whose manifest cannot be read (half written by another
     * node at this moment, or cut) still names its bases in its shards'
     * own headers: without them its complete base would go.
     */
    for (size_t k = 0; k < na; k++) {
        ckpt_manifest_t *m;
        if (!keep[k])
            continue;
        if (ckpt_store_load_manifest(root, all[k], &m) == 0) {
            mark_bases(root, m, all, na, keep, 0);
            ckpt_manifest_free(m);
        } else {
            mark_bases_hdr(root, all[k], all, na, keep, 0);
        }
    }
    int removed = 0;
    for (size_t k = 0; k < na; k++) {
        if (keep[k])
            continue;
        char dir[PATH_MAX];
        ckpt_store_step_dir(root, all[k], dir, sizeof(dir));
        nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        removed++;
    }
    free(keep);
    free(all);
    free(done);
    return removed;
}
