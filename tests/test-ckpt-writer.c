/*
 * Checkpoint writer tests: the asynchronous writer and its encoder
 * threads (checkpoint/ckpt_writer.c): a chain of deltas on the last full
 * shard that restores, one shard in flight (the next submit is skipped,
 * never blocks), a live submit of several pieces that may change once
 * copied, and a damaged delta base that makes the next shard full.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "tests/ckpt-data.h"
#include "tests/helpers.h"
#include "tests/task.h"

typedef struct {
    const char *root;
    int calls, last_status;
    uint32_t last_flags;
    uint64_t last_xxh, last_base;
    int block_fd; /* when >= 0, the callback waits for a byte on it */
} wctx_t;

/* Acts as the successor: stores the replica next to the primary. */
static void on_written(void *arg, int status, const ckpt_shard_info_t *info,
                       const void *file, size_t len)
{
    wctx_t *c = arg;
    if (c->block_fd >= 0) {
        char b;
        ASSERT_EQ(read(c->block_fd, &b, 1), 1);
    }
    c->calls++;
    c->last_status = status;
    if (status == 0) {
        c->last_flags = info->flags;
        c->last_xxh = info->raw_xxh64;
        c->last_base = info->base_step;
        /* The writer streamed the primary to disk: copy it as is. */
        char dir[PATH_MAX], path[PATH_MAX + 32];
        ASSERT_OK(ckpt_store_step_dir(c->root, info->step, dir,
                                      sizeof(dir)));
        snprintf(path, sizeof(path), "%s/shard-%05u.rckp", dir, info->shard);
        void *img;
        size_t got;
        ASSERT(file == NULL);
        ASSERT_OK(ckpt_read_file(path, SIZE_MAX, &img, &got));
        ASSERT_EQ(got, len);
        ASSERT_OK(ckpt_store_put(c->root, info->step, info->shard, 1, img,
                                 got));
        free(img);
    }
}

static void manifest_one(const char *root, uint64_t step, size_t size,
                         const wctx_t *c, uint64_t base_step)
{
    ckpt_manifest_t *m = ckpt_manifest_new(1);
    m->step = step;
    m->total_size = size;
    m->elem_size = 4;
    m->shards[0] = (ckpt_manifest_shard_t){
        .offset = 0, .size = size, .raw_xxh64 = c->last_xxh,
        .flags = c->last_flags, .base_step = base_step};
    m->members[0] = strdup("solo");
    ASSERT_OK(ckpt_store_put_manifest(root, m));
    ckpt_manifest_free(m);
}

TEST_IMPL(ckpt_writer_delta_chain)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 50000, size = n * 4;
    float *w = malloc(size), *out = malloc(size);
    tc_fill_weights(w, n);
    ckpt_writer_t *wr;
    ckpt_writer_opts_t o = {.root = root, .codec = tc_codec, .full_every = 2};
    ASSERT_OK(ckpt_writer_create(&o, &wr));
    wctx_t c = {.root = root, .block_fd = -1};
    /* full, delta, delta, full, delta */
    static const uint32_t want_flags[] = {0, CKPT_F_DELTA, CKPT_F_DELTA, 0,
                                          CKPT_F_DELTA};
    uint64_t full = 0; /* every delta is against the last full shard */
    for (uint64_t step = 1; step <= 5; step++) {
        tc_perturb(w, n);
        ckpt_shard_info_t info = {.step = step, .nshards = 1,
                                  .raw_size = size, .total_size = size};
        ASSERT_OK(ckpt_writer_submit(wr, &info, w, on_written, &c));
        ckpt_writer_flush(wr);
        ASSERT_EQ(c.last_status, 0);
        ASSERT_EQ(c.last_flags & CKPT_F_DELTA, want_flags[step - 1]);
        ASSERT_EQ(c.last_base, (c.last_flags & CKPT_F_DELTA) ? full : 0);
        manifest_one(root, step, size, &c, c.last_base);
        if (!(c.last_flags & CKPT_F_DELTA))
            full = step;
    }
    ckpt_writer_stats_t st;
    ckpt_writer_stats(wr, &st);
    ASSERT_EQ(st.written, 5);
    ASSERT_EQ(st.skipped, 0);
    ASSERT_GT(st.raw_bytes, st.file_bytes);
    ckpt_writer_destroy(wr);
    uint64_t step;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, NULL));
    ASSERT_EQ(step, 5);
    ASSERT(memcmp(out, w, size) == 0);
    th_rmtree(root);
    free(root);
    free(w);
    free(out);
    return 0;
}

