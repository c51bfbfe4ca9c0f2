/*
 * etcd-int.h - internals shared by the etcd client's files.
 */
#ifndef RINGD_ETCD_INT_H
#define RINGD_ETCD_INT_H

#include <cjson/cJSON.h>

#include "membership/etcd.h"

/* What a request is, which decides how its reply is parsed. */
typedef enum {
    ETCD_K_RANGE = 0,
    ETCD_K_PUT,
    ETCD_K_DELETE,
    ETCD_K_TXN,
    ETCD_K_GRANT,
    ETCD_K_KEEPALIVE,
    ETCD_K_REVOKE,
    ETCD_K_TTL,
    ETCD_K_AUTH,
    ETCD_K_WATCH,
} etcd_kind_t;

/* Allocations that live as long as one parsed reply. */
typedef struct {
    void **ptrs;
    size_t n, cap;
} etcd_arena_t;

void *etcd__arena_alloc(etcd_arena_t *a, size_t size);
void etcd__arena_free(etcd_arena_t *a);
char *etcd__b64_dup(const void *in, size_t n);

int etcd__json_i64(const cJSON *obj, const char *name, int64_t *out);
int etcd__json_bool(const cJSON *obj, const char *name, int *out);
int etcd__json_bytes(const cJSON *obj, const char *name, etcd_arena_t *a,
                     const char **out, size_t *len_p);
int etcd__parse_kv(const cJSON *o, etcd_arena_t *a, etcd_kv_t *kv);
int etcd__parse_reply(etcd_kind_t kind, const cJSON *o, etcd_arena_t *a,
                      etcd_result_t *res);
void etcd__parse_error(const cJSON *o, int *code_p, const char **msg_p);

#endif /* RINGD_ETCD_INT_H */
