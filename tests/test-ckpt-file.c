/*
 * checkpoint/ckpt_file.c: crash-safe writes when several writers of one
 * name run at once (a step's manifest is written by two records of one
 * daemon, on two threads; nodes may share the directory).
 */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "tests/helpers.h"
#include "tests/task.h"

#define AW_BYTES (64 * 1024)
#define AW_ROUNDS 300

typedef struct {
    const char *dir;
    int id, failed;
    unsigned char *data;
} aw_writer_t;

static void *aw_run(void *arg)
{
    aw_writer_t *w = arg;
    for (int i = 0; i < AW_ROUNDS; i++) {
        int rc;
        if (i % 2 == 0) {
            rc = ckpt_write_atomic(w->dir, "MANIFEST.json", w->data,
                                   AW_BYTES);
        } else {
            ckpt_afile_t *f = NULL;
            rc = ckpt_afile_open(w->dir, "MANIFEST.json", &f);
            if (rc == 0) {
                rc = ckpt_afile_write(f, w->data, AW_BYTES / 2);
                if (rc == 0)
                    rc = ckpt_afile_write(f, w->data + AW_BYTES / 2,
                                          AW_BYTES / 2);
                if (rc == 0)
                    rc = ckpt_afile_commit(f);
                else
                    ckpt_afile_abort(f);
            }
        }
        w->failed += rc != 0;
    }
    return NULL;
}

/*
 * Two threads of one process write the same name 300 times each, whole
 * and piece by piece: every write succeeds, the file is at every moment
 * one writer's whole content, and no temporary file is left. With a
 * temporary name shared by the process, one thread's O_TRUNC cut the
 * other's file and its rename found nothing.
 */
TEST_IMPL(ckpt_write_atomic_concurrent)
{
    char *dir = th_mkdtemp("ringd-ckpt-aw");
    ASSERT(dir != NULL);
    aw_writer_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (aw_writer_t){.dir = dir, .id = i};
        w[i].data = malloc(AW_BYTES);
        ASSERT(w[i].data != NULL);
        memset(w[i].data, 'a' + i, AW_BYTES);
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, aw_run, &w[i]), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(w[i].failed == 0, "writer %d: %d of %d writes failed", i,
                   w[i].failed, AW_ROUNDS);
    char path[600];
    snprintf(path, sizeof(path), "%s/MANIFEST.json", dir);
    void *got = NULL;
    size_t len = 0;
    ASSERT_OK(ckpt_read_file(path, 2 * AW_BYTES, &got, &len));
    ASSERT_EQ(len, AW_BYTES);
    ASSERT(memcmp(got, w[0].data, AW_BYTES) == 0 ||
           memcmp(got, w[1].data, AW_BYTES) == 0);
    free(got);
    DIR *d = opendir(dir);
    ASSERT(d != NULL);
    int entries = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            ASSERT_MSG(strcmp(e->d_name, "MANIFEST.json") == 0,
                       "left behind: %s", e->d_name);
            entries++;
        }
    closedir(d);
    ASSERT_EQ(entries, 1);
    for (int i = 0; i < 2; i++)
        free(w[i].data);
    th_rmtree(dir);
    free(dir);
    return 0;
}

/* A manifest of `step` over two shards, its members named after `who`. */
static ckpt_manifest_t *mp_manifest(uint64_t step, const char *who,
                                    uint64_t xxh)
{
    ckpt_manifest_t *m = ckpt_manifest_new(2);
    if (m == NULL)
        return NULL;
    m->step = step;
    m->generation = 7;
    m->total_size = 8192;
    m->elem_size = 4;
    for (uint32_t i = 0; i < 2; i++) {
        m->shards[i] = (ckpt_manifest_shard_t){
            .offset = i * 4096, .size = 4096, .raw_xxh64 = xxh + i,
            .base_step = step, .owner = i, .replica = (i + 1) % 2};
        char name[64];
        snprintf(name, sizeof(name), "%s%u", who, i);
        m->members[i] = strdup(name);
        if (m->members[i] == NULL) {
            ckpt_manifest_free(m);
            return NULL;
        }
    }
    return m;
}

