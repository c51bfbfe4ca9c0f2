/*
 * fuzz-view.c - the view and node records read from etcd
 * (mb__view_parse, mb__node_parse, membership/mb-view.c).
 *
 * Input: one selector byte, then the JSON, not NUL-terminated. Selector
 * % 8: 0 a view as members read it (mb__view_parse), 1 a node record as
 * the leader reads it (mb__node_parse), 2 a view and 3 a node record
 * through the public readers ringctl uses (mb_view_parse,
 * mb_node_parse); 4 and 5 (and 6, 7) a packed view's member table: the
 * bytes are the decompressed columns text, which the harness compresses
 * and wraps as a view's "packed" field before 0's or 2's reader sees it
 * (mutations of a zstd frame would almost never reach the table parser).
 * A parsed view must be consistent (joiners and the source are members)
 * and survive its own encoding unchanged.
 */
#include "tests/fuzz/fuzz.h"

#include <string.h>
#include <zstd.h>

#include "membership/etcd.h"
#include "membership/mb-int.h"

static void check_member(const mb_member_t *m)
{
    FUZZ_ASSERT(m->node != NULL && m->host != NULL);
    FUZZ_ASSERT(m->addr != NULL || m->addr_len == 0);
    volatile unsigned char x = 0;
    for (size_t i = 0; i < m->addr_len; i++)
        x ^= m->addr[i];
    (void)x;
}

static void check_view(const mb__view_t *v)
{
    size_t joiners = 0;
    FUZZ_ASSERT(v->generation >= 1);
    for (size_t i = 0; i < v->n_members; i++) {
        check_member(&v->members[i]);
        joiners += v->members[i].joiner != 0;
    }
    FUZZ_ASSERT(v->n_joiners == joiners);
    FUZZ_ASSERT(v->source_index >= -1 &&
                v->source_index < (int)v->n_members);
}

static void fuzz_view(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    if (json == NULL)
        return;
    memcpy(json, data, size);
    mb__view_t v;
    if (mb__view_parse(json, size, &v) == 0) {
        check_view(&v);
        char *again = mb__view_json(&v);
        mb__view_t w;
        FUZZ_ASSERT(again != NULL);
        FUZZ_ASSERT(mb__view_parse(again, strlen(again), &w) == 0);
        FUZZ_ASSERT(w.generation == v.generation && w.step == v.step);
        FUZZ_ASSERT(w.n_members == v.n_members);
        FUZZ_ASSERT(w.n_joiners == v.n_joiners);
        FUZZ_ASSERT(w.source_index == v.source_index);
        for (size_t i = 0; i < v.n_members; i++) {
            FUZZ_ASSERT(strcmp(w.members[i].node, v.members[i].node) == 0);
            FUZZ_ASSERT(w.members[i].lease == v.members[i].lease);
            FUZZ_ASSERT(w.members[i].addr_len == v.members[i].addr_len);
        }
        mb__view_free(&w);
        free(again);
        mb__view_free(&v);
    }
    free(json);
}

static void fuzz_node(const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    if (json == NULL)
        return;
    memcpy(json, data, size);
    mb_member_t m;
    if (mb__node_parse("node-1", json, size, &m) == 0) {
        check_member(&m);
        FUZZ_ASSERT(strcmp(m.node, "node-1") == 0);
        mb__member_free(&m);
    }
    free(json);
}

static void fuzz_public(int node, const uint8_t *data, size_t size)
{
    char *json = malloc(size ? size : 1);
    if (json == NULL)
        return;
    memcpy(json, data, size);
    const char *why = NULL;
    if (node) {
        mb_node_rec_t rec;
        if (mb_node_parse("node-1", json, size, &rec, &why) == 0) {
            check_member(&rec.member);
            FUZZ_ASSERT(rec.pid >= -1);
            mb_node_rec_free(&rec);
        } else {
            FUZZ_ASSERT(why != NULL);
        }
    } else {
        mb_view_t *v = NULL;
        if (mb_view_parse(json, size, &v, &why) == 0) {
            size_t joiners = 0;
            FUZZ_ASSERT(v->generation >= 1 && v->my_index == -1);
            for (size_t i = 0; i < v->n_members; i++) {
                check_member(&v->members[i]);
                joiners += v->members[i].joiner != 0;
            }
            FUZZ_ASSERT(v->n_joiners == joiners);
            FUZZ_ASSERT(v->source_index >= -1 &&
                        v->source_index < (int)v->n_members);
            mb_view_free(v);
        } else {
            FUZZ_ASSERT(why != NULL);
        }
    }
    free(json);
}

/* The columns text in data as a view's "packed" field, then a reader. */
static void fuzz_packed(int public, const uint8_t *data, size_t size)
{
    size_t cap = ZSTD_compressBound(size);
    void *z = malloc(cap ? cap : 1);
    char *b64 = NULL, *json = NULL;
    size_t zn = z != NULL ? ZSTD_compress(z, cap, data, size, 1) : 0;
    if (z != NULL && !ZSTD_isError(zn))
        b64 = etcd_b64_dup(z, zn);
    free(z);
    if (b64 == NULL)
        return;
    size_t n = strlen(b64) + 64;
    json = malloc(n);
    if (json != NULL) {
        int len = snprintf(json, n,
                           "{\"generation\":1,\"step\":0,\"packed\":\"%s\"}",
                           b64);
        if (public)
            fuzz_public(0, (const uint8_t *)json, (size_t)len);
        else
            fuzz_view((const uint8_t *)json, (size_t)len);
    }
    free(json);
    free(b64);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    switch (data[0] % 8) {
    case 0: fuzz_view(data + 1, size - 1); break;
    case 1: fuzz_node(data + 1, size - 1); break;
    case 2:
    case 3: fuzz_public(data[0] % 8 == 3, data + 1, size - 1); break;
    default: fuzz_packed(data[0] % 2, data + 1, size - 1); break;
    }
    return 0;
}
