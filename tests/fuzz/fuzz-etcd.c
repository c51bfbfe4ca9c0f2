/*
 * fuzz-etcd.c - the etcd gateway's replies as the client parses them
 * (membership/etcd-json.c, etcd-watch.c).
 *
 * Input: one selector byte, then the reply body. Selectors 0-6 parse a
 * unary reply of that kind (range, put, delete, txn, lease grant,
 * keepalive, time-to-live) with etcd__parse_reply and the error body
 * with etcd__parse_error; 7 feeds the bytes as a watch stream, in
 * chunks whose size the second byte picks, through etcd__watch_feed as
 * the write callback does. Every key, value and event handed out must be
 * readable over its stated length.
 */
#include "tests/fuzz/fuzz.h"

#include <string.h>

#include "membership/etcd-int.h"

static volatile unsigned char sink;

static void touch(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sink ^= (unsigned char)p[i];
}

static void touch_kv(const etcd_kv_t *kv)
{
    FUZZ_ASSERT(kv->key != NULL && kv->value != NULL);
    touch(kv->key, strlen(kv->key) + 1);
    touch(kv->value, kv->value_len + 1);
    FUZZ_ASSERT(kv->value[kv->value_len] == '\0');
}

static void touch_result(const etcd_result_t *r, int depth)
{
    FUZZ_ASSERT(depth <= 1); /* a txn response holds no txn */
    for (size_t i = 0; i < r->n_kvs; i++)
        touch_kv(&r->kvs[i]);
    for (size_t i = 0; i < r->n_responses; i++)
        touch_result(&r->responses[i], depth + 1);
}

static const etcd_kind_t kinds[] = {
    ETCD_K_RANGE, ETCD_K_PUT, ETCD_K_DELETE, ETCD_K_TXN,
    ETCD_K_GRANT, ETCD_K_KEEPALIVE, ETCD_K_TTL,
};

static void fuzz_reply(etcd_kind_t kind, const uint8_t *data, size_t size)
{
    cJSON *json = cJSON_ParseWithLength((const char *)data, size);
    etcd_arena_t arena = {0};
    etcd_result_t res;
    if (json != NULL && etcd__parse_reply(kind, json, &arena, &res) == 0)
        touch_result(&res, 0);
    etcd__arena_free(&arena);
    int code;
    const char *msg;
    etcd__parse_error(json, &code, &msg);
    FUZZ_ASSERT(msg != NULL);
    touch(msg, strlen(msg));
    cJSON_Delete(json);
}

static void on_update(const etcd_watch_update_t *up, void *data)
{
    int64_t *next_rev = data;
    FUZZ_ASSERT(!up->reset && up->n_events > 0);
    for (size_t i = 0; i < up->n_events; i++) {
        touch_kv(&up->events[i].kv);
        /* Events older than the resume point were delivered already. */
        FUZZ_ASSERT(up->events[i].kv.mod_revision >= *next_rev);
    }
}

static void fuzz_watch(size_t chunk, const uint8_t *data, size_t size)
{
    /* A client that never runs: the stream's lines only count in it. */
    static etcd_t e;
    etcd_watch_t w;
    etcd_req_t r;
    memset(&w, 0, sizeof(w));
    memset(&r, 0, sizeof(r));
    w.e = &e;
    int64_t before = 1;
    w.next_rev = 1;
    w.cb = on_update;
    w.data = &before;
    r.kind = ETCD_K_WATCH;
    r.watch = &w;
    r.cap = size + 1;
    r.buf = malloc(r.cap);
    if (r.buf == NULL)
        return;
    r.buf[0] = '\0';
    for (size_t off = 0; off < size; off += chunk) {
        size_t n = size - off < chunk ? size - off : chunk;
        memcpy(r.buf + r.len, data + off, n);
        r.len += n;
        r.buf[r.len] = '\0';
        before = w.next_rev;
        if (etcd__watch_feed(&r) != 0)
            break;
        FUZZ_ASSERT(r.line_start == 0 && r.len <= size);
        FUZZ_ASSERT(memchr(r.buf, '\n', r.len) == NULL);
    }
    free(r.buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    unsigned sel = data[0] % 8;
    if (sel < 7)
        fuzz_reply(kinds[sel], data + 1, size - 1);
    else
        fuzz_watch((size_t)data[1] + 1, data + 2, size - 2);
    return 0;
}
