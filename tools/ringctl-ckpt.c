/*
 * ringctl-ckpt.c - ringctl's checkpoint commands: list the manifests in
 * etcd, verify a checkpoint's shards (from etcd's manifest or a
 * directory's), dump a checkpoint's state to a file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "common/status.h"
#include "membership/mb.h"
#include "tools/ringctl.h"

typedef struct {
    const etcd_kv_t *kv;
    const char *step;
    unsigned long long n;
    int numeric;
} ctl_ckpt_t;

static int ckpt_cmp(const void *a, const void *b)
{
    const ctl_ckpt_t *x = a, *y = b;
    if (x->numeric != y->numeric)
        return y->numeric - x->numeric;
    if (x->numeric)
        return x->n < y->n ? -1 : x->n > y->n;
    return strcmp(x->step, y->step);
}

/* One line per manifest: its step, then its scalar fields as k=v. A value
 * that is not a JSON object is listed as such and makes the status 1. */
static int print_ckpt(const ctl_ckpt_t *k, cJSON *arr)
{
    char b1[64], b2[128];
    cJSON *v = cJSON_ParseWithLength(k->kv->value, k->kv->value_len);
    int ok = cJSON_IsObject(v);
    if (arr != NULL) {
        cJSON *o = cJSON_CreateObject();
        if (k->numeric)
            cJSON_AddNumberToObject(o, "step", (double)k->n);
        else
            cJSON_AddStringToObject(o, "step", k->step);
        cJSON_AddStringToObject(o, "key", k->kv->key);
        if (ok)
            cJSON_AddItemToObject(o, "value", v);
        else
            cJSON_Delete(v);
        cJSON_AddBoolToObject(o, "valid", ok);
        cJSON_AddItemToArray(arr, o);
        return ok ? 0 : EXIT_DOWN;
    }
    printf("step %s", ctl_safe(k->step, b1, sizeof(b1)));
    if (!ok) {
        printf("  (not a JSON object: %zu bytes)\n", k->kv->value_len);
        cJSON_Delete(v);
        return EXIT_DOWN;
    }
    const cJSON *f;
    cJSON_ArrayForEach(f, v) {
        char *s = cJSON_IsString(f) ? NULL : cJSON_PrintUnformatted(f);
        printf("  %s=%s", ctl_safe(f->string, b1, sizeof(b1)),
               ctl_safe(cJSON_IsString(f) ? f->valuestring : s ? s : "?", b2,
                    sizeof(b2)));
        free(s);
    }
    printf("\n");
    cJSON_Delete(v);
    return 0;
}

int cmd_checkpoints(const ctl_opts_t *o, char **argv)
{
    (void)argv;
    ctl_etcd_t c;
    ctl_reply_t r;
    char prefix[MB_KEY_MAX];
    if (mb_key(prefix, sizeof(prefix), o->job, MB_KEY_CKPTS, NULL, 0, 0))
        return EXIT_USAGE;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    rc = ctl_get(&c, prefix, 1, &r);
    if (rc != 0)
        goto out_destroy;
    ctl_ckpt_t *ks = calloc(r.n_kvs ? r.n_kvs : 1, sizeof(*ks));
    if (ks == NULL) {
        fprintf(stderr, "ringctl: out of memory\n");
        rc = EXIT_DOWN;
        goto out_reply;
    }
    for (size_t i = 0; i < r.n_kvs; i++) {
        char *end;
        ks[i].kv = &r.kvs[i];
        ks[i].step = ctl_key_tail(r.kvs[i].key, prefix);
        errno = 0;
        ks[i].n = strtoull(ks[i].step, &end, 10);
        ks[i].numeric = ks[i].step[0] >= '0' && ks[i].step[0] <= '9' &&
                        *end == '\0' && errno == 0;
    }
    qsort(ks, r.n_kvs, sizeof(*ks), ckpt_cmp);
    cJSON *arr = o->json ? cJSON_CreateArray() : NULL;
    if (r.n_kvs == 0 && arr == NULL)
        printf("no checkpoints for job %s\n", o->job);
    int bad = 0;
    for (size_t i = 0; i < r.n_kvs; i++)
        bad += print_ckpt(&ks[i], arr) != 0;
    if (arr != NULL) {
        char *s = cJSON_PrintUnformatted(arr);
        if (s != NULL)
            printf("%s\n", s);
        free(s);
        cJSON_Delete(arr);
    }
    if (bad > 0) {
        fprintf(stderr, "ringctl: %d checkpoint record(s) of job %s are "
                "not JSON objects\n", bad, o->job);
        rc = EXIT_DOWN;
    }
    free(ks);
out_reply:
    ctl_reply_free(&r);
out_destroy:
    etcd_destroy(c.etcd);
    return rc;
}

