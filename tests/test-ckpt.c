/*
 * Checkpoint tests: codec round trips (full and XOR delta), corruption of
 * every kind detected and repaired from the replica, fallback to an older
 * checkpoint, hostile manifests, retention that keeps delta bases, a writer
 * killed mid-write leaving nothing that looks complete, and a full disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint/ckpt.h"
#include "common/log.h"
#include "tests/ckpt-data.h"
#include "tests/helpers.h"
#include "tests/task.h"

/* Write a complete checkpoint of state (all shards + replicas + manifest),
 * as delta against base_step's state when base != NULL. */
static void write_ckpt(const char *root, uint64_t step, const void *state,
                       size_t size, uint32_t nshards, const void *base,
                       uint64_t base_step)
{
    ckpt_manifest_t *m = ckpt_manifest_new(nshards);
    ASSERT(m != NULL);
    m->step = step;
    m->generation = 7;
    m->total_size = size;
    m->elem_size = 4;
    for (uint32_t i = 0; i < nshards; i++) {
        ckpt_shard_info_t info = {.step = step, .generation = 7,
                                  .shard = i, .nshards = nshards,
                                  .total_size = size};
        ckpt_shard_range(size, nshards, i, 4, &info.offset, &info.raw_size);
        if (base) {
            info.flags = CKPT_F_DELTA;
            info.base_step = base_step;
        }
        void *file;
        size_t len;
        ASSERT_OK(ckpt_shard_encode(&tc_codec, &info,
                                    (const char *)state + info.offset,
                                    base ? (const char *)base + info.offset
                                         : NULL,
                                    &file, &len));
        ASSERT_OK(ckpt_store_put(root, step, i, 0, file, len));
        ASSERT_OK(ckpt_store_put(root, step, i, 1, file, len));
        free(file);
        m->shards[i] = (ckpt_manifest_shard_t){
            .offset = info.offset, .size = info.raw_size,
            .raw_xxh64 = info.raw_xxh64, .base_step = info.base_step,
            .owner = i, .replica = (i + 1) % nshards, .flags = info.flags};
        char name[32];
        snprintf(name, sizeof(name), "node%u", i);
        m->members[i] = strdup(name);
    }
    ASSERT_OK(ckpt_store_put_manifest(root, m));
    ckpt_manifest_free(m);
}

static void shard_path(char *buf, size_t len, const char *root,
                       uint64_t step, uint32_t shard, int replica)
{
    char dir[512];
    ASSERT_OK(ckpt_store_step_dir(root, step, dir, sizeof(dir)));
    snprintf(buf, len, "%s/%s-%05u.rckp", dir, replica ? "replica" : "shard",
             shard);
}

static void flip_byte(const char *path, off_t where)
{
    int fd = open(path, O_RDWR);
    ASSERT(fd >= 0);
    unsigned char c;
    ASSERT_EQ(pread(fd, &c, 1, where), 1);
    c ^= 0x20;
    ASSERT_EQ(pwrite(fd, &c, 1, where), 1);
    close(fd);
}

static off_t file_size(const char *path)
{
    struct stat st;
    ASSERT_EQ(stat(path, &st), 0);
    return st.st_size;
}

TEST_IMPL(ckpt_shuffle_xor)
{
    static const size_t sizes[] = {0, 1, 3, 4, 7, 64, 1001};
    static const uint32_t elems[] = {1, 2, 4, 8};
    unsigned char a[1001], b[1001], c[1001], d[1001];
    for (size_t i = 0; i < sizeof(a); i++)
        a[i] = (unsigned char)tc_rnd32(), b[i] = (unsigned char)tc_rnd32();
    for (size_t s = 0; s < 7; s++)
        for (size_t e = 0; e < 4; e++) {
            ckpt_shuffle(c, a, sizes[s], elems[e]);
            ckpt_unshuffle(d, c, sizes[s], elems[e]);
            ASSERT(memcmp(a, d, sizes[s]) == 0);
        }
    /* Shuffle by 4 puts byte k of every element together. */
    unsigned char x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y[8];
    ckpt_shuffle(y, x, 8, 4);
    unsigned char want[8] = {1, 5, 2, 6, 3, 7, 4, 8};
    ASSERT(memcmp(y, want, 8) == 0);
    ckpt_xor(c, a, b, 1001);
    ckpt_xor(c, c, b, 1001);
    ASSERT(memcmp(c, a, 1001) == 0);
    /* Shard ranges tile the state, aligned to the element. */
    for (uint32_t n = 1; n <= 7; n++) {
        uint64_t next = 0;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t off, size;
            ckpt_shard_range(4099, n, i, 4, &off, &size);
            ASSERT_EQ(off, next);
            ASSERT_EQ(off % 4, 0);
            next = off + size;
        }
        ASSERT_EQ(next, 4099);
    }
    return 0;
}

