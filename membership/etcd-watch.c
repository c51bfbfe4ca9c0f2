/*
 * etcd-watch.c - a prefix watch: a range read (the reset), then a streamed
 * /v3/watch from the next revision, split into lines as chunks arrive,
 * resumed after a disconnect and re-read after a compaction.
 */
#include "membership/etcd-int.h"

#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

static void watch_next(uv_timer_t *t);

static void watch_free_cb(uv_handle_t *h)
{
    etcd_watch_t *w = h->data;
    free(w->key_b64);
    free(w->end_b64);
    free(w);
}

void etcd__watch_free(etcd_watch_t *w)
{
    w->stopped = 1;
    if (w->req != NULL) {
        w->req->watch = NULL;
        etcd__req_cancel(w->req);
        w->req = NULL;
    }
    LIST_DEL(w->e->watches, w);
    uv_close((uv_handle_t *)&w->timer, watch_free_cb);
}

void etcd_watch_stop(etcd_watch_t *w)
{
    if (w != NULL && !w->stopped)
        etcd__watch_free(w);
}

static void watch_retry(etcd_watch_t *w)
{
    w->req = NULL;
    uv_timer_start(&w->timer, watch_next, (uint64_t)w->backoff_ms, 0);
    w->backoff_ms = w->backoff_ms * 2 > 1000 ? 1000 : w->backoff_ms * 2;
}

static void watch_snapshot_cb(int status, const etcd_result_t *res,
                              void *data)
{
    etcd_watch_t *w = data;
    if (status != 0) {
        watch_retry(w);
        return;
    }
    w->req = NULL;
    w->next_rev = res->revision + 1;
    etcd_watch_update_t up = {1, res->revision, res->kvs, res->n_kvs,
                              NULL, 0};
    w->cb(&up, w->data);
    if (!w->stopped)
        uv_timer_start(&w->timer, watch_next, 0, 0);
}

void etcd__watch_stream_done(etcd_watch_t *w, int status)
{
    if (w == NULL || w->stopped)
        return;
    /* A stream that lived a while was healthy: retry quickly. One that
     * fails at once (bad replies, auth) backs off to 1 s. Through an
     * outage a member's every watch retries: each says so once. */
    if (uv_now(w->e->loop) - w->started_ms > 1000) {
        w->backoff_ms = 50;
        w->fails = 0;
    }
    if (w->fails++ > 0)
        RD_DEBUG("etcd watch: stream ended again (%s), try %u",
                 st_strerror(status), w->fails);
    else if (w->next_rev == 0)
        RD_INFO("etcd watch: stream ended (%s); re-reading the range",
                st_strerror(status));
    else
        RD_INFO("etcd watch: stream ended (%s); resuming at revision %lld",
                st_strerror(status), (long long)w->next_rev);
    watch_retry(w);
}

/* Start the snapshot range or the stream, whichever is due. */
static void watch_next(uv_timer_t *t)
{
    etcd_watch_t *w = t->data;
    etcd_t *e = w->e;
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "key", w->key_b64);
    if (w->end_b64 != NULL)
        cJSON_AddStringToObject(b, "range_end", w->end_b64);
    etcd_req_t *r;
    int rc;
    if (w->next_rev == 0) {
        rc = etcd__req_new(e, ETCD_K_RANGE, "/v3/kv/range", b,
                           watch_snapshot_cb, w, &r);
    } else {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "create_request", b);
        etcd__add_i64(b, "start_revision", w->next_rev);
        cJSON_AddBoolToObject(b, "progress_notify", 1);
        rc = etcd__req_new(e, ETCD_K_WATCH, "/v3/watch", o, NULL, NULL, &r);
        if (rc == 0) {
            r->watch = w;
            r->quiet = w->fails > 0;
            e->stats.watch_streams++;
        }
        w->started_ms = uv_now(e->loop);
    }
    if (rc != 0) {
        watch_retry(w);
        return;
    }
    w->req = r;
    etcd__req_submit(r);
}

/* A range of one key has no range_end. */
static int watch_start(etcd_t *e, const char *key, int prefix,
                       etcd_watch_cb cb, void *data, etcd_watch_t **watch_p)
{
    etcd_watch_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return ST_ENOMEM;
    cJSON *tmp = cJSON_CreateObject();
    etcd__add_range(tmp, key, prefix);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(tmp, "key");
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(tmp, "range_end");
    w->key_b64 = cJSON_IsString(k) ? strdup(k->valuestring) : NULL;
    w->end_b64 = cJSON_IsString(end) ? strdup(end->valuestring) : NULL;
    cJSON_Delete(tmp);
    if (w->key_b64 == NULL || (prefix && w->end_b64 == NULL)) {
        free(w->key_b64);
        free(w->end_b64);
        free(w);
        return ST_ENOMEM;
    }
    w->e = e;
    w->cb = cb;
    w->data = data;
    w->backoff_ms = 50;
    uv_timer_init(e->loop, &w->timer);
    w->timer.data = w;
    LIST_ADD(e->watches, w);
    uv_timer_start(&w->timer, watch_next, 0, 0);
    *watch_p = w;
    return 0;
}