/* The manifest of step from etcd (--etcd given) or from the directory. */
static int verify_manifest(const ctl_opts_t *o, const char *root,
                           unsigned long long step, ckpt_manifest_t **m_p)
{
    if (o->etcd == NULL || o->etcd[0] == '\0') {
        int rc = ckpt_store_load_manifest(root, step, m_p);
        if (rc != 0)
            fprintf(stderr, "ringctl: no manifest of step %llu under %s: "
                    "%s\n", step, root, st_strerror(rc));
        return rc ? EXIT_DOWN : 0;
    }
    ctl_etcd_t c;
    ctl_reply_t r;
    char key[MB_KEY_MAX];
    if (mb_key(key, sizeof(key), o->job, MB_KEY_CKPT, NULL, step, 0) != 0)
        return EXIT_USAGE;
    int rc = ctl_open(o, &c);
    if (rc != 0)
        return rc;
    rc = ctl_get(&c, key, 0, &r);
    if (rc == 0 && r.n_kvs != 1) {
        fprintf(stderr, "ringctl: no checkpoint of step %llu in etcd (%s)\n",
                step, key);
        rc = EXIT_DOWN;
    } else if (rc == 0 && ckpt_manifest_from_json(r.kvs[0].value,
                                                  r.kvs[0].value_len,
                                                  m_p) != 0) {
        fprintf(stderr, "ringctl: %s is not a valid manifest\n", key);
        rc = EXIT_DOWN;
    }
    if (rc == 0 && (*m_p)->step != step) {
        fprintf(stderr, "ringctl: %s names step %llu\n", key,
                (unsigned long long)(*m_p)->step);
        ckpt_manifest_free(*m_p);
        rc = EXIT_DOWN;
    }
    if (r.done)
        ctl_reply_free(&r);
    etcd_destroy(c.etcd);
    return rc;
}

/* Decode both copies of every shard of one checkpoint: restorable? */
/* STEP as given on the command line, the job's checkpoint directory in
 * root, and its manifest (verified, caller frees): 0 or an exit code. */
static int open_checkpoint(const ctl_opts_t *o, const char *arg, char *root,
                           size_t rlen, unsigned long long *step_p,
                           ckpt_manifest_t **m_p)
{
    char *end;
    errno = 0;
    unsigned long long step = strtoull(arg, &end, 10);
    if (arg[0] < '0' || arg[0] > '9' || *end != '\0' || errno) {
        fprintf(stderr, "ringctl: bad step '%s'\n", arg);
        return EXIT_USAGE;
    }
    const char *job = o->job != NULL && o->job[0] ? o->job : "standalone";
    snprintf(root, rlen, "%s/%s", o->ckpt_dir, job);
    *step_p = step;
    return verify_manifest(o, root, step, m_p);
}

int cmd_verify(const ctl_opts_t *o, char **argv)
{
    char root[4096];
    unsigned long long step;
    ckpt_manifest_t *m = NULL;
    int rc = open_checkpoint(o, argv[1], root, sizeof(root), &step, &m);
    if (rc != 0)
        return rc;
    static const char *const verdict[] = {
        "ok", "ok (replica bad)", "repaired-from-replica", "bad"};
    ckpt_copy_state_t *st = calloc(m->nshards, sizeof(*st));
    if (st == NULL) {
        ckpt_manifest_free(m);
        return EXIT_DOWN;
    }
    rc = ckpt_store_check(root, m, st);
    unsigned repaired = 0;
    for (uint32_t i = 0; i < m->nshards; i++) {
        printf("shard %u  %s\n", i, verdict[st[i]]);
        repaired += st[i] == CKPT_COPY_REPAIRED;
    }
    if (rc == 0)
        printf("step %llu: restorable (%u shards, %u from replicas)\n",
               step, m->nshards, repaired);
    else
        printf("step %llu: NOT restorable\n", step);
    free(st);
    ckpt_manifest_free(m);
    return rc == 0 ? EXIT_OK : EXIT_DOWN;
}

/*
 * Write the whole state of one checkpoint to a file, each shard decoded
 * and checked (zstd frames, the manifest's xxh64) as a restore does, from
 * its replica where the primary is bad: what ringd.torch.export reads.
 */
int cmd_dump(const ctl_opts_t *o, char **argv)
{
    char root[4096];
    unsigned long long step;
    ckpt_manifest_t *m = NULL;
    int rc = open_checkpoint(o, argv[1], root, sizeof(root), &step, &m);
    if (rc != 0)
        return rc;
    rc = EXIT_DOWN;
    char *state = malloc(m->total_size ? m->total_size : 1);
    if (state == NULL)
        goto out_manifest;
    for (uint32_t i = 0; i < m->nshards; i++) {
        int st = ckpt_store_read_shard(root, m, i,
                                       state + m->shards[i].offset, NULL);
        if (st != 0) {
            fprintf(stderr, "ringctl: step %llu shard %u: %s\n", step, i,
                    st_strerror(st));
            goto out_state;
        }
    }
    FILE *f = fopen(argv[2], "wb");
    if (f == NULL || fwrite(state, 1, m->total_size, f) != m->total_size ||
        fclose(f) != 0) {
        fprintf(stderr, "ringctl: writing %s: %s\n", argv[2],
                strerror(errno));
        goto out_state;
    }
    printf("step %llu: %llu bytes in %u shards to %s\n", step,
           (unsigned long long)m->total_size, m->nshards, argv[2]);
    rc = EXIT_OK;
out_state:
    free(state);
out_manifest:
    ckpt_manifest_free(m);
    return rc;
}