TEST_IMPL(ckpt_shard_roundtrip)
{
    size_t n = 300007;
    float *w0 = malloc(n * 4), *w1 = malloc(n * 4), *out = malloc(n * 4);
    ASSERT(w0 && w1 && out);
    tc_fill_weights(w0, n);
    memcpy(w1, w0, n * 4);
    tc_perturb(w1, n);
    for (int delta = 0; delta < 2; delta++) {
        ckpt_shard_info_t info = {.step = 20, .generation = 3, .shard = 0,
                                  .nshards = 1, .raw_size = n * 4,
                                  .total_size = n * 4};
        if (delta) {
            info.flags = CKPT_F_DELTA;
            info.base_step = 10;
        }
        void *file;
        size_t len;
        ASSERT_OK(ckpt_shard_encode(&tc_codec, &info, w1, delta ? w0 : NULL,
                                    &file, &len));
        ASSERT_LT(len, n * 4); /* it compressed at all */
        ckpt_shard_info_t got;
        memset(out, 0, n * 4);
        ASSERT_OK(ckpt_shard_decode(file, len, delta ? w0 : NULL, out, n * 4,
                                    &got));
        ASSERT(memcmp(out, w1, n * 4) == 0);
        ASSERT_EQ(got.step, 20);
        ASSERT_EQ(got.raw_xxh64, info.raw_xxh64);
        if (delta) {
            /* Without its base, a delta cannot decode; with a wrong base,
             * the xxh64 catches it. */
            ASSERT_EQ(ckpt_shard_decode(file, len, NULL, out, n * 4, NULL),
                      ST_EINVAL);
            ASSERT_EQ(ckpt_shard_decode(file, len, w1, out, n * 4, NULL),
                      ST_ECORRUPT);
        }
        ASSERT_EQ(ckpt_shard_decode(file, len, delta ? w0 : NULL, out,
                                    n * 4 - 1, NULL), ST_ECORRUPT);
        free(file);
    }
    free(w0);
    free(w1);
    free(out);
    return 0;
}

/* Flip one bit of the file image and decode it. */
static int decode_flipped(unsigned char *file, size_t len, size_t bit,
                          void *out, size_t cap)
{
    unsigned char m = (unsigned char)(1u << (bit % 8));
    file[bit / 8] ^= m;
    memset(out, 0, cap);
    int rc = ckpt_shard_decode(file, len, NULL, out, cap, NULL);
    file[bit / 8] ^= m;
    return rc;
}

/*
 * Every single-bit flip, exhaustively, and every truncation is an error,
 * never a crash. In the 128-byte header each of the 1024 flips must be
 * ST_ECORRUPT: its xxh64 covers every other byte. In the zstd frame each
 * flip must be ST_ECORRUPT too, except those after which zstd decodes
 * the very same bytes, which no checksum of the content (zstd's frame
 * checksum or our xxh64) can see and which do no harm: the frame
 * header's unused bit, the reserved bits of a block's sequence
 * compression-modes byte (libzstd does not check them), the padding that
 * rounds an entropy table description up to whole bytes, and changes
 * that are another encoding of the same output (for instance a match
 * offset moved onto an identical copy of the bytes it copies). Exactly
 * those are excluded: the flipped file must then decode bit for bit to
 * the original.
 */