/* One in flight: the next submit is skipped at once, never blocks. */
TEST_IMPL(ckpt_writer_backpressure)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t size = 4096;
    float *w = calloc(1, size);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    ckpt_writer_t *wr;
    ckpt_writer_opts_t o = {.root = root, .codec = tc_codec};
    ASSERT_OK(ckpt_writer_create(&o, &wr));
    wctx_t c = {.root = root, .block_fd = fds[0]};
    ckpt_shard_info_t info = {.step = 1, .nshards = 1, .raw_size = size,
                              .total_size = size};
    ASSERT_OK(ckpt_writer_submit(wr, &info, w, on_written, &c));
    info.step = 2;
    ASSERT_EQ(ckpt_writer_submit(wr, &info, w, on_written, &c), ST_AGAIN);
    info.step = 3;
    ASSERT_EQ(ckpt_writer_submit(wr, &info, w, on_written, &c), ST_AGAIN);
    ASSERT_EQ(write(fds[1], "x", 1), 1); /* let step 1 finish */
    ckpt_writer_flush(wr);
    ASSERT_EQ(c.calls, 1);
    info.step = 4;
    ASSERT_OK(ckpt_writer_submit(wr, &info, w, on_written, &c));
    ASSERT_EQ(write(fds[1], "x", 1), 1);
    ckpt_writer_destroy(wr); /* waits for step 4 */
    ASSERT_EQ(c.calls, 2);
    /* Bad shard geometry is refused before anything is copied. */
    ASSERT_OK(ckpt_writer_create(&o, &wr));
    info.offset = size;
    ASSERT_EQ(ckpt_writer_submit(wr, &info, w, on_written, &c), ST_EINVAL);
    ckpt_writer_destroy(wr);
    close(fds[0]);
    close(fds[1]);
    th_rmtree(root);
    free(root);
    free(w);
    return 0;
}

/*
 * A live submit of a shard of several pieces with an odd tail: the worker
 * copies it, says so, and the bytes may change from then on (the callback
 * scribbles over them at once); the file streamed piece by piece holds the
 * bytes as they were, decodes through the whole-file reader, and the
 * delta that follows restores bit for bit.
 */
typedef struct {
    unsigned char *src;
    size_t n;
    int copied, copied_before_done;
    wctx_t *w;
} live_t;

static void on_live_copied(void *arg, const ckpt_shard_info_t *info)
{
    live_t *l = arg;
    ASSERT_EQ(info->raw_size, l->n);
    l->copied++;
    l->copied_before_done += l->w->calls == 0 || l->copied > l->w->calls;
    memset(l->src, 0xa5, l->n); /* the trainer's next step writes */
}

