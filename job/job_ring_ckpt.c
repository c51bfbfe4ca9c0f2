/*
 * job_ring_ckpt.c - checkpoint records of the ring backend in etcd.
 *
 * The rule: the manifest goes to etcd only once every shard has
 * two copies. Each node writes its own two files (shard r and the replica
 * of shard r-1) into its own directory, so no node can see from its disk
 * that the set is complete; etcd is the one place all of them see.
 *
 *   MB_KEY_CKPT_PART (step, r)   node r's two shard headers, put once
 *                                both files are durable
 *   MB_KEY_CKPT (step)           the manifest (ckpt_manifest_t JSON), put
 *                                if absent
 *
 * A node puts its record, then counts the records of the step, and reads
 * them only when all n are there (so etcd sends each record to one or two
 * nodes, not to all). Then each shard has its primary (from node i) and
 * its replica (from node i+1), and if the two copies' raw xxh64 agree,
 * the node writes the manifest in one txn (create_revision(ckpt/S) == 0,
 * which also deletes the step's records). Any node may get there first;
 * if two do, the txn lets one win. Etcd serialises the puts and the
 * counts, so the last node to put always counts all of them: a complete
 * set is never missed.
 *
 * Records are written without a lease: the files they describe outlive
 * the node (a node that dies after reporting still leaves a complete
 * checkpoint), and records of steps that never complete are deleted by
 * retention. Retention, by the node that wrote a manifest: keep the
 * `keep` newest manifests, delete the records of older steps.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"
#include "job/job_ring-int.h"

typedef struct rbck_req {
    struct rbck_req *next, *prev;
    job_rbck_t *k;
    etcd_t *etcd;
    job_ckpt_files_t f;
    job_done_cb cb;
    void *arg;
    char *manifest;  /* JSON, while the txn is out */
} rbck_req_t;

struct job_rbck {
    char *node;
    char *root;                 /* this node's store; NULL: no sync */
    char *job;                  /* the records' keys are mb_key()'s */
    rbck_req_t *reqs;           /* in flight: freed by destroy */
};

/* One node's record, parsed. */
typedef struct {
    int present;
    char *node;
    uint64_t step, generation, total_size;
    uint32_t nshards, elem_size;
    ckpt_shard_info_t primary, replica;
} rbck_rec_t;

static rbck_req_t *req_new(job_rbck_t *k, etcd_t *etcd)
{
    rbck_req_t *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    r->k = k;
    r->etcd = etcd;
    r->next = k->reqs;
    if (k->reqs != NULL)
        k->reqs->prev = r;
    k->reqs = r;
    return r;
}

static void req_free(rbck_req_t *r)
{
    if (r->prev != NULL)
        r->prev->next = r->next;
    else
        r->k->reqs = r->next;
    if (r->next != NULL)
        r->next->prev = r->prev;
    free(r->manifest);
    free(r);
}

static void sync_manifests(job_rbck_t *k, etcd_t *etcd, unsigned keep);

/* Tell the daemon and forget the request; a finished report also copies
 * the job's manifests into this node's store. */
static void req_done(rbck_req_t *r, int status)
{
    job_done_cb cb = r->cb;
    void *arg = r->arg;
    if (cb != NULL && r->k->root != NULL)
        sync_manifests(r->k, r->etcd, r->f.keep);
    req_free(r);
    if (cb != NULL)
        cb(arg, status);
}

int job__ckpt_create(const char *job, const char *node, const char *root,
                     job_rbck_t **k_p)
{
    job_rbck_t *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return ST_ENOMEM;
    if ((k->node = strdup(node)) == NULL)
        goto err_free;
    if ((k->job = strdup(job)) == NULL)
        goto err_node;
    if (root != NULL && (k->root = strdup(root)) == NULL)
        goto err_job;
    *k_p = k;
    return 0;

err_job:
    free(k->job);
err_node:
    free(k->node);
err_free:
    free(k);
    return ST_ENOMEM;
}

void job__ckpt_destroy(job_rbck_t *k)
{
    if (k == NULL)
        return;
    while (k->reqs != NULL)
        req_free(k->reqs);
    free(k->node);
    free(k->job);
    free(k->root);
    free(k);
}

/* ---- records ------------------------------------------------------- */