TEST_IMPL(ckpt_shard_corruption)
{
    size_t n = 4096;
    float *w = malloc(n * 4), *out = malloc(n * 4);
    tc_fill_weights(w, n);
    ckpt_shard_info_t info = {.step = 5, .shard = 0, .nshards = 1,
                              .raw_size = n * 4, .total_size = n * 4};
    unsigned char *file;
    size_t len;
    ASSERT_OK(ckpt_shard_encode(&tc_codec, &info, w, NULL, (void **)&file,
                                &len));
    const size_t hdr = len - info.comp_size;
    ASSERT_EQ(hdr, 128);
    rd_log_set_level(RD_LOG_ERROR); /* some 120000 expected rejections */
    for (size_t bit = 0; bit < hdr * 8; bit++)
        ASSERT_MSG(decode_flipped(file, len, bit, out, n * 4) == ST_ECORRUPT,
                   "header flip of byte %zu bit %zu not detected", bit / 8,
                   bit % 8);
    size_t same = 0, unused_bit = (hdr + 4) * 8 + 4; /* zstd FHD bit 4 */
    int unused_seen = 0;
    for (size_t bit = hdr * 8; bit < len * 8; bit++) {
        int rc = decode_flipped(file, len, bit, out, n * 4);
        if (rc == ST_ECORRUPT)
            continue;
        ASSERT_MSG(rc == 0 && memcmp(out, w, n * 4) == 0,
                   "payload flip of byte %zu bit %zu: rc %d, %s",
                   bit / 8 - hdr, bit % 8, rc,
                   rc == 0 ? "different data passed as good" : "not "
                   "ST_ECORRUPT");
        same++;
        unused_seen |= bit == unused_bit;
    }
    /* The exclusion is what it says: zstd's unused bit is among them. */
    ASSERT(unused_seen);
    fprintf(stderr, "%zu of %zu payload bit flips decode to the same "
            "bytes\n", same, (len - hdr) * 8);
    for (size_t cut = 0; cut < len; cut += (cut < 200 ? 1 : 97))
        ASSERT_EQ(ckpt_shard_decode(file, cut, NULL, out, n * 4, NULL),
                  ST_ECORRUPT);
    ASSERT_OK(ckpt_shard_decode(file, len, NULL, out, n * 4, NULL));
    ASSERT(memcmp(out, w, n * 4) == 0);
    free(file);
    free(w);
    free(out);
    return 0;
}

TEST_IMPL(ckpt_manifest_hostile)
{
    ckpt_manifest_t *m = ckpt_manifest_new(2), *back = NULL;
    ASSERT(m != NULL);
    m->step = 1ull << 60; /* beyond double precision: travels as a string */
    m->generation = 3;
    m->total_size = 100;
    m->elem_size = 4;
    m->shards[0] = (ckpt_manifest_shard_t){.offset = 0, .size = 52,
                                           .raw_xxh64 = ~0ull, .owner = 0,
                                           .replica = 1};
    m->shards[1] = (ckpt_manifest_shard_t){.offset = 52, .size = 48,
                                           .owner = 1, .replica = 0};
    m->members[0] = strdup("a");
    m->members[1] = strdup("b");
    char *json;
    ASSERT_OK(ckpt_manifest_to_json(m, &json));
    ASSERT_OK(ckpt_manifest_from_json(json, strlen(json), &back));
    ASSERT(back->step == m->step);
    ASSERT(back->shards[0].raw_xxh64 == ~0ull);
    ASSERT_STR_EQ(back->members[1], "b");
    ckpt_manifest_free(back);
    free(json);
    ckpt_manifest_free(m);

    static const char *bad[] = {
        "", "{", "null", "[]", "{\"version\":1}",
        "{\"version\":2,\"step\":\"1\",\"generation\":\"1\",\"total_size\":"
        "\"4\",\"elem_size\":4,\"shards\":[]}",
        /* a gap between shards */
        "{\"version\":1,\"step\":\"1\",\"generation\":\"1\",\"total_size\":"
        "\"8\",\"elem_size\":4,\"shards\":[{\"offset\":\"0\",\"size\":\"2\","
        "\"xxh64\":\"0\",\"base_step\":\"0\",\"owner\":0,\"replica\":0,"
        "\"flags\":0,\"member\":\"a\"}]}",
        /* numbers where strings belong, negative sizes */
        "{\"version\":1,\"step\":1,\"generation\":\"1\",\"total_size\":\"8\","
        "\"elem_size\":4,\"shards\":[]}",
        "{\"version\":1,\"step\":\"-1\",\"generation\":\"1\",\"total_size\":"
        "\"8\",\"elem_size\":4,\"shards\":[]}",
        /* owner out of range */
        "{\"version\":1,\"step\":\"1\",\"generation\":\"1\",\"total_size\":"
        "\"8\",\"elem_size\":4,\"shards\":[{\"offset\":\"0\",\"size\":\"8\","
        "\"xxh64\":\"0\",\"base_step\":\"0\",\"owner\":5,\"replica\":0,"
        "\"flags\":0,\"member\":\"a\"}]}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ckpt_manifest_t *x = NULL;
        ASSERT_MSG(ckpt_manifest_from_json(bad[i], strlen(bad[i]), &x) != 0,
                   "accepted bad manifest %zu", i);
        ASSERT(x == NULL);
    }
    return 0;
}