TEST_IMPL(ckpt_writer_live_pieces)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 2 * (size_t)CKPT_PIECE_BYTES + 4 * 1001 + 3;
    unsigned char *src = malloc(n), *keep = malloc(n), *out = malloc(n);
    ASSERT(src != NULL && keep != NULL && out != NULL);
    tc_fill_weights((float *)src, n / 4);
    for (size_t i = n - n % 4; i < n; i++)
        src[i] = (unsigned char)(i * 7);
    ckpt_writer_t *wr;
    ckpt_writer_opts_t o = {.root = root, .codec = tc_codec, .full_every = 2};
    ASSERT_OK(ckpt_writer_create(&o, &wr));
    ASSERT_OK(ckpt_writer_reserve(wr, n));
    wctx_t c = {.root = root, .block_fd = -1};
    live_t l = {.src = src, .n = n, .w = &c};
    for (uint64_t step = 1; step <= 2; step++) {
        if (step == 2) { /* the state after the scribble, changed a bit */
            memcpy(src, keep, n);
            tc_perturb((float *)src, n / 4);
        }
        memcpy(keep, src, n);
        ckpt_shard_info_t info = {.step = step, .nshards = 1,
                                  .raw_size = n, .total_size = n};
        ASSERT_OK(ckpt_writer_submit_live(wr, &info, src, on_live_copied,
                                          &l, on_written, &c));
        ckpt_writer_flush(wr);
        ASSERT_EQ(c.last_status, 0);
        ASSERT_EQ(l.copied, (int)step);
        ASSERT_EQ(l.copied_before_done, (int)step);
        ASSERT(c.last_flags & CKPT_F_PIECES);
        ASSERT_EQ(c.last_flags & CKPT_F_DELTA, step == 2 ? CKPT_F_DELTA : 0);
        manifest_one(root, step, n, &c, step == 2 ? 1 : 0);
        uint64_t got;
        ASSERT_OK(ckpt_store_restore(root, out, n, &got, NULL));
        ASSERT_EQ(got, step);
        ASSERT_MSG(memcmp(out, keep, n) == 0,
                   "step %llu: restored bytes are not the submitted ones",
                   (unsigned long long)step);
    }
    unsigned bad = 1;
    ASSERT_OK(ckpt_store_verify(root, 2, &bad));
    ASSERT_EQ(bad, 0);
    ckpt_shard_info_t in;
    char dir[PATH_MAX], path[PATH_MAX + 32];
    ASSERT_OK(ckpt_store_step_dir(root, 2, dir, sizeof(dir)));
    snprintf(path, sizeof(path), "%s/shard-00000.rckp", dir);
    ASSERT_OK(ckpt_shard_peek_file(path, &in));
    ASSERT_EQ(in.piece_size, CKPT_PIECE_BYTES);
    ckpt_writer_destroy(wr);
    th_rmtree(root);
    free(root);
    free(src);
    free(keep);
    free(out);
    return 0;
}

/*
 * A delta's base is read back from the last full shard's file: when that
 * file was damaged after it was written, the writer notices while reading
 * it (zstd or the xxh64 of the decoded base) and writes the next shard
 * full, which restores exactly; a delta against the damaged bytes would
 * not.
 */
TEST_IMPL(ckpt_writer_base_damaged)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = (size_t)CKPT_PIECE_BYTES + 4 * 333;
    float *w = malloc(n), *out = malloc(n);
    ASSERT(w != NULL && out != NULL);
    tc_fill_weights(w, n / 4);
    ckpt_writer_t *wr;
    ckpt_writer_opts_t o = {.root = root, .codec = tc_codec, .full_every = 4};
    ASSERT_OK(ckpt_writer_create(&o, &wr));
    wctx_t c = {.root = root, .block_fd = -1};
    ckpt_shard_info_t info = {.step = 1, .nshards = 1, .raw_size = n,
                              .total_size = n};
    ASSERT_OK(ckpt_writer_submit(wr, &info, w, on_written, &c));
    ckpt_writer_flush(wr);
    ASSERT_EQ(c.last_status, 0);
    ASSERT_EQ(c.last_flags & CKPT_F_DELTA, 0);
    manifest_one(root, 1, n, &c, 0);

    char path[PATH_MAX];
    ASSERT_OK(ckpt_store_shard_path(root, 1, 0, 0, path, sizeof(path)));
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    int fd = open(path, O_RDWR);
    ASSERT(fd >= 0);
    unsigned char b;
    off_t at = st.st_size / 2;
    ASSERT_EQ(pread(fd, &b, 1, at), 1);
    b ^= 0x10;
    ASSERT_EQ(pwrite(fd, &b, 1, at), 1);
    close(fd);

    tc_perturb(w, n / 4);
    info.step = 2;
    ASSERT_OK(ckpt_writer_submit(wr, &info, w, on_written, &c));
    ckpt_writer_flush(wr);
    ASSERT_EQ(c.last_status, 0);
    ASSERT_MSG((c.last_flags & CKPT_F_DELTA) == 0,
               "step 2 was written as a delta against a damaged base");
    manifest_one(root, 2, n, &c, 0);
    uint64_t step;
    ASSERT_OK(ckpt_store_restore(root, out, n, &step, NULL));
    ASSERT_EQ(step, 2);
    ASSERT(memcmp(out, w, n) == 0);
    ckpt_writer_destroy(wr);
    th_rmtree(root);
    free(root);
    free(w);
    free(out);
    return 0;
}