static cJSON *shard_json(const ckpt_shard_info_t *in)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || cJSON_AddNumberToObject(o, "shard", in->shard) == NULL ||
        rd_json_add_u64(o, "offset", in->offset) ||
        rd_json_add_u64(o, "size", in->raw_size) ||
        rd_json_add_u64(o, "xxh64", in->raw_xxh64) ||
        rd_json_add_u64(o, "base_step", in->base_step) ||
        cJSON_AddNumberToObject(o, "flags", in->flags) == NULL) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static int shard_parse(const cJSON *o, ckpt_shard_info_t *in)
{
    if (!cJSON_IsObject(o) ||
        rd_json_u32(o, "shard", UINT32_MAX, &in->shard) ||
        rd_json_u64(o, "offset", &in->offset) ||
        rd_json_u64(o, "size", &in->raw_size) ||
        rd_json_u64(o, "xxh64", &in->raw_xxh64) ||
        rd_json_u64(o, "base_step", &in->base_step) ||
        rd_json_u32(o, "flags", UINT32_MAX, &in->flags))
        return ST_EPROTO;
    return 0;
}

static char *record_json(const job_rbck_t *k, const job_ckpt_files_t *f)
{
    const ckpt_shard_info_t *p = &f->primary;
    cJSON *o = cJSON_CreateObject();
    cJSON *ps = shard_json(p), *rs = shard_json(&f->replica);
    char *s = NULL;
    if (o != NULL && ps != NULL && rs != NULL &&
        cJSON_AddStringToObject(o, "node", k->node) != NULL &&
        rd_json_add_u64(o, "step", p->step) == 0 &&
        rd_json_add_u64(o, "generation", p->generation) == 0 &&
        rd_json_add_u64(o, "total_size", p->total_size) == 0 &&
        cJSON_AddNumberToObject(o, "nshards", p->nshards) != NULL &&
        cJSON_AddNumberToObject(o, "elem_size", p->elem_size) != NULL) {
        cJSON_AddItemToObject(o, "primary", ps);
        cJSON_AddItemToObject(o, "replica", rs);
        ps = rs = NULL;
        s = cJSON_PrintUnformatted(o);
    }
    cJSON_Delete(ps);
    cJSON_Delete(rs);
    cJSON_Delete(o);
    return s;
}

static int record_parse(const etcd_kv_t *kv, rbck_rec_t *rec)
{
    cJSON *o = cJSON_ParseWithLength(kv->value, kv->value_len);
    const cJSON *node = cJSON_GetObjectItemCaseSensitive(o, "node");
    int rc = ST_EPROTO;
    if (cJSON_IsObject(o) && cJSON_IsString(node) &&
        rd_json_u64(o, "step", &rec->step) == 0 &&
        rd_json_u64(o, "generation", &rec->generation) == 0 &&
        rd_json_u64(o, "total_size", &rec->total_size) == 0 &&
        rd_json_u32(o, "nshards", UINT32_MAX, &rec->nshards) == 0 &&
        rd_json_u32(o, "elem_size", UINT32_MAX, &rec->elem_size) == 0 &&
        shard_parse(cJSON_GetObjectItemCaseSensitive(o, "primary"),
                    &rec->primary) == 0 &&
        shard_parse(cJSON_GetObjectItemCaseSensitive(o, "replica"),
                    &rec->replica) == 0 &&
        (rec->node = strdup(node->valuestring)) != NULL) {
        rec->present = 1;
        rc = 0;
    }
    cJSON_Delete(o);
    return rc;
}

/*
 * The manifest when recs (indexed by shard, n of them) make a complete
 * checkpoint: 0 and *m_p, 1 when not complete yet, or ST_ECORRUPT when
 * the copies of a shard disagree (the nodes' states differ: logged).
 */