static char *mp_bytes(const char *root, uint64_t step)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/step-%020llu/MANIFEST.json", root,
             (unsigned long long)step);
    void *data = NULL;
    size_t len = 0;
    if (ckpt_read_file(path, 1 << 20, &data, &len) != 0)
        return NULL;
    char *s = realloc(data, len + 1);
    if (s == NULL) {
        free(data);
        return NULL;
    }
    s[len] = '\0';
    return s;
}

#define MP_ROUNDS 200

typedef struct {
    const char *root;
    const char *who;
    pthread_barrier_t *bar;
    int failed;
    char *seen[MP_ROUNDS]; /* the file right after this writer's put */
} mp_writer_t;

static void *mp_run(void *arg)
{
    mp_writer_t *w = arg;
    for (int i = 0; i < MP_ROUNDS; i++) {
        ckpt_manifest_t *m = mp_manifest((uint64_t)i + 1, w->who, 1000);
        pthread_barrier_wait(w->bar);
        w->failed += m == NULL || ckpt_store_put_manifest(w->root, m) != 0;
        w->seen[i] = mp_bytes(w->root, (uint64_t)i + 1);
        ckpt_manifest_free(m);
    }
    return NULL;
}

/*
 * A step's manifest is written by the directory's record and the job's,
 * whose member names differ (chaos disk_full: "the checkpoint of step S
 * changed while the disk was full"): once a step has one, an equivalent
 * manifest leaves it byte for byte, also when both writers start at once
 * (each writer's reading right after its put is the step's final file),
 * and a manifest of another checkpoint of that step replaces it.
 */
TEST_IMPL(ckpt_manifest_written_once)
{
    char *root = th_mkdtemp("ringd-ckpt-mp");
    ASSERT(root != NULL);
    ckpt_manifest_t *a = mp_manifest(5, "member", 1000);
    ckpt_manifest_t *b = mp_manifest(5, "node-", 1000);
    ckpt_manifest_t *c = mp_manifest(5, "node-", 2000);
    ASSERT(a != NULL && b != NULL && c != NULL);
    ASSERT_OK(ckpt_store_put_manifest(root, a));
    char *first = mp_bytes(root, 5);
    ASSERT(first != NULL && strstr(first, "member0") != NULL);
    ASSERT_OK(ckpt_store_put_manifest(root, b));
    char *again = mp_bytes(root, 5);
    ASSERT(again != NULL && strcmp(first, again) == 0);
    ASSERT_OK(ckpt_store_put_manifest(root, c));
    ckpt_manifest_t *got = NULL;
    ASSERT_OK(ckpt_store_load_manifest(root, 5, &got));
    ASSERT_EQ(got->shards[0].raw_xxh64, 2000);
    ckpt_manifest_free(got);
    free(first);
    free(again);
    ckpt_manifest_free(a);
    ckpt_manifest_free(b);
    ckpt_manifest_free(c);

    char *root2 = th_mkdtemp("ringd-ckpt-mp2");
    ASSERT(root2 != NULL);
    pthread_barrier_t bar;
    ASSERT_EQ(pthread_barrier_init(&bar, NULL, 2), 0);
    static mp_writer_t w[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (mp_writer_t){.root = root2, .who = i ? "node-" : "member",
                             .bar = &bar};
        ASSERT_EQ(pthread_create(&th[i], NULL, mp_run, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < 2; i++)
        ASSERT_MSG(w[i].failed == 0, "writer %d: %d puts failed", i,
                   w[i].failed);
    for (int r = 0; r < MP_ROUNDS; r++) {
        char *fin = mp_bytes(root2, (uint64_t)r + 1);
        ASSERT(fin != NULL);
        for (int i = 0; i < 2; i++) {
            ASSERT_MSG(w[i].seen[r] != NULL &&
                       strcmp(w[i].seen[r], fin) == 0,
                       "step %d: writer %d's manifest was replaced", r + 1,
                       i);
            free(w[i].seen[r]);
        }
        free(fin);
    }
    th_rmtree(root2);
    free(root2);
    th_rmtree(root);
    free(root);
    return 0;
}