/* A flipped byte, a truncated file and a deleted shard are each repaired
 * from the replica; both copies bad falls back to the older checkpoint. */
TEST_IMPL(ckpt_restore_repair)
{
    char *root = th_mkdtemp("ringd-ckpt");
    ASSERT(root != NULL);
    size_t n = 100003, size = n * 4;
    float *s10 = malloc(size), *s20 = malloc(size), *out = malloc(size);
    tc_fill_weights(s10, n);
    memcpy(s20, s10, size);
    tc_perturb(s20, n);
    write_ckpt(root, 10, s10, size, 4, NULL, 0);
    write_ckpt(root, 20, s20, size, 4, s10, 10); /* delta on step 10 */

    uint64_t step;
    unsigned repaired;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, &repaired));
    ASSERT_EQ(step, 20);
    ASSERT_EQ(repaired, 0);
    ASSERT(memcmp(out, s20, size) == 0);

    char p[1024];
    shard_path(p, sizeof(p), root, 20, 1, 0);
    flip_byte(p, file_size(p) / 2);
    shard_path(p, sizeof(p), root, 20, 2, 0);
    ASSERT_EQ(truncate(p, file_size(p) - 10), 0);
    shard_path(p, sizeof(p), root, 20, 3, 0);
    ASSERT_EQ(unlink(p), 0);
    unsigned bad;
    ASSERT_EQ(ckpt_store_verify(root, 20, &bad), ST_ECORRUPT);
    ASSERT_EQ(bad, 3);
    memset(out, 0, size);
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, &repaired));
    ASSERT_EQ(step, 20);
    ASSERT_EQ(repaired, 3);
    ASSERT(memcmp(out, s20, size) == 0);

    /* Both copies of shard 0 of step 20 bad: step 10 it is. */
    shard_path(p, sizeof(p), root, 20, 0, 0);
    flip_byte(p, 200);
    shard_path(p, sizeof(p), root, 20, 0, 1);
    flip_byte(p, 3);
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, &repaired));
    ASSERT_EQ(step, 10);
    ASSERT(memcmp(out, s10, size) == 0);

    /* A bad base breaks the delta built on it: nothing usable. */
    shard_path(p, sizeof(p), root, 10, 0, 0);
    ASSERT_EQ(unlink(p), 0);
    shard_path(p, sizeof(p), root, 10, 0, 1);
    ASSERT_EQ(unlink(p), 0);
    ASSERT_EQ(ckpt_store_restore(root, out, size, &step, &repaired),
              ST_ECORRUPT);
    th_rmtree(root);
    ASSERT_EQ(ckpt_store_restore(root, out, size, &step, &repaired),
              -ENOENT);
    free(root);
    free(s10);
    free(s20);
    free(out);
    return 0;
}

