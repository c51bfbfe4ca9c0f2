/*
 * etcd-json.c - base64 and the validation of gateway replies.
 *
 * The gateway writes int64 fields as JSON strings, base64 for bytes, and
 * leaves out every field at its default value, so "absent" means 0/empty
 * here and only a wrong type or bad encoding is an error.
 */
#include "membership/etcd-int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void etcd_b64_encode(const void *in, size_t n, char *out)
{
    const unsigned char *p = in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            v |= p[i + 2];
        out[o++] = b64_chars[(v >> 18) & 63];
        out[o++] = b64_chars[(v >> 12) & 63];
        out[o++] = i + 1 < n ? b64_chars[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < n ? b64_chars[v & 63] : '=';
    }
    out[o] = '\0';
}

static int b64_value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+' || c == '-')
        return 62;
    if (c == '/' || c == '_')
        return 63;
    return -1;
}

long etcd_b64_decode(const char *in, size_t len, void *out)
{
    unsigned char *o = out;
    size_t n = 0;
    while (len > 0 && in[len - 1] == '=')
        len--;
    if (len % 4 == 1)
        return ST_EPROTO;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < len; i++) {
        int v = b64_value(in[i]);
        if (v < 0)
            return ST_EPROTO;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            o[n++] = (unsigned char)(acc >> bits);
        }
    }
    return (long)n;
}

void *etcd__arena_alloc(etcd_arena_t *a, size_t size)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        void **p = realloc(a->ptrs, cap * sizeof(*p));
        if (p == NULL)
            return NULL;
        a->ptrs = p;
        a->cap = cap;
    }
    void *m = calloc(1, size ? size : 1);
    if (m != NULL)
        a->ptrs[a->n++] = m;
    return m;
}

void etcd__arena_free(etcd_arena_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->ptrs[i]);
    free(a->ptrs);
    memset(a, 0, sizeof(*a));
}

char *etcd_b64_dup(const void *in, size_t n)
{
    char *s = malloc(ETCD_B64_ENC_LEN(n));
    if (s != NULL)
        etcd_b64_encode(in, n, s);
    return s;
}

int etcd__json_bool(const cJSON *obj, const char *name, int *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = 0;
    if (f == NULL)
        return 0;
    if (!cJSON_IsBool(f))
        return ST_EPROTO;
    *out = cJSON_IsTrue(f);
    return 0;
}

/* Decode a base64 field into an arena copy with a NUL after it. */
int etcd__json_bytes(const cJSON *obj, const char *name, etcd_arena_t *a,
                     const char **out, size_t *len_p)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    const char *s = "";
    if (f != NULL) {
        if (!cJSON_IsString(f))
            return ST_EPROTO;
        s = f->valuestring;
    }
    size_t slen = strlen(s);
    char *buf = etcd__arena_alloc(a, slen / 4 * 3 + 4);
    if (buf == NULL)
        return ST_ENOMEM;
    long n = etcd_b64_decode(s, slen, buf);
    if (n < 0)
        return (int)n;
    buf[n] = '\0';
    *out = buf;
    if (len_p != NULL)
        *len_p = (size_t)n;
    return 0;
}

int etcd__parse_kv(const cJSON *o, etcd_arena_t *a, etcd_kv_t *kv)
{
    if (!cJSON_IsObject(o))
        return ST_EPROTO;
    int rc = etcd__json_bytes(o, "key", a, &kv->key, NULL);
    if (rc == 0)
        rc = etcd__json_bytes(o, "value", a, &kv->value, &kv->value_len);
    if (rc == 0)
        rc = rd_json_i64(o, "create_revision", &kv->create_revision);
    if (rc == 0)
        rc = rd_json_i64(o, "mod_revision", &kv->mod_revision);
    if (rc == 0)
        rc = rd_json_i64(o, "version", &kv->version);
    if (rc == 0)
        rc = rd_json_i64(o, "lease", &kv->lease);
    return rc;
}

static int parse_header(const cJSON *o, etcd_result_t *res)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "header");
    if (!cJSON_IsObject(h))
        return ST_EPROTO;
    return rd_json_i64(h, "revision", &res->revision);
}