static int build_manifest(const rbck_rec_t *recs, uint32_t n, uint64_t step,
                          ckpt_manifest_t **m_p)
{
    for (uint32_t i = 0; i < n; i++) {
        const rbck_rec_t *a = &recs[i], *b = &recs[(i + 1) % n];
        if (!a->present || !b->present || a->nshards != n ||
            b->nshards != n || a->step != step ||
            a->primary.shard != i || b->replica.shard != i ||
            a->generation != recs[0].generation ||
            a->total_size != recs[0].total_size)
            return 1;
        if (a->primary.raw_xxh64 != b->replica.raw_xxh64 ||
            a->primary.raw_size != b->replica.raw_size ||
            a->primary.offset != b->replica.offset) {
            RD_ERROR("checkpoint of step %" PRIu64 ": %s's shard %u and "
                     "%s's replica of it differ: the nodes' states are not "
                     "the same; no manifest", step, a->node, i, b->node);
            return ST_ECORRUPT;
        }
    }
    ckpt_manifest_t *m = ckpt_manifest_new(n);
    if (m == NULL)
        return ST_ENOMEM;
    m->step = step;
    m->generation = recs[0].generation;
    m->total_size = recs[0].total_size;
    m->elem_size = recs[0].elem_size;
    for (uint32_t i = 0; i < n; i++) {
        const ckpt_shard_info_t *p = &recs[i].primary;
        m->shards[i] = (ckpt_manifest_shard_t){
            .offset = p->offset, .size = p->raw_size,
            .raw_xxh64 = p->raw_xxh64, .base_step = p->base_step,
            .owner = i, .replica = (i + 1) % n, .flags = p->flags};
        if ((m->members[i] = strdup(recs[i].node)) == NULL) {
            ckpt_manifest_free(m);
            return ST_ENOMEM;
        }
    }
    *m_p = m;
    return 0;
}

/* ---- retention ------------------------------------------------------- */

static void on_deleted(int status, const etcd_result_t *res, void *data)
{
    (void)res;
    rbck_req_t *r = data;
    if (status != 0)
        RD_WARN("checkpoint retention: delete failed: %s",
                st_strerror(status));
    req_free(r);
}

static void delete_key(job_rbck_t *k, etcd_t *etcd, const char *key)
{
    rbck_req_t *r = req_new(k, etcd);
    if (r != NULL && etcd_delete(etcd, key, 0, on_deleted, r) != 0)
        req_free(r);
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* A decimal step and nothing else before `stop` ('\0' or '/'). */
static int parse_step(const char *s, char stop, uint64_t *step_p)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    *step_p = strtoull(s, &end, 10);
    return *end == stop ? 0 : -1;
}

/* Every key under MB_KEY_CKPT_ALL: keep the `keep` newest manifests;
 * drop older manifests and the records of steps older than `step`. */
static void on_listed(int status, const etcd_result_t *res, void *data)
{
    rbck_req_t *r = data;
    job_rbck_t *k = r->k;
    etcd_t *etcd = r->etcd;
    uint64_t step = r->f.primary.step;
    unsigned keep = r->f.keep;
    req_free(r);
    if (status != 0) {
        RD_WARN("checkpoint retention: cannot list etcd records: %s",
                st_strerror(status));
        return;
    }
    char mpre[MB_KEY_MAX], ppre[MB_KEY_MAX];
    if (mb_key(mpre, sizeof(mpre), k->job, MB_KEY_CKPTS, NULL, 0, 0) ||
        mb_key(ppre, sizeof(ppre), k->job, MB_KEY_CKPT_PARTS, NULL, 0, 0))
        return;
    size_t ml = strlen(mpre), pl = strlen(ppre), nm = 0;
    uint64_t *steps = calloc(res->n_kvs + 1, sizeof(*steps));
    if (steps == NULL)
        return;
    for (size_t i = 0; i < res->n_kvs; i++) {
        const char *key = res->kvs[i].key;
        uint64_t s;
        if (strncmp(key, mpre, ml) == 0 &&
            parse_step(key + ml, '\0', &s) == 0)
            steps[nm++] = s;
        else if (strncmp(key, ppre, pl) == 0 &&
                 parse_step(key + pl, '/', &s) == 0 && s < step)
            delete_key(k, etcd, key);
    }
    qsort(steps, nm, sizeof(*steps), cmp_desc);
    for (size_t i = keep; i < nm; i++) {
        char key[MB_KEY_MAX];
        if (mb_key(key, sizeof(key), k->job, MB_KEY_CKPT, NULL, steps[i],
                   0) == 0)
            delete_key(k, etcd, key);
    }
    free(steps);
}

static void retain(job_rbck_t *k, etcd_t *etcd, const job_ckpt_files_t *f)
{
    rbck_req_t *r = req_new(k, etcd);
    if (r == NULL)
        return;
    r->f = *f;
    char all[MB_KEY_MAX];
    if (mb_key(all, sizeof(all), k->job, MB_KEY_CKPT_ALL, NULL, 0, 0) ||
        etcd_get(etcd, all, 1, on_listed, r) != 0)
        req_free(r);
}

/* ---- the report ------------------------------------------------------- */

