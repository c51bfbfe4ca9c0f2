/*
 * fuzz-ckpt.c - the checkpoint readers (checkpoint/): shard files
 * (ckpt_shard_peek, ckpt_shard_decode) and manifests
 * (ckpt_manifest_from_json).
 *
 * Input: one selector byte, then the file. Selector bit 0 clear: a
 * manifest, which must tile its state and survive its own encoding.
 * Set: a shard file; with bit 1 set the harness first rewrites the
 * header's own xxh64 (and with bit 2 the payload size) so that mutations
 * reach the fields and the zstd frame behind that checksum. A decoded
 * shard must match what its header promised.
 */
#include "tests/fuzz/fuzz.h"

#include <string.h>
#include <xxhash.h>

#include "checkpoint/ckpt.h"
#include "common/status.h"

#define HDR_SIZE 128
#define MAX_RAW (1u << 20)

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static void fuzz_manifest(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    ckpt_manifest_t *m = NULL, *m2 = NULL;
    if (json == NULL)
        return;
    memcpy(json, data, size);
    if (ckpt_manifest_from_json(json, size, &m) != 0)
        goto out;
    uint64_t end = 0;
    for (uint32_t i = 0; i < m->nshards; i++) {
        FUZZ_ASSERT(m->shards[i].offset == end);
        FUZZ_ASSERT(m->shards[i].owner < m->nshards &&
                    m->shards[i].replica < m->nshards);
        FUZZ_ASSERT(m->members[i] != NULL);
        end += m->shards[i].size;
    }
    FUZZ_ASSERT(end == m->total_size);
    char *again = NULL;
    FUZZ_ASSERT(ckpt_manifest_to_json(m, &again) == 0);
    FUZZ_ASSERT(ckpt_manifest_from_json(again, strlen(again), &m2) == 0);
    FUZZ_ASSERT(m2->step == m->step && m2->generation == m->generation &&
                m2->total_size == m->total_size &&
                m2->nshards == m->nshards && m2->elem_size == m->elem_size);
    for (uint32_t i = 0; i < m->nshards; i++) {
        FUZZ_ASSERT(memcmp(&m->shards[i], &m2->shards[i],
                           sizeof(m->shards[i])) == 0);
        FUZZ_ASSERT(strcmp(m->members[i], m2->members[i]) == 0);
    }
    free(again);
out:
    ckpt_manifest_free(m2);
    ckpt_manifest_free(m);
    free(json);
}

/* Field by field: the struct has tail padding (84 bytes of fields in
 * 88), which neither reader sets, so memcmp would compare garbage. */
static int info_eq(const ckpt_shard_info_t *a, const ckpt_shard_info_t *b)
{
    return a->step == b->step && a->generation == b->generation &&
           a->base_step == b->base_step && a->offset == b->offset &&
           a->raw_size == b->raw_size && a->total_size == b->total_size &&
           a->raw_xxh64 == b->raw_xxh64 && a->comp_size == b->comp_size &&
           a->shard == b->shard && a->nshards == b->nshards &&
           a->flags == b->flags && a->elem_size == b->elem_size &&
           a->piece_size == b->piece_size;
}

static void fuzz_shard(unsigned sel, const uint8_t *data, size_t size)
{
    unsigned char *file = malloc(size ? size : 1);
    if (file == NULL)
        return;
    memcpy(file, data, size);
    if (size >= HDR_SIZE && (sel & 4))
        put64(file + 72, size - HDR_SIZE);
    if (size >= HDR_SIZE && (sel & 2))
        put64(file + HDR_SIZE - 8, XXH64(file, HDR_SIZE - 8, 0));
    ckpt_shard_info_t info;
    if (ckpt_shard_peek(file, size, &info) != 0)
        goto out;
    FUZZ_ASSERT(info.shard < info.nshards);
    FUZZ_ASSERT(info.offset <= info.total_size &&
                info.raw_size <= info.total_size - info.offset);
    FUZZ_ASSERT(info.comp_size == size - HDR_SIZE);
    if (info.raw_size > MAX_RAW)
        goto out;
    /* Exactly raw_size bytes each, so an overrun is caught. */
    size_t n = (size_t)info.raw_size;
    unsigned char *raw = malloc(n ? n : 1);
    unsigned char *base = calloc(1, n ? n : 1);
    ckpt_shard_info_t got;
    if (raw != NULL && base != NULL) {
        int rc = ckpt_shard_decode(file, size,
                                   (info.flags & CKPT_F_DELTA) ? base : NULL,
                                   raw, n, &got);
        FUZZ_ASSERT(rc == 0 || rc == ST_ECORRUPT || rc == ST_ENOMEM);
        if (rc == 0) {
            FUZZ_ASSERT(info_eq(&got, &info));
            FUZZ_ASSERT(XXH64(raw, n, 0) == info.raw_xxh64);
        }
        /* Too small a destination is refused, never overrun. */
        if (n > 0)
            FUZZ_ASSERT(ckpt_shard_decode(file, size, base, raw, n - 1,
                                          NULL) != 0);
    }
    free(base);
    free(raw);
out:
    free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1)
        fuzz_shard(data[0], data + 1, size - 1);
    else
        fuzz_manifest(data + 1, size - 1);
    return 0;
}
