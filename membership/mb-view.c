/*
 * mb-view.c - node records and views: JSON in and out, and the rule that
 * computes the next view from the last one and the live nodes.
 */
#include "membership/mb-int.h"

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

/* The largest integer every double holds exactly. */
#define JSON_MAX_EXACT 9007199254740992.0

void mb__member_free(mb_member_t *m)
{
    free((char *)m->node);
    free((char *)m->host);
    free((uint8_t *)m->addr);
    memset(m, 0, sizeof(*m));
}

int mb__member_copy(mb_member_t *dst, const mb_member_t *src)
{
    *dst = *src;
    dst->node = strdup(src->node);
    dst->host = strdup(src->host);
    uint8_t *a = malloc(src->addr_len ? src->addr_len : 1);
    if (a != NULL && src->addr_len > 0)
        memcpy(a, src->addr, src->addr_len);
    dst->addr = a;
    if (dst->node == NULL || dst->host == NULL || a == NULL) {
        mb__member_free(dst);
        return ST_ENOMEM;
    }
    return 0;
}

void mb__view_free(mb__view_t *v)
{
    for (size_t i = 0; i < v->n_members; i++)
        mb__member_free(&v->members[i]);
    free(v->members);
    memset(v, 0, sizeof(*v));
    v->source_index = -1;
}

static void add_member_fields(cJSON *o, const mb_member_t *m)
{
    char *b64 = etcd_b64_dup(m->addr, m->addr_len);
    char lease[32];
    snprintf(lease, sizeof(lease), "%lld", (long long)m->lease);
    cJSON_AddStringToObject(o, "host", m->host);
    cJSON_AddStringToObject(o, "addr", b64 ? b64 : "");
    cJSON_AddStringToObject(o, "lease", lease);
    cJSON_AddNumberToObject(o, "slots", m->slots);
    free(b64);
}

char *mb__node_json(const mb_member_t *m, int pid)
{
    cJSON *o = cJSON_CreateObject();
    add_member_fields(o, m);
    cJSON_AddNumberToObject(o, "pid", pid);
    cJSON_AddNumberToObject(o, "version", 1);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* Fill m (owned) from the fields add_member_fields wrote. */
static int parse_member_fields(const cJSON *o, const char *node,
                               mb_member_t *m)
{
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(o, "host");
    const cJSON *addr = cJSON_GetObjectItemCaseSensitive(o, "addr");
    const cJSON *slots = cJSON_GetObjectItemCaseSensitive(o, "slots");
    memset(m, 0, sizeof(*m));
    if (!cJSON_IsString(host) || !cJSON_IsString(addr) ||
        !cJSON_IsNumber(slots) || node == NULL)
        return ST_EPROTO;
    if (rd_json_i64(o, "lease", &m->lease) != 0)
        return ST_EPROTO;
    size_t alen = strlen(addr->valuestring);
    uint8_t *buf = malloc(alen / 4 * 3 + 3);
    long n = buf ? etcd_b64_decode(addr->valuestring, alen, buf) : ST_ENOMEM;
    m->node = strdup(node);
    m->host = strdup(host->valuestring);
    m->addr = buf;
    m->addr_len = n > 0 ? (size_t)n : 0;
    m->slots = slots->valueint;
    if (n < 0 || m->node == NULL || m->host == NULL) {
        mb__member_free(m);
        return n < 0 ? (int)n : ST_ENOMEM;
    }
    return 0;
}

int mb__node_parse(const char *node, const char *json, size_t len,
                   mb_member_t *m)
{
    cJSON *o = cJSON_ParseWithLength(json, len);
    int rc = cJSON_IsObject(o) ? parse_member_fields(o, node, m)
                               : ST_EPROTO;
    cJSON_Delete(o);
    if (rc != 0)
        RD_ERROR("mb: bad node record for '%s': %.*s", node,
                 (int)(len < 200 ? len : 200), json);
    return rc;
}

char *mb__view_json(const mb__view_t *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "generation", (double)v->generation);
    cJSON_AddNumberToObject(o, "step", (double)v->step);
    cJSON *arr = cJSON_AddArrayToObject(o, "members");
    cJSON *joiners = cJSON_AddArrayToObject(o, "joiners");
    for (size_t i = 0; i < v->n_members; i++) {
        const mb_member_t *m = &v->members[i];
        cJSON *mo = cJSON_CreateObject();
        cJSON_AddStringToObject(mo, "node", m->node);
        add_member_fields(mo, m);
        cJSON_AddItemToArray(arr, mo);
        if (m->joiner)
            cJSON_AddItemToArray(joiners, cJSON_CreateString(m->node));
    }
    if (v->source_index >= 0)
        cJSON_AddStringToObject(o, "source",
                                v->members[v->source_index].node);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

static int find_node(const mb__view_t *v, const char *node)
{
    for (size_t i = 0; i < v->n_members; i++)
        if (strcmp(v->members[i].node, node) == 0)
            return (int)i;
    return -1;
}

static int parse_view_obj(const cJSON *o, mb__view_t *v)
{
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(o, "generation");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "members");
    const cJSON *joiners = cJSON_GetObjectItemCaseSensitive(o, "joiners");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
    long long g, st;
    /* Checked as integers first: converting a negative, huge or NaN
     * double to uint64_t is undefined. */
    if (rd_json_int(gen, 1, JSON_MAX_EXACT, &g) != 0 ||
        rd_json_int(step, 0, JSON_MAX_EXACT, &st) != 0 ||
        !cJSON_IsArray(arr) || !cJSON_IsArray(joiners) ||
        (src && !cJSON_IsString(src)))
        return ST_EPROTO;
    v->generation = (uint64_t)g;
    v->step = (uint64_t)st;
    size_t n = (size_t)cJSON_GetArraySize(arr);
    v->members = calloc(n ? n : 1, sizeof(*v->members));
    if (v->members == NULL)
        return ST_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *node = cJSON_GetObjectItemCaseSensitive(it, "node");
        int rc = cJSON_IsObject(it) && cJSON_IsString(node)
                     ? parse_member_fields(it, node->valuestring,
                                           &v->members[v->n_members])
                     : ST_EPROTO;
        if (rc != 0)
            return rc;
        v->n_members++;
    }
    cJSON_ArrayForEach(it, joiners) {
        int i = cJSON_IsString(it) ? find_node(v, it->valuestring) : -1;
        if (i < 0)
            return ST_EPROTO;
        /* A name listed twice is one joiner: n_joiners counts members. */
        v->n_joiners += !v->members[i].joiner;
        v->members[i].joiner = 1;
    }
    v->source_index = src ? find_node(v, src->valuestring) : -1;
    if (src && v->source_index < 0)
        return ST_EPROTO;
    return 0;
}

