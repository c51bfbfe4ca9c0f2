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