static void on_txn(int status, const etcd_result_t *res, void *data)
{
    rbck_req_t *r = data;
    if (status != 0) {
        RD_WARN("checkpoint of step %" PRIu64 ": manifest not written to "
                "etcd: %s", r->f.primary.step, st_strerror(status));
        req_done(r, status);
        return;
    }
    if (!res->succeeded) {
        req_done(r, 0); /* another node wrote it */
        return;
    }
    retain(r->k, r->etcd, &r->f);
    req_done(r, 1);
}

static void on_records(int status, const etcd_result_t *res, void *data)
{
    rbck_req_t *r = data;
    uint64_t step = r->f.primary.step;
    uint32_t n = r->f.primary.nshards;
    if (status != 0) {
        RD_WARN("checkpoint of step %" PRIu64 ": cannot read the nodes' "
                "records: %s", step, st_strerror(status));
        req_done(r, status);
        return;
    }
    rbck_rec_t *recs = calloc(n, sizeof(*recs));
    if (recs == NULL) {
        req_done(r, ST_ENOMEM);
        return;
    }
    for (size_t i = 0; i < res->n_kvs; i++) {
        rbck_rec_t rec = {0};
        if (record_parse(&res->kvs[i], &rec) != 0) {
            RD_WARN("checkpoint of step %" PRIu64 ": ignoring a bad "
                    "record %s", step, res->kvs[i].key);
            continue;
        }
        if (rec.primary.shard < n && !recs[rec.primary.shard].present)
            recs[rec.primary.shard] = rec;
        else
            free(rec.node);
    }
    ckpt_manifest_t *m = NULL;
    int rc = build_manifest(recs, n, step, &m);
    for (uint32_t i = 0; i < n; i++)
        free(recs[i].node);
    free(recs);
    if (rc == 0)
        rc = ckpt_manifest_to_json(m, &r->manifest);
    /* The store gets its copy before etcd does: a job killed just after
     * the txn must still find this, the newest checkpoint, in some store
     * (the other copies only come with the next report). */
    if (rc == 0 && r->k->root != NULL &&
        ckpt_store_put_manifest(r->k->root, m) != 0)
        RD_WARN("checkpoint of step %" PRIu64 ": manifest not copied "
                "into %s", step, r->k->root);
    ckpt_manifest_free(m);
    if (rc != 0) {
        req_done(r, rc > 0 ? 0 : rc); /* 1: others still writing */
        return;
    }
    char key[MB_KEY_MAX], parts[MB_KEY_MAX];
    if (mb_key(key, sizeof(key), r->k->job, MB_KEY_CKPT, NULL, step, 0) ||
        mb_key(parts, sizeof(parts), r->k->job, MB_KEY_CKPT_STEP_PARTS,
               NULL, step, 0)) {
        req_done(r, ST_EINVAL);
        return;
    }
    etcd_cmp_t cmp = {.key = key, .target = ETCD_CMP_CREATE,
                      .result = ETCD_CMP_EQUAL, .number = 0};
    etcd_op_t ops[2] = {
        {.type = ETCD_OP_PUT, .key = key, .value = r->manifest,
         .value_len = strlen(r->manifest)},
        {.type = ETCD_OP_DELETE, .key = parts, .prefix = 1},
    };
    rc = etcd_txn(r->etcd, &cmp, 1, ops, 2, NULL, 0, on_txn, r);
    if (rc != 0)
        req_done(r, rc);
}

/* Only a node that finds every record there reads them: the others
 * learn just the count, so a checkpoint costs etcd O(n) records sent,
 * not each node reading all n (O(n^2)). */
static void on_count(int status, const etcd_result_t *res, void *data)
{
    rbck_req_t *r = data;
    char parts[MB_KEY_MAX];
    if (status != 0) {
        RD_WARN("checkpoint of step %" PRIu64 ": cannot count the nodes' "
                "records: %s", r->f.primary.step, st_strerror(status));
        req_done(r, status);
        return;
    }
    if (res->count < (int64_t)r->f.primary.nshards) {
        req_done(r, 0); /* others still writing */
        return;
    }
    int rc = mb_key(parts, sizeof(parts), r->k->job, MB_KEY_CKPT_STEP_PARTS,
                    NULL, r->f.primary.step, 0);
    if (rc == 0)
        rc = etcd_get(r->etcd, parts, 1, on_records, r);
    if (rc != 0)
        req_done(r, rc);
}