TEST_IMPL(ckpt_retention)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 1000, size = n * 4;
    float *a = malloc(size), *b = malloc(size);
    tc_fill_weights(a, n);
    memcpy(b, a, size);
    tc_perturb(b, n);
    write_ckpt(root, 1, a, size, 2, NULL, 0);
    write_ckpt(root, 2, a, size, 2, NULL, 0);
    write_ckpt(root, 3, a, size, 2, NULL, 0);      /* full */
    write_ckpt(root, 4, b, size, 2, a, 3);         /* delta on 3 */
    /* An old incomplete step (a crash) and an in-flight newer one. */
    void *file;
    size_t len;
    ckpt_shard_info_t info = {.step = 9, .nshards = 1, .raw_size = 4,
                              .total_size = 4};
    ASSERT_OK(ckpt_shard_encode(&tc_codec, &info, a, NULL, &file, &len));
    ASSERT_OK(ckpt_store_put(root, 0, 0, 0, file, len));
    ASSERT_OK(ckpt_store_put(root, 9, 0, 0, file, len));
    free(file);

    /* Keep 1: step 4 and its base 3 stay, 1, 2 and the old partial go. */
    ASSERT_EQ(ckpt_store_retain(root, 1), 3);
    uint64_t *steps;
    size_t ns;
    ASSERT_OK(ckpt_store_list(root, &steps, &ns));
    ASSERT_EQ(ns, 2);
    ASSERT_EQ(steps[0], 4);
    ASSERT_EQ(steps[1], 3);
    free(steps);
    char dir[512];
    ckpt_store_step_dir(root, 9, dir, sizeof(dir));
    ASSERT_EQ(access(dir, F_OK), 0); /* in flight: untouched */
    float *out = malloc(size);
    uint64_t step;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, NULL));
    ASSERT_EQ(step, 4);
    ASSERT(memcmp(out, b, size) == 0);
    th_rmtree(root);
    free(root);
    free(a);
    free(b);
    free(out);
    return 0;
}

/*
 * The newest step's manifest is being rewritten (another node of a shared
 * directory, or another record of the same daemon, has it open and
 * empty): retention must still keep the step its shards are a delta on,
 * read from the shards' own headers, so the step restores once its
 * manifest is whole again.
 */
TEST_IMPL(ckpt_retention_unreadable_manifest)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 1000, size = n * 4;
    float *a = malloc(size), *b = malloc(size);
    tc_fill_weights(a, n);
    memcpy(b, a, size);
    tc_perturb(b, n);
    write_ckpt(root, 1, a, size, 2, NULL, 0);
    write_ckpt(root, 3, a, size, 2, NULL, 0);      /* full */
    write_ckpt(root, 4, b, size, 2, a, 3);         /* delta on 3 */
    char dir[512], mpath[600], saved[600];
    ckpt_store_step_dir(root, 4, dir, sizeof(dir));
    snprintf(mpath, sizeof(mpath), "%s/MANIFEST.json", dir);
    snprintf(saved, sizeof(saved), "%s/manifest.saved", root);
    ASSERT_EQ(rename(mpath, saved), 0);
    FILE *f = fopen(mpath, "w");   /* present, empty: mid-write */
    ASSERT(f != NULL);
    ASSERT_EQ(fclose(f), 0);

    /* Keep 1: only step 1 may go; 3 is step 4's base. */
    ASSERT_EQ(ckpt_store_retain(root, 1), 1);
    ckpt_store_step_dir(root, 3, dir, sizeof(dir));
    ASSERT_MSG(access(dir, F_OK) == 0, "%s: the base of step 4 was removed",
               dir);
    ASSERT_EQ(rename(saved, mpath), 0);
    float *out = malloc(size);
    uint64_t step;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, NULL));
    ASSERT_EQ(step, 4);
    ASSERT(memcmp(out, b, size) == 0);
    th_rmtree(root);
    free(root);
    free(a);
    free(b);
    free(out);
    return 0;
}

/*
 * A delta whose base checkpoint never completed (a node skipped that step
 * under back pressure, so no manifest names it): the restore decodes the
 * base from its files alone, and retention keeps the whole chain.
 */