int mb__view_parse(const char *json, size_t len, mb__view_t *v)
{
    memset(v, 0, sizeof(*v));
    v->source_index = -1;
    cJSON *o = cJSON_ParseWithLength(json, len);
    int rc = cJSON_IsObject(o) ? parse_view_obj(o, v) : ST_EPROTO;
    cJSON_Delete(o);
    if (rc != 0) {
        RD_ERROR("mb: bad view: %.*s", (int)(len < 300 ? len : 300), json);
        mb__view_free(v);
    }
    return rc;
}

static int same_incarnation(const mb_member_t *a, const mb_member_t *b)
{
    return a->lease == b->lease && strcmp(a->node, b->node) == 0;
}

static int in_list(const mb_member_t *list, size_t n, const mb_member_t *m)
{
    for (size_t i = 0; i < n; i++)
        if (same_incarnation(&list[i], m))
            return 1;
    return 0;
}

static int cmp_host_node(const void *a, const void *b)
{
    const mb_member_t *x = *(const mb_member_t *const *)a;
    const mb_member_t *y = *(const mb_member_t *const *)b;
    int c = strcmp(x->host, y->host);
    return c != 0 ? c : strcmp(x->node, y->node);
}

/* Insert m after the last member on the same host, else at the end. */
static int insert_by_host(mb__view_t *v, const mb_member_t *m)
{
    size_t pos = v->n_members;
    for (size_t i = 0; i < v->n_members; i++)
        if (strcmp(v->members[i].host, m->host) == 0)
            pos = i + 1;
    memmove(&v->members[pos + 1], &v->members[pos],
            (v->n_members - pos) * sizeof(*m));
    v->n_members++;
    return mb__member_copy(&v->members[pos], m);
}

int mb__view_next(const mb__view_t *old, const mb_member_t *alive,
                  size_t n_alive, uint64_t step, mb__view_t *next)
{
    mb__view_t v = {.generation = old->generation + 1, .step = step,
                    .source_index = -1};
    const mb_member_t **fresh = calloc(n_alive + 1, sizeof(*fresh));
    v.members = calloc(n_alive + 1, sizeof(*v.members));
    size_t n_fresh = 0;
    int rc = ST_ENOMEM;
    if (fresh == NULL || v.members == NULL)
        goto err;
    for (size_t i = 0; i < old->n_members; i++) {
        if (!in_list(alive, n_alive, &old->members[i]))
            continue;
        if (mb__member_copy(&v.members[v.n_members], &old->members[i]))
            goto err;
        v.members[v.n_members++].joiner = 0;
    }
    size_t kept = v.n_members;
    for (size_t i = 0; i < n_alive; i++)
        if (!in_list(old->members, old->n_members, &alive[i]))
            fresh[n_fresh++] = &alive[i];
    if (kept == old->n_members && n_fresh == 0) {
        rc = 0; /* nothing changed */
        goto err;
    }
    qsort(fresh, n_fresh, sizeof(*fresh), cmp_host_node);
    for (size_t i = 0; i < n_fresh; i++) {
        if (insert_by_host(&v, fresh[i]) != 0)
            goto err;
    }
    /* Joiners need state only when someone has it to give. */
    for (size_t i = 0; i < v.n_members; i++) {
        int is_new = !in_list(old->members, old->n_members, &v.members[i]);
        v.members[i].joiner = is_new && kept > 0;
        v.n_joiners += (size_t)v.members[i].joiner;
        if (!is_new && v.source_index < 0)
            v.source_index = (int)i;
    }
    free(fresh);
    *next = v;
    return 1;

err:
    free(fresh);
    mb__view_free(&v);
    return rc;
}

int mb__view_renew(const mb__view_t *old, uint64_t step, mb__view_t *next)
{
    if (old->n_members == 0)
        return 0;
    mb__view_t v = {.generation = old->generation + 1, .step = step,
                    .source_index = 0};
    v.members = calloc(old->n_members, sizeof(*v.members));
    if (v.members == NULL)
        return ST_ENOMEM;
    for (size_t i = 0; i < old->n_members; i++) {
        if (mb__member_copy(&v.members[i], &old->members[i]) != 0) {
            mb__view_free(&v);
            return ST_ENOMEM;
        }
        v.members[i].joiner = 0;
        v.n_members++;
    }
    *next = v;
    return 1;
}