static void on_put(int status, const etcd_result_t *res, void *data)
{
    (void)res;
    rbck_req_t *r = data;
    if (status != 0) {
        RD_WARN("checkpoint of step %" PRIu64 ": record not written to "
                "etcd: %s", r->f.primary.step, st_strerror(status));
        req_done(r, status);
        return;
    }
    char parts[MB_KEY_MAX];
    int rc = mb_key(parts, sizeof(parts), r->k->job, MB_KEY_CKPT_STEP_PARTS,
                    NULL, r->f.primary.step, 0);
    if (rc == 0)
        rc = etcd_count(r->etcd, parts, 1, on_count, r);
    if (rc != 0)
        req_done(r, rc);
}

int job__ckpt_report(job_rbck_t *k, etcd_t *etcd, const job_ckpt_files_t *f,
                     job_done_cb cb, void *arg)
{
    if (f->primary.nshards == 0 || f->primary.step != f->replica.step) {
        RD_ERROR("checkpoint report: inconsistent shards");
        return ST_EINVAL;
    }
    char *val = record_json(k, f);
    rbck_req_t *r = val != NULL ? req_new(k, etcd) : NULL;
    if (r == NULL) {
        free(val);
        RD_ERROR("checkpoint report: out of memory");
        return ST_ENOMEM;
    }
    r->f = *f;
    r->cb = cb;
    r->arg = arg;
    char key[MB_KEY_MAX];
    int rc = mb_key(key, sizeof(key), k->job, MB_KEY_CKPT_PART, NULL,
                    f->primary.step, f->primary.shard);
    if (rc == 0)
        rc = etcd_put(etcd, key, val, strlen(val), 0, on_put, r);
    free(val);
    if (rc != 0) {
        req_free(r);
        RD_WARN("checkpoint report: etcd put failed: %s", st_strerror(rc));
    }
    return rc;
}

/* ---- local copies of the manifests ------------------------------------
 *
 * With per-node directories no node sees every file, so none writes a
 * MANIFEST.json by itself; yet its store needs them: retention keeps the
 * newest complete steps (and their delta bases), a delta shard is decoded
 * through its base's manifest, and a restore offers the steps it has.
 * After each report the node copies every manifest in etcd whose step
 * directory it holds and which it has no copy of (the newest one arrives
 * with the next report; a restore passes it around the ring), then
 * applies retention to its own store.
 */
static void on_manifests(int status, const etcd_result_t *res, void *data)
{
    rbck_req_t *r = data;
    job_rbck_t *k = r->k;
    unsigned keep = r->f.keep;
    req_free(r);
    if (status != 0) {
        RD_DEBUG("checkpoint: cannot list manifests: %s",
                 st_strerror(status));
        if (keep > 0) /* etcd down: the store is still ours to trim */
            ckpt_store_retain(k->root, keep);
        return;
    }
    char mpre[MB_KEY_MAX];
    if (mb_key(mpre, sizeof(mpre), k->job, MB_KEY_CKPTS, NULL, 0, 0) != 0)
        return;
    size_t ml = strlen(mpre);
    for (size_t i = 0; i < res->n_kvs; i++) {
        const etcd_kv_t *kv = &res->kvs[i];
        uint64_t step;
        char dir[PATH_MAX], path[PATH_MAX + 32];
        if (strncmp(kv->key, mpre, ml) != 0 ||
            parse_step(kv->key + ml, '\0', &step) != 0 ||
            ckpt_store_step_dir(k->root, step, dir, sizeof(dir)) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
        struct stat st;
        if (stat(dir, &st) != 0 || stat(path, &st) == 0)
            continue; /* not ours, or already there */
        ckpt_manifest_t *m = NULL;
        if (ckpt_manifest_from_json(kv->value, kv->value_len, &m) != 0 ||
            m->step != step) {
            RD_WARN("checkpoint: ignoring a bad manifest at %s", kv->key);
            ckpt_manifest_free(m);
            continue;
        }
        if (ckpt_store_put_manifest(k->root, m) == 0)
            RD_DEBUG("checkpoint: step %" PRIu64 " manifest copied from "
                     "etcd", step);
        ckpt_manifest_free(m);
    }
    if (keep > 0)
        ckpt_store_retain(k->root, keep);
}

static void sync_manifests(job_rbck_t *k, etcd_t *etcd, unsigned keep)
{
    rbck_req_t *r = req_new(k, etcd);
    if (r == NULL)
        return;
    r->f.keep = keep;
    char mpre[MB_KEY_MAX];
    if (mb_key(mpre, sizeof(mpre), k->job, MB_KEY_CKPTS, NULL, 0, 0) ||
        etcd_get(etcd, mpre, 1, on_manifests, r) != 0)
        req_free(r);
}