TEST_IMPL(ckpt_incomplete_base)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 3000, size = n * 4;
    float *s1 = malloc(size), *s2 = malloc(size), *s3 = malloc(size);
    tc_fill_weights(s1, n);
    memcpy(s2, s1, size);
    tc_perturb(s2, n);
    memcpy(s3, s2, size);
    tc_perturb(s3, n);
    write_ckpt(root, 10, s1, size, 3, NULL, 0);
    write_ckpt(root, 20, s2, size, 3, s1, 10);
    char m[600], dir[512];
    ckpt_store_step_dir(root, 20, dir, sizeof(dir));
    snprintf(m, sizeof(m), "%s/MANIFEST.json", dir);
    ASSERT_OK(unlink(m)); /* step 20 never completed */
    write_ckpt(root, 30, s3, size, 3, s2, 20);
    write_ckpt(root, 40, s3, size, 3, s3, 30);

    /* Keep 1 (step 40): its chain 30 <- 20 (no manifest) <- 10 stays. */
    ASSERT_EQ(ckpt_store_retain(root, 1), 0);
    float *out = malloc(size);
    uint64_t step = 0;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, NULL));
    ASSERT_EQ(step, 40);
    ASSERT(memcmp(out, s3, size) == 0);
    /* The base chain through the incomplete step: step 30 alone. */
    ckpt_manifest_t *mm;
    ASSERT_OK(ckpt_store_load_manifest(root, 30, &mm));
    memset(out, 0, size);
    for (uint32_t i = 0; i < mm->nshards; i++)
        ASSERT_OK(ckpt_store_read_shard(root, mm, i,
                                        (char *)out + mm->shards[i].offset,
                                        NULL));
    ckpt_manifest_free(mm);
    ASSERT(memcmp(out, s3, size) == 0);
    th_rmtree(root);
    free(root);
    free(s1);
    free(s2);
    free(s3);
    free(out);
    return 0;
}

/* Replace one copy of shard i of `step` with state encoded against base
 * (delta on base_step) or, with base NULL, a full shard. */
static void rewrite_copy(const char *root, uint64_t step, uint32_t i,
                         int replica, const void *state, size_t size,
                         const void *base, uint64_t base_step)
{
    ckpt_shard_info_t info = {.step = step, .generation = 7, .shard = i,
                              .nshards = 3, .total_size = size};
    ckpt_shard_range(size, 3, i, 4, &info.offset, &info.raw_size);
    if (base != NULL) {
        info.flags = CKPT_F_DELTA;
        info.base_step = base_step;
    }
    void *file;
    size_t len;
    ASSERT_OK(ckpt_shard_encode(&tc_codec, &info,
                                (const char *)state + info.offset,
                                base ? (const char *)base + info.offset
                                     : NULL,
                                &file, &len));
    ASSERT_OK(ckpt_store_put(root, step, i, replica, file, len));
    free(file);
}

/*
 * The two copies of a shard come from writers on two nodes, and a node
 * that skipped a checkpoint under back pressure encodes its next one
 * against an older shard (or writes a full one): the manifest lists the
 * primary's base only. Step 30's replicas of shards 1 and 2 are a delta
 * against step 10 and a full shard while the manifest says "delta on
 * 20"; with those primaries gone, the replicas must still restore step 30
 * (each copy decoded against the base its own header names), and verify
 * calls them repaired, not bad.
 */