int etcd_watch_start(etcd_t *e, const char *prefix, etcd_watch_cb cb,
                     void *data, etcd_watch_t **watch_p)
{
    return watch_start(e, prefix, 1, cb, data, watch_p);
}

int etcd_watch_key(etcd_t *e, const char *key, etcd_watch_cb cb,
                   void *data, etcd_watch_t **watch_p)
{
    return watch_start(e, key, 0, cb, data, watch_p);
}

/* Deliver the events of one result; returns 0 or ST_EPROTO. */
static int watch_events(etcd_watch_t *w, const cJSON *arr, int64_t rev)
{
    etcd_arena_t a = {0};
    int rc = ST_EPROTO;
    if (!cJSON_IsArray(arr))
        goto out;
    size_t n = (size_t)cJSON_GetArraySize(arr), k = 0;
    etcd_event_t *ev = etcd__arena_alloc(&a, n * sizeof(*ev));
    if (ev == NULL)
        goto out;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        if (type != NULL && !cJSON_IsString(type))
            goto out;
        ev[k].is_delete = type && strcmp(type->valuestring, "DELETE") == 0;
        if (etcd__parse_kv(cJSON_GetObjectItemCaseSensitive(it, "kv"), &a,
                           &ev[k].kv) != 0) {
            RD_ERROR("etcd watch: malformed event");
            goto out;
        }
        if (ev[k].kv.mod_revision >= w->next_rev)
            k++; /* older ones were delivered before a reconnect */
    }
    rc = 0;
    if (k == 0)
        goto out;
    w->next_rev = ev[k - 1].kv.mod_revision + 1;
    etcd_watch_update_t up = {0, rev, NULL, 0, ev, k};
    w->cb(&up, w->data);
out:
    etcd__arena_free(&a);
    return rc;
}

/* One line of the stream: {"result":{...}} or {"error":{...}}. */
static int watch_line(etcd_watch_t *w, const char *line, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(line, len);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
    int rc = ST_EPROTO, canceled = 0, created = 0;
    int64_t rev = 0, compact = 0;
    if (!cJSON_IsObject(res)) {
        int code;
        const char *msg;
        etcd__parse_error(j, &code, &msg);
        RD_ERROR("etcd watch: bad line (%s): %.200s", msg, line);
        goto out;
    }
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(res, "header");
    const cJSON *evs = cJSON_GetObjectItemCaseSensitive(res, "events");
    if (!cJSON_IsObject(h) || rd_json_i64(h, "revision", &rev) != 0 ||
        etcd__json_bool(res, "canceled", &canceled) != 0 ||
        etcd__json_bool(res, "created", &created) != 0 ||
        rd_json_i64(res, "compact_revision", &compact) != 0) {
        RD_ERROR("etcd watch: malformed result: %.200s", line);
        goto out;
    }
    if (canceled) {
        RD_WARN("etcd watch: canceled (compacted at %lld); re-reading",
                (long long)compact);
        if (compact > 0) {
            w->next_rev = 0; /* history is gone: take a new snapshot */
            w->e->stats.watch_compacted++;
        }
        rc = ST_ESTALE;
        goto out;
    }
    if (evs != NULL)
        rc = watch_events(w, evs, rev);
    else {
        if (!created && rev + 1 > w->next_rev)
            w->next_rev = rev + 1; /* progress: nothing up to rev missed */
        rc = 0;
    }
out:
    cJSON_Delete(j);
    return rc;
}

/* Split the buffered stream on '\n' and hand over complete lines. */
int etcd__watch_feed(etcd_req_t *r)
{
    char *nl;
    while (r->watch != NULL &&
           (nl = memchr(r->buf + r->line_start, '\n',
                        r->len - r->line_start)) != NULL) {
        size_t n = (size_t)(nl - (r->buf + r->line_start));
        int rc = n > 0 ? watch_line(r->watch, r->buf + r->line_start, n)
                       : 0;
        if (rc != 0) {
            r->stream_rc = rc;
            return -1;
        }
        r->line_start += n + 1;
    }
    if (r->line_start > 0) {
        memmove(r->buf, r->buf + r->line_start, r->len - r->line_start);
        r->len -= r->line_start;
        r->line_start = 0;
        r->buf[r->len] = '\0';
    }
    return 0;
}
