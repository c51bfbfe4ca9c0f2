/*
 * etcd-kv.c - the KV, txn and lease calls: each builds its JSON body and
 * hands it to etcd__call (etcd.c), which sends it and parses the reply.
 */
#include "membership/etcd-int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

static void add_b64(cJSON *o, const char *name, const void *p, size_t n)
{
    char *s = etcd_b64_dup(p, n);
    if (s != NULL)
        cJSON_AddStringToObject(o, name, s);
    else
        cJSON_AddNullToObject(o, name); /* fails the request below */
    free(s);
}

void etcd__add_i64(cJSON *o, const char *name, int64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%lld", (long long)v);
    cJSON_AddStringToObject(o, name, s);
}

/* range_end for "every key starting with key": key with its last byte
 * incremented (trailing 0xff bytes dropped); "\0" means all keys. */
void etcd__add_range(cJSON *o, const char *key, int prefix)
{
    size_t n = strlen(key);
    add_b64(o, "key", key, n);
    if (!prefix)
        return;
    unsigned char end[1024];
    if (n > sizeof(end))
        n = sizeof(end);
    memcpy(end, key, n);
    while (n > 0 && end[n - 1] == 0xff)
        n--;
    if (n == 0) {
        add_b64(o, "range_end", "", 1);
        return;
    }
    end[n - 1]++;
    add_b64(o, "range_end", end, n);
}

static cJSON *op_json(const etcd_op_t *op)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *w = cJSON_CreateObject();
    switch (op->type) {
    case ETCD_OP_PUT:
        add_b64(o, "key", op->key, strlen(op->key));
        add_b64(o, "value", op->value, op->value_len);
        if (op->lease != 0)
            etcd__add_i64(o, "lease", op->lease);
        cJSON_AddItemToObject(w, "request_put", o);
        break;
    case ETCD_OP_DELETE:
        etcd__add_range(o, op->key, op->prefix);
        cJSON_AddItemToObject(w, "request_delete_range", o);
        break;
    default:
        etcd__add_range(o, op->key, op->prefix);
        cJSON_AddItemToObject(w, "request_range", o);
        break;
    }
    return w;
}

static cJSON *cmp_json(const etcd_cmp_t *c)
{
    static const char *const targets[] = {"VALUE", "VERSION", "CREATE",
                                          "MOD"};
    static const char *const results[] = {"EQUAL", "GREATER", "LESS",
                                          "NOT_EQUAL"};
    static const char *const fields[] = {"value", "version",
                                         "create_revision", "mod_revision"};
    cJSON *o = cJSON_CreateObject();
    add_b64(o, "key", c->key, strlen(c->key));
    cJSON_AddStringToObject(o, "target", targets[c->target & 3]);
    cJSON_AddStringToObject(o, "result", results[c->result & 3]);
    if (c->target == ETCD_CMP_VALUE)
        add_b64(o, "value", c->value, c->value_len);
    else
        etcd__add_i64(o, fields[c->target & 3], c->number);
    return o;
}

int etcd_put(etcd_t *e, const char *key, const void *value,
             size_t value_len, int64_t lease, etcd_cb cb, void *data)
{
    etcd_op_t op = {ETCD_OP_PUT, key, 0, value, value_len, lease};
    cJSON *w = op_json(&op);
    cJSON *b = cJSON_DetachItemFromObject(w, "request_put");
    cJSON_Delete(w);
    return etcd__call(e, ETCD_K_PUT, "/v3/kv/put", b, cb, data);
}

int etcd_get(etcd_t *e, const char *key, int prefix, etcd_cb cb, void *data)
{
    cJSON *b = cJSON_CreateObject();
    etcd__add_range(b, key, prefix);
    return etcd__call(e, ETCD_K_RANGE, "/v3/kv/range", b, cb, data);
}

int etcd_count(etcd_t *e, const char *key, int prefix, etcd_cb cb,
               void *data)
{
    cJSON *b = cJSON_CreateObject();
    etcd__add_range(b, key, prefix);
    cJSON_AddBoolToObject(b, "count_only", 1);
    return etcd__call(e, ETCD_K_RANGE, "/v3/kv/range", b, cb, data);
}

int etcd_delete(etcd_t *e, const char *key, int prefix, etcd_cb cb,
                void *data)
{
    cJSON *b = cJSON_CreateObject();
    etcd__add_range(b, key, prefix);
    return etcd__call(e, ETCD_K_DELETE, "/v3/kv/deleterange", b, cb, data);
}

int etcd_txn(etcd_t *e, const etcd_cmp_t *cmps, size_t n_cmps,
             const etcd_op_t *success, size_t n_success,
             const etcd_op_t *failure, size_t n_failure, etcd_cb cb,
             void *data)
{
    cJSON *b = cJSON_CreateObject();
    cJSON *c = cJSON_AddArrayToObject(b, "compare");
    cJSON *s = cJSON_AddArrayToObject(b, "success");
    cJSON *f = cJSON_AddArrayToObject(b, "failure");
    for (size_t i = 0; i < n_cmps; i++)
        cJSON_AddItemToArray(c, cmp_json(&cmps[i]));
    for (size_t i = 0; i < n_success; i++)
        cJSON_AddItemToArray(s, op_json(&success[i]));
    for (size_t i = 0; i < n_failure; i++)
        cJSON_AddItemToArray(f, op_json(&failure[i]));
    return etcd__call(e, ETCD_K_TXN, "/v3/kv/txn", b, cb, data);
}

static int lease_call(etcd_t *e, etcd_kind_t kind, const char *path,
                      const char *field, int64_t v, etcd_cb cb, void *data)
{
    cJSON *b = cJSON_CreateObject();
    etcd__add_i64(b, field, v);
    return etcd__call(e, kind, path, b, cb, data);
}

int etcd_lease_grant(etcd_t *e, int64_t ttl_s, etcd_cb cb, void *data)
{
    return lease_call(e, ETCD_K_GRANT, "/v3/lease/grant", "TTL", ttl_s, cb,
                      data);
}

int etcd_lease_keepalive(etcd_t *e, int64_t lease, etcd_cb cb, void *data)
{
    return lease_call(e, ETCD_K_KEEPALIVE, "/v3/lease/keepalive", "ID",
                      lease, cb, data);
}

int etcd_lease_revoke(etcd_t *e, int64_t lease, etcd_cb cb, void *data)
{
    return lease_call(e, ETCD_K_REVOKE, "/v3/lease/revoke", "ID", lease, cb,
                      data);
}

int etcd_lease_timetolive(etcd_t *e, int64_t lease, etcd_cb cb, void *data)
{
    return lease_call(e, ETCD_K_TTL, "/v3/lease/timetolive", "ID", lease,
                      cb, data);
}