TEST_IMPL(ckpt_replica_own_base)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 3000, size = n * 4;
    float *s1 = malloc(size), *s2 = malloc(size), *s3 = malloc(size);
    tc_fill_weights(s1, n);
    memcpy(s2, s1, size);
    tc_perturb(s2, n);
    memcpy(s3, s2, size);
    tc_perturb(s3, n);
    write_ckpt(root, 10, s1, size, 3, NULL, 0);
    write_ckpt(root, 20, s2, size, 3, s1, 10);
    write_ckpt(root, 30, s3, size, 3, s2, 20);
    rewrite_copy(root, 30, 1, 1, s3, size, s1, 10);
    rewrite_copy(root, 30, 2, 1, s3, size, NULL, 0);
    char path[700];
    for (uint32_t i = 1; i < 3; i++) {
        shard_path(path, sizeof(path), root, 30, i, 0);
        ASSERT_OK(unlink(path));
    }
    float *out = malloc(size);
    uint64_t step = 0;
    unsigned repaired = 0;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, &repaired));
    ASSERT_EQ(step, 30);
    ASSERT_EQ(repaired, 2);
    ASSERT(memcmp(out, s3, size) == 0);
    ckpt_manifest_t *m;
    ASSERT_OK(ckpt_store_load_manifest(root, 30, &m));
    ckpt_copy_state_t st[3];
    ASSERT_OK(ckpt_store_check(root, m, st));
    ASSERT_EQ(st[0], CKPT_COPY_OK);
    ASSERT_EQ(st[1], CKPT_COPY_REPAIRED);
    ASSERT_EQ(st[2], CKPT_COPY_REPAIRED);
    ckpt_manifest_free(m);
    th_rmtree(root);
    free(root);
    free(s1);
    free(s2);
    free(s3);
    free(out);
    return 0;
}

/*
 * A writer SIGKILLed at a random moment: the target name either does not
 * exist or holds a complete, verifying shard. Repeated with different
 * timings (the kill lands on a real event: the child's progress pipe).
 */
TEST_IMPL(ckpt_killed_writer)
{
    char *root = th_mkdtemp("ringd-ckpt");
    size_t n = 1u << 20, size = n * 4;
    float *w = malloc(size), *out = malloc(size);
    tc_fill_weights(w, n);
    ckpt_shard_info_t info = {.step = 1, .nshards = 1, .raw_size = size,
                              .total_size = size};
    void *file;
    size_t len;
    ASSERT_OK(ckpt_shard_encode(&tc_codec, &info, w, NULL, &file, &len));
    for (int round = 0; round < 6; round++) {
        int fds[2];
        ASSERT_EQ(pipe(fds), 0);
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            for (uint32_t i = 0;; i++) {
                char c = 1;
                if (write(fds[1], &c, 1) != 1)
                    _exit(1);
                ckpt_store_put(root, 100 + round, i % 3, 0, file, len);
            }
        }
        close(fds[1]);
        char c;
        for (int k = 0; k <= round; k++) /* let it get k writes in */
            ASSERT_EQ(read(fds[0], &c, 1), 1);
        th_kill(pid);
        close(fds[0]);
        for (uint32_t i = 0; i < 3; i++) {
            char p[1024];
            shard_path(p, sizeof(p), root, 100 + round, i, 0);
            void *got;
            size_t glen;
            if (ckpt_read_file(p, 1u << 30, &got, &glen) != 0)
                continue; /* not there: fine */
            ASSERT_MSG(ckpt_shard_decode(got, glen, NULL, out, size, NULL) ==
                           0, "round %d: %s is visible but incomplete",
                       round, p);
            free(got);
        }
        /* And no step without a manifest counts as a checkpoint. */
        uint64_t *steps;
        size_t ns;
        ASSERT_OK(ckpt_store_list(root, &steps, &ns));
        ASSERT_EQ(ns, 0);
        free(steps);
    }
    free(file);
    th_rmtree(root);
    free(root);
    free(w);
    free(out);
    return 0;
}