static int parse_kvs(const cJSON *o, etcd_arena_t *a, etcd_result_t *res)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "kvs");
    int rc = rd_json_i64(o, "count", &res->count);
    if (rc != 0 || arr == NULL)
        return rc;
    if (!cJSON_IsArray(arr))
        return ST_EPROTO;
    size_t n = (size_t)cJSON_GetArraySize(arr);
    etcd_kv_t *kvs = etcd__arena_alloc(a, n * sizeof(*kvs));
    if (kvs == NULL)
        return ST_ENOMEM;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        rc = etcd__parse_kv(it, a, &kvs[i++]);
        if (rc != 0)
            return rc;
    }
    res->kvs = kvs;
    res->n_kvs = n;
    return 0;
}

/* One txn response: {"response_range":{...}} or put/delete_range. */
static int parse_txn_resp(const cJSON *o, etcd_arena_t *a,
                          etcd_result_t *res)
{
    const cJSON *r;
    if (!cJSON_IsObject(o))
        return ST_EPROTO;
    if ((r = cJSON_GetObjectItemCaseSensitive(o, "response_range")))
        return cJSON_IsObject(r) ? parse_kvs(r, a, res) : ST_EPROTO;
    if ((r = cJSON_GetObjectItemCaseSensitive(o, "response_delete_range")))
        return cJSON_IsObject(r) ? rd_json_i64(r, "deleted",
                                                  &res->deleted)
                                 : ST_EPROTO;
    if ((r = cJSON_GetObjectItemCaseSensitive(o, "response_put")))
        return cJSON_IsObject(r) ? 0 : ST_EPROTO;
    return ST_EPROTO;
}

static int parse_txn(const cJSON *o, etcd_arena_t *a, etcd_result_t *res)
{
    int rc = etcd__json_bool(o, "succeeded", &res->succeeded);
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "responses");
    if (rc != 0 || arr == NULL)
        return rc;
    if (!cJSON_IsArray(arr))
        return ST_EPROTO;
    size_t n = (size_t)cJSON_GetArraySize(arr);
    etcd_result_t *subs = etcd__arena_alloc(a, n * sizeof(*subs));
    if (subs == NULL)
        return ST_ENOMEM;
    size_t i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        subs[i].revision = res->revision;
        rc = parse_txn_resp(it, a, &subs[i++]);
        if (rc != 0)
            return rc;
    }
    res->responses = subs;
    res->n_responses = n;
    return 0;
}

static int parse_lease(const cJSON *o, etcd_result_t *res)
{
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsString(err) && err->valuestring[0] != '\0') {
        RD_ERROR("etcd lease: %s", err->valuestring);
        return ST_EINVAL;
    }
    int rc = rd_json_i64(o, "ID", &res->lease_id);
    if (rc == 0)
        rc = rd_json_i64(o, "TTL", &res->ttl);
    if (rc == 0)
        rc = rd_json_i64(o, "grantedTTL", &res->granted_ttl);
    return rc;
}

int etcd__parse_reply(etcd_kind_t kind, const cJSON *o, etcd_arena_t *a,
                      etcd_result_t *res)
{
    memset(res, 0, sizeof(*res));
    if (!cJSON_IsObject(o))
        return ST_EPROTO;
    if (kind == ETCD_K_KEEPALIVE) {
        /* A streaming endpoint: the reply is wrapped in "result". */
        o = cJSON_GetObjectItemCaseSensitive(o, "result");
        if (!cJSON_IsObject(o))
            return ST_EPROTO;
    }
    int rc = parse_header(o, res);
    if (rc != 0)
        return rc;
    switch (kind) {
    case ETCD_K_RANGE:
        return parse_kvs(o, a, res);
    case ETCD_K_DELETE:
        return rd_json_i64(o, "deleted", &res->deleted);
    case ETCD_K_TXN:
        return parse_txn(o, a, res);
    case ETCD_K_GRANT:
    case ETCD_K_KEEPALIVE:
    case ETCD_K_TTL:
        return parse_lease(o, res);
    default:
        return 0;
    }
}

/* The gateway's error body: {"error":"...","message":"...","code":N};
 * stream errors nest it: {"error":{"grpc_code":N,"message":"..."}}. */
void etcd__parse_error(const cJSON *o, int *code_p, const char **msg_p)
{
    *code_p = -1;
    *msg_p = "(no message)";
    if (!cJSON_IsObject(o))
        return;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (cJSON_IsObject(e))
        o = e;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "code");
    if (c == NULL)
        c = cJSON_GetObjectItemCaseSensitive(o, "grpc_code");
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "message");
    if (cJSON_IsNumber(c))
        *code_p = c->valueint;
    if (cJSON_IsString(m))
        *msg_p = m->valuestring;
    else if (cJSON_IsString(e))
        *msg_p = e->valuestring;
}