/* A full file system: a clear -ENOSPC, the older checkpoint intact. */
TEST_IMPL(ckpt_full_disk)
{
    char *root = th_mkdtemp("ringd-ckpt-tmpfs");
    if (mount("tmpfs", root, "tmpfs", 0, "size=2m") != 0) {
        int err = errno;
        th_rmtree(root);
        free(root);
        TEST_SKIP_WHY("cannot mount a small tmpfs: %s", strerror(err));
    }
    size_t n = 1u << 16, size = n * 4; /* 256 KiB of state */
    float *a = malloc(size), *b = malloc(size), *out = malloc(size);
    tc_fill_weights(a, n);
    write_ckpt(root, 1, a, size, 2, NULL, 0);
    /* Incompressible state, written until the disk is full. */
    for (size_t i = 0; i < n; i++) {
        uint32_t r = tc_rnd32();
        memcpy(&b[i], &r, 4);
    }
    int rc = 0;
    for (uint32_t k = 0; k < 64 && rc == 0; k++) {
        ckpt_shard_info_t info = {.step = 2, .nshards = 64, .shard = k,
                                  .raw_size = size, .total_size = size * 64,
                                  .offset = (uint64_t)k * size};
        void *file;
        size_t len;
        ASSERT_OK(ckpt_shard_encode(&tc_codec, &info, b, NULL, &file, &len));
        rc = ckpt_store_put(root, 2, k, 0, file, len);
        free(file);
    }
    ASSERT_EQ(rc, -ENOSPC);
    uint64_t step;
    ASSERT_OK(ckpt_store_restore(root, out, size, &step, NULL));
    ASSERT_EQ(step, 1);
    ASSERT(memcmp(out, a, size) == 0);
    umount2(root, MNT_DETACH);
    th_rmtree(root);
    free(root);
    free(a);
    free(b);
    free(out);
    return 0;
}

/* build/ringctl verify STEP on root's parent (--job = root's last part);
 * its output in out; returns the exit code. */
static int ringctl_verify(const char *dir, const char *job, const char *step,
                          const char *out)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/ringctl", th_bindir());
    char *const argv[] = {path,   "--ckpt-dir", (char *)dir, "--job",
                          (char *)job, "verify", (char *)step, NULL};
    unsetenv("RINGD_ETCD");
    pid_t p = th_spawn(argv, out);
    ASSERT_GT(p, 0);
    int st = -1;
    ASSERT_OK(th_wait(p, 15000, &st));
    ASSERT(WIFEXITED(st));
    return WEXITSTATUS(st);
}

static int file_has(const char *path, const char *needle)
{
    char buf[4096];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, needle) != NULL;
}

/*
 * ringctl verify: a full step and a delta step on it verify; a damaged
 * primary is reported repaired-from-replica (still restorable, exit 0);
 * both copies damaged is "bad" and exit 1, while the base step stays
 * restorable.
 */
TEST_IMPL(ckpt_ringctl_verify)
{
    char *dir = th_mkdtemp("ckpt-verify");
    ASSERT(dir != NULL);
    char root[600], out[700], p[700];
    snprintf(root, sizeof(root), "%s/job1", dir);
    snprintf(out, sizeof(out), "%s/out", dir);
    size_t size = 1 << 18;
    float *a = malloc(size), *b = malloc(size);
    ASSERT(a != NULL && b != NULL);
    tc_fill_weights(a, size / 4);
    memcpy(b, a, size);
    tc_perturb(b, size / 4);
    write_ckpt(root, 10, a, size, 2, NULL, 0);
    write_ckpt(root, 20, b, size, 2, a, 10);

    ASSERT_EQ(ringctl_verify(dir, "job1", "20", out), 0);
    ASSERT(file_has(out, "shard 0  ok\nshard 1  ok\n"));
    ASSERT(file_has(out, "step 20: restorable"));

    shard_path(p, sizeof(p), root, 20, 0, 0);
    flip_byte(p, file_size(p) / 2);
    ASSERT_EQ(ringctl_verify(dir, "job1", "20", out), 0);
    ASSERT(file_has(out, "shard 0  repaired-from-replica\nshard 1  ok\n"));
    ASSERT(file_has(out, "(2 shards, 1 from replicas)"));

    shard_path(p, sizeof(p), root, 20, 0, 1);
    flip_byte(p, file_size(p) / 2);
    ASSERT_EQ(ringctl_verify(dir, "job1", "20", out), 1);
    ASSERT(file_has(out, "shard 0  bad\n"));
    ASSERT(file_has(out, "step 20: NOT restorable"));
    ASSERT_EQ(ringctl_verify(dir, "job1", "10", out), 0);
    /* A step without a manifest, and a bad argument. */
    ASSERT_EQ(ringctl_verify(dir, "job1", "30", out), 1);
    ASSERT_EQ(ringctl_verify(dir, "job1", "x", out), 2);
    free(a);
    free(b);
    th_rmtree(dir);
    free(dir);
    return 0;
}
