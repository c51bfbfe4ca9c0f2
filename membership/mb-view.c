/*
 * mb-view.c - node records and views: JSON in and out, and the rule that
 * computes the next view from the last one and the live nodes.
 */
#include "membership/mb-int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <zstd.h>

#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

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
    free(v->opts);
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

/* addr as add_member_fields wrote it into m; an absent addr is empty
 * unless need_addr. */
static int parse_addr(const cJSON *o, int need_addr, mb_member_t *m)
{
    const cJSON *addr = cJSON_GetObjectItemCaseSensitive(o, "addr");
    if (addr != NULL ? !cJSON_IsString(addr) : need_addr)
        return ST_EPROTO;
    const char *s = addr != NULL ? addr->valuestring : "";
    size_t alen = strlen(s);
    uint8_t *buf = malloc(alen / 4 * 3 + 3);
    long n = buf ? etcd_b64_decode(s, alen, buf) : ST_ENOMEM;
    m->addr = buf;
    m->addr_len = n > 0 ? (size_t)n : 0;
    return n < 0 ? (int)n : 0;
}

/* Fill m (owned) from the fields add_member_fields wrote. */
static int parse_member_fields(const cJSON *o, const char *node,
                               int need_addr, mb_member_t *m,
                               const char **why_p)
{
    const cJSON *host = cJSON_GetObjectItemCaseSensitive(o, "host");
    long long slots, lease;
    memset(m, 0, sizeof(*m));
    *why_p = "not a JSON object with host, slots, lease";
    if (!cJSON_IsString(host) || node == NULL ||
        rd_json_int(cJSON_GetObjectItemCaseSensitive(o, "slots"), 0, 1e9,
                    &slots) != 0 ||
        rd_json_count(cJSON_GetObjectItemCaseSensitive(o, "lease"),
                      &lease) != 0)
        return ST_EPROTO;
    int rc = parse_addr(o, need_addr, m);
    m->node = strdup(node);
    m->host = strdup(host->valuestring);
    m->slots = (int)slots;
    m->lease = lease;
    if (rc == 0 && (m->node == NULL || m->host == NULL))
        rc = ST_ENOMEM;
    if (rc != 0) {
        *why_p = rc == ST_ENOMEM ? "out of memory" : "addr is not base64";
        mb__member_free(m);
    }
    return rc;
}

static int node_parse(const char *node, const char *json, size_t len,
                      int need_addr, mb_node_rec_t *rec, const char **why_p)
{
    cJSON *o = cJSON_ParseWithLength(json, len);
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(o, "pid");
    long long p = -1;
    int rc = ST_EPROTO;
    memset(rec, 0, sizeof(*rec));
    *why_p = "not a JSON object with host, slots, lease";
    if (cJSON_IsObject(o) &&
        (pid == NULL || rd_json_int(pid, 0, 1e10, &p) == 0))
        rc = parse_member_fields(o, node, need_addr, &rec->member, why_p);
    rec->pid = p;
    cJSON_Delete(o);
    return rc;
}

int mb_node_parse(const char *node, const char *json, size_t len,
                  mb_node_rec_t *rec, const char **why_p)
{
    return node_parse(node, json, len, 0, rec, why_p);
}

void mb_node_rec_free(mb_node_rec_t *rec)
{
    mb__member_free(&rec->member);
}

int mb__node_parse(const char *node, const char *json, size_t len,
                   mb_member_t *m)
{
    mb_node_rec_t rec;
    const char *why;
    int rc = node_parse(node, json, len, 1, &rec, &why);
    if (rc != 0)
        RD_ERROR("mb: bad node record for '%s' (%s): %.*s", node, why,
                 (int)(len < 200 ? len : 200), json);
    *m = rec.member;
    return rc;
}

/*
 * The view on the wire (membership/README.md, "The view"): a host table,
 * then one array per member [node, host index, lease in hex, slots]. The
 * lease is the incarnation, which tells a re-registered node (a joiner
 * that needs state) from the member it replaces; addresses stay in the
 * node records, read only for the peers a member connects to. About 40
 * bytes a member: a view of 1000 fits etcd's requests and watch events
 * many times over.
 */
static int host_index(cJSON *hosts, const char *host)
{
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, hosts) {
        if (strcmp(it->valuestring, host) == 0)
            return i;
        i++;
    }
    cJSON_AddItemToArray(hosts, cJSON_CreateString(host));
    return i;
}

static cJSON *member_tuple(const mb_member_t *m, int host)
{
    char lease[24];
    snprintf(lease, sizeof(lease), "%llx", (unsigned long long)m->lease);
    cJSON *t = cJSON_CreateArray();
    cJSON_AddItemToArray(t, cJSON_CreateString(m->node));
    cJSON_AddItemToArray(t, cJSON_CreateNumber(host));
    cJSON_AddItemToArray(t, cJSON_CreateString(lease));
    cJSON_AddItemToArray(t, cJSON_CreateNumber(m->slots));
    return t;
}

/*
 * The member table (hosts, members, joiners) of a view of more than a
 * few members goes out packed: in columns (every member's node, then
 * every host index, lease, slots: like with like, which zstd compresses
 * a third better than tuples), that JSON text compressed with zstd, in
 * base64, as the one field "packed" (membership/README.md, "The view").
 * A view change sends the view to every member, and etcd's cost per
 * watcher grows with the bytes (bench/README.md). A small table stays
 * plain, readable with etcdctl: zstd's frame and base64 win nothing
 * there.
 */
#define VIEW_PACK_MIN 512        /* bytes of members JSON to pack */
#define VIEW_PACK_LEVEL 3        /* 19: 15% smaller, 140x the CPU */
#define VIEW_UNPACKED_MAX (8u << 20) /* refused above: a zstd bomb */

static const char *const table_fields[] = {"hosts", "members", "joiners"};
/* The members' columns, in tuple order. */
static const char *const columns[] = {"node", "host", "lease", "slots"};
#define LEASE_DELTA_MAX 9007199254740992.0 /* 2^53: a JSON number */

static int parse_lease_hex(const cJSON *j, int64_t *out);

static char *table_pack(const char *text)
{
    size_t n = strlen(text), cap = ZSTD_compressBound(n);
    void *z = malloc(cap);
    char *b64 = NULL;
    if (z == NULL)
        return NULL;
    size_t zn = ZSTD_compress(z, cap, text, n, VIEW_PACK_LEVEL);
    if (ZSTD_isError(zn))
        RD_ERROR("mb: packing a view: %s", ZSTD_getErrorName(zn));
    else
        b64 = etcd_b64_dup(z, zn);
    free(z);
    return b64;
}

/*
 * The least lease of the members when every other is within 2^53 of it,
 * else -1. etcd grants consecutive lease ids, so a job's leases as
 * numbers above the least are short, and compress to about two thirds
 * of the 16 hex digits each (bench/README.md).
 */
static int64_t lease_base(const cJSON *members)
{
    int64_t lo = INT64_MAX, hi = 0, l;
    const cJSON *m;
    cJSON_ArrayForEach(m, members) {
        if (parse_lease_hex(cJSON_GetArrayItem(m, 2), &l) != 0)
            return -1;
        lo = l < lo ? l : lo;
        hi = l > hi ? l : hi;
    }
    return lo <= hi && (double)(hi - lo) <= LEASE_DELTA_MAX ? lo : -1;
}

/* A member's column c: a copy of its tuple's item, the lease as a
 * number above base when base >= 0. */
static cJSON *column_item(const cJSON *m, int c, int64_t base)
{
    int64_t l;
    if (c == 2 && base >= 0 &&
        parse_lease_hex(cJSON_GetArrayItem(m, 2), &l) == 0)
        return cJSON_CreateNumber((double)(l - base));
    return cJSON_Duplicate(cJSON_GetArrayItem(m, c), 1);
}

/* {"hosts", "lease0", "node": [...], "host", "lease", "slots",
 * "joiners"} of o's table as text (malloc'd), and the plain table's
 * length; NULL when out of memory. */
static char *columns_text(const cJSON *o, size_t *plain_len_p)
{
    cJSON *t = cJSON_CreateObject(), *col[4];
    const cJSON *members = cJSON_GetObjectItemCaseSensitive(o, "members");
    char *text = NULL;
    if (t == NULL)
        return NULL;
    cJSON_AddItemReferenceToObject(
        t, "hosts", cJSON_GetObjectItemCaseSensitive(o, "hosts"));
    int64_t base = lease_base(members);
    if (base >= 0) {
        char hex[24];
        snprintf(hex, sizeof(hex), "%llx", (unsigned long long)base);
        cJSON_AddStringToObject(t, "lease0", hex);
    }
    for (int c = 0; c < 4; c++)
        col[c] = cJSON_AddArrayToObject(t, columns[c]);
    const cJSON *m;
    cJSON_ArrayForEach(m, members) {
        for (int c = 0; c < 4; c++)
            cJSON_AddItemToArray(col[c], column_item(m, c, base));
    }
    cJSON_AddItemReferenceToObject(
        t, "joiners", cJSON_GetObjectItemCaseSensitive(o, "joiners"));
    char *plain = cJSON_PrintUnformatted(members);
    if (plain != NULL)
        text = cJSON_PrintUnformatted(t);
    if (text != NULL)
        *plain_len_p = strlen(plain); /* hosts and joiners come on top */
    free(plain);
    cJSON_Delete(t); /* references to o's hosts and joiners stay */
    return text;
}

/* Replaces the table fields of o by "packed" when that is shorter; a
 * view that cannot be packed goes out plain, as does a small one. */
static void view_pack(cJSON *o)
{
    size_t plain = 0;
    char *text = columns_text(o, &plain);
    char *b64 = text != NULL && plain >= VIEW_PACK_MIN
                    ? table_pack(text) : NULL;
    if (b64 != NULL && strlen(b64) < plain) {
        for (size_t i = 0; i < 3; i++)
            cJSON_DeleteItemFromObjectCaseSensitive(o, table_fields[i]);
        cJSON_AddStringToObject(o, "packed", b64);
    }
    free(b64);
    free(text);
}

/* The zstd frame in b64, decompressed to at most VIEW_UNPACKED_MAX
 * bytes: malloc'd text, its length in *len_p, or NULL. */
static char *table_unpack(const char *b64, size_t *len_p)
{
    size_t blen = strlen(b64);
    uint8_t *z = malloc(blen / 4 * 3 + 3);
    char *text = NULL;
    long zn = z != NULL ? etcd_b64_decode(b64, blen, z) : -1;
    unsigned long long n = zn > 0 ? ZSTD_getFrameContentSize(z, (size_t)zn)
                                  : ZSTD_CONTENTSIZE_ERROR;
    /* The frame states its size (ZSTD_compress writes it): a bound on
     * the allocation before a byte is decompressed. */
    if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN ||
        n == 0 || n > VIEW_UNPACKED_MAX)
        goto out;
    text = malloc((size_t)n);
    size_t got = text != NULL ? ZSTD_decompress(text, (size_t)n, z,
                                                (size_t)zn) : 0;
    if (text == NULL || ZSTD_isError(got) || got != n) {
        free(text);
        text = NULL;
        goto out;
    }
    *len_p = got;
out:
    free(z);
    return text;
}

/* A lease column's number back into the hex string of lease0 + it, in
 * place; a string stays (parse_tuple checks it). 0, or ST_EPROTO. */
static int lease_absolute(cJSON *lease, const cJSON *lease0)
{
    long long d;
    int64_t base;
    char hex[24];
    if (!cJSON_IsNumber(lease))
        return 0;
    if (parse_lease_hex(lease0, &base) != 0 ||
        rd_json_int(lease, 0, LEASE_DELTA_MAX, &d) != 0 ||
        d > INT64_MAX - base)
        return ST_EPROTO;
    snprintf(hex, sizeof(hex), "%llx", (unsigned long long)(base + d));
    char *v = strdup(hex);
    if (v == NULL)
        return ST_ENOMEM;
    lease->type = cJSON_String;
    lease->valuestring = v;
    return 0;
}

/* The columns of t back into tuples: a "members" array (owned), or NULL
 * unless all four are arrays of one length and every lease given as a
 * number has a lease0 to add it to. */
static cJSON *columns_members(cJSON *t)
{
    cJSON *col[4], *it;
    int n = -1;
    for (int c = 0; c < 4; c++) {
        col[c] = cJSON_GetObjectItemCaseSensitive(t, columns[c]);
        if (!cJSON_IsArray(col[c]) ||
            (n >= 0 && cJSON_GetArraySize(col[c]) != n))
            return NULL;
        n = cJSON_GetArraySize(col[c]);
    }
    const cJSON *lease0 = cJSON_GetObjectItemCaseSensitive(t, "lease0");
    cJSON_ArrayForEach(it, col[2]) {
        if (lease_absolute(it, lease0) != 0)
            return NULL;
    }
    cJSON *members = cJSON_CreateArray();
    for (int i = 0; members != NULL && i < n; i++) {
        cJSON *m = cJSON_CreateArray();
        if (m == NULL) {
            cJSON_Delete(members);
            return NULL;
        }
        for (int c = 0; c < 4; c++)
            cJSON_AddItemToArray(m, cJSON_DetachItemFromArray(col[c], 0));
        cJSON_AddItemToArray(members, m);
    }
    return members;
}

/* A packed view's table back into o as the plain parser reads it; o must
 * not also hold a plain one. */
static int view_unpack(cJSON *o, const char **why_p)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "packed");
    if (p == NULL)
        return 0;
    *why_p = "packed and plain member tables both";
    for (size_t i = 0; i < 3; i++)
        if (cJSON_GetObjectItemCaseSensitive(o, table_fields[i]) != NULL)
            return ST_EPROTO;
    *why_p = "packed is not base64 of a zstd frame of the member table";
    size_t len = 0;
    char *text = cJSON_IsString(p) ? table_unpack(p->valuestring, &len)
                                   : NULL;
    cJSON *t = text != NULL ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    cJSON *members = cJSON_IsObject(t) ? columns_members(t) : NULL;
    if (members == NULL) {
        if (cJSON_IsObject(t))
            *why_p = "packed member columns missing, of unequal lengths "
                     "or with a bad lease";
        cJSON_Delete(t);
        return ST_EPROTO;
    }
    cJSON_AddItemToObject(o, "members", members);
    for (size_t i = 0; i < 3; i += 2) {
        cJSON *f = cJSON_DetachItemFromObjectCaseSensitive(t,
                                                           table_fields[i]);
        if (f != NULL)
            cJSON_AddItemToObject(o, table_fields[i], f);
    }
    cJSON_Delete(t);
    return 0;
}

char *mb__view_json(const mb__view_t *v)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "generation", (double)v->generation);
    cJSON_AddNumberToObject(o, "step", (double)v->step);
    cJSON *hosts = cJSON_AddArrayToObject(o, "hosts");
    cJSON *arr = cJSON_AddArrayToObject(o, "members");
    cJSON *joiners = cJSON_AddArrayToObject(o, "joiners");
    /* Members of a host are adjacent: the last index is the usual hit. */
    int last = -1;
    for (size_t i = 0; i < v->n_members; i++) {
        const mb_member_t *m = &v->members[i];
        cJSON *lh = last >= 0 ? cJSON_GetArrayItem(hosts, last) : NULL;
        if (lh == NULL || strcmp(lh->valuestring, m->host) != 0)
            last = host_index(hosts, m->host);
        cJSON_AddItemToArray(arr, member_tuple(m, last));
        if (m->joiner)
            cJSON_AddItemToArray(joiners, cJSON_CreateNumber((double)i));
    }
    if (v->source_index >= 0)
        cJSON_AddNumberToObject(o, "source", v->source_index);
    if (v->opts != NULL)
        cJSON_AddRawToObject(o, "opts", v->opts);
    view_pack(o);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A lease as member_tuple wrote it: 1 to 16 lowercase hex digits. */
static int parse_lease_hex(const cJSON *j, int64_t *out)
{
    if (!cJSON_IsString(j))
        return ST_EPROTO;
    const char *s = j->valuestring;
    size_t n = strlen(s);
    if (n == 0 || n > 16 || strspn(s, "0123456789abcdef") != n)
        return ST_EPROTO;
    unsigned long long x = strtoull(s, NULL, 16);
    if (x > INT64_MAX)
        return ST_EPROTO;
    *out = (int64_t)x;
    return 0;
}

/* One [node, host index, lease, slots] into m (owned); no address. */
static int parse_tuple(const cJSON *t, const cJSON *hosts, mb_member_t *m,
                       const char **why_p)
{
    const cJSON *node = cJSON_GetArrayItem(t, 0);
    const cJSON *host;
    long long hi, slots;
    int64_t lease;
    memset(m, 0, sizeof(*m));
    *why_p = "a member that is not [node, host, lease, slots]";
    if (!cJSON_IsArray(t) || cJSON_GetArraySize(t) != 4 ||
        !cJSON_IsString(node) || node->valuestring[0] == '\0' ||
        rd_json_int(cJSON_GetArrayItem(t, 1), 0, 1e9, &hi) != 0 ||
        parse_lease_hex(cJSON_GetArrayItem(t, 2), &lease) != 0 ||
        rd_json_int(cJSON_GetArrayItem(t, 3), 0, 1e9, &slots) != 0)
        return ST_EPROTO;
    host = cJSON_GetArrayItem(hosts, (int)hi);
    *why_p = "a member's host index outside the host table";
    if (!cJSON_IsString(host))
        return ST_EPROTO;
    m->node = strdup(node->valuestring);
    m->host = strdup(host->valuestring);
    m->addr = malloc(1);
    m->slots = (int)slots;
    m->lease = lease;
    *why_p = "out of memory";
    if (m->node == NULL || m->host == NULL || m->addr == NULL) {
        mb__member_free(m);
        return ST_ENOMEM;
    }
    return 0;
}

/* An index into the members, as the joiners and the source name them. */
static int member_index(const cJSON *j, const mb__view_t *v)
{
    long long i;
    if (rd_json_int(j, 0, 1e9, &i) != 0 || (size_t)i >= v->n_members)
        return -1;
    return (int)i;
}

/* members and joiners of the view object into v. */
static int parse_view_members(const cJSON *arr, const cJSON *hosts,
                              const cJSON *joiners, mb__view_t *v,
                              const char **why_p)
{
    size_t n = (size_t)cJSON_GetArraySize(arr);
    v->members = calloc(n ? n : 1, sizeof(*v->members));
    if (v->members == NULL) {
        *why_p = "out of memory";
        return ST_ENOMEM;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        mb_member_t *m = &v->members[v->n_members];
        int rc = parse_tuple(it, hosts, m, why_p);
        if (rc != 0)
            return rc;
        v->n_members++;
    }
    cJSON_ArrayForEach(it, joiners) {
        int i = member_index(it, v);
        *why_p = "a joiner that is not a member";
        if (i < 0)
            return ST_EPROTO;
        /* An index listed twice is one joiner: n_joiners counts members. */
        v->n_joiners += !v->members[i].joiner;
        v->members[i].joiner = 1;
    }
    return 0;
}

/*
 * The job's options, as an object of at most MB_OPTS_MAX bytes kept as
 * its compact text: membership carries them from view to view and leaves
 * their meaning to the job. *opts_p NULL when j is NULL.
 */
int mb__opts_text(const cJSON *j, char **opts_p, const char **why_p)
{
    *opts_p = NULL;
    if (j == NULL)
        return 0;
    *why_p = "opts is not an object";
    if (!cJSON_IsObject(j))
        return ST_EPROTO;
    char *t = cJSON_PrintUnformatted(j);
    *why_p = t == NULL ? "out of memory" : "opts is too large";
    if (t == NULL || strlen(t) > MB_OPTS_MAX) {
        free(t);
        return t == NULL ? ST_ENOMEM : ST_EPROTO;
    }
    *opts_p = t;
    return 0;
}

int mb__view_set_opts(mb__view_t *v, const char *opts)
{
    free(v->opts);
    v->opts = opts != NULL ? strdup(opts) : NULL;
    return opts != NULL && v->opts == NULL ? ST_ENOMEM : 0;
}

static int parse_view_obj(const cJSON *o, mb__view_t *v, const char **why_p)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(o, "members");
    const cJSON *hosts = cJSON_GetObjectItemCaseSensitive(o, "hosts");
    const cJSON *joiners = cJSON_GetObjectItemCaseSensitive(o, "joiners");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(o, "source");
    const cJSON *it;
    long long gen, step;
    *why_p = "generation or step missing or not a count";
    if (rd_json_int(cJSON_GetObjectItemCaseSensitive(o, "generation"), 1,
                    9007199254740992.0, &gen) != 0 ||
        rd_json_int(cJSON_GetObjectItemCaseSensitive(o, "step"), 0,
                    9007199254740992.0, &step) != 0)
        return ST_EPROTO;
    *why_p = "members, hosts, joiners or source of the wrong type";
    if (!cJSON_IsArray(arr) || !cJSON_IsArray(hosts) ||
        !cJSON_IsArray(joiners) || (src && !cJSON_IsNumber(src)))
        return ST_EPROTO;
    cJSON_ArrayForEach(it, hosts) {
        if (!cJSON_IsString(it))
            return ST_EPROTO;
    }
    v->generation = (uint64_t)gen;
    v->step = (uint64_t)step;
    int rc = parse_view_members(arr, hosts, joiners, v, why_p);
    if (rc != 0)
        return rc;
    v->source_index = src ? member_index(src, v) : -1;
    *why_p = "a source that is not a member";
    if (src && v->source_index < 0)
        return ST_EPROTO;
    return mb__opts_text(cJSON_GetObjectItemCaseSensitive(o, "opts"),
                         &v->opts, why_p);
}

static int view_parse(const char *json, size_t len, mb__view_t *v,
                      const char **why_p)
{
    memset(v, 0, sizeof(*v));
    v->source_index = -1;
    cJSON *o = cJSON_ParseWithLength(json, len);
    *why_p = "not a JSON object";
    int rc = cJSON_IsObject(o) ? view_unpack(o, why_p) : ST_EPROTO;
    if (rc == 0)
        rc = parse_view_obj(o, v, why_p);
    cJSON_Delete(o);
    if (rc != 0)
        mb__view_free(v);
    return rc;
}

int mb__view_parse(const char *json, size_t len, mb__view_t *v)
{
    const char *why;
    int rc = view_parse(json, len, v, &why);
    if (rc != 0)
        RD_ERROR("mb: bad view (%s): %.*s", why,
                 (int)(len < 300 ? len : 300), json);
    return rc;
}

/* The public owned view is the internal one's members under the public
 * type; the allocation is one mb_view_t. */
static int view_publish(mb__view_t *v, int my_index, mb_view_t **view_p)
{
    mb_view_t *pub = calloc(1, sizeof(*pub));
    if (pub == NULL) {
        mb__view_free(v);
        return ST_ENOMEM;
    }
    pub->generation = v->generation;
    pub->step = v->step;
    pub->members = v->members;
    pub->n_members = v->n_members;
    pub->my_index = my_index;
    pub->source_index = v->source_index;
    pub->n_joiners = v->n_joiners;
    pub->opts = v->opts;
    *view_p = pub;
    return 0;
}

int mb_view_parse(const char *json, size_t len, mb_view_t **view_p,
                  const char **why_p)
{
    mb__view_t v;
    int rc = view_parse(json, len, &v, why_p);
    if (rc == 0 && (rc = view_publish(&v, -1, view_p)) != 0)
        *why_p = "out of memory";
    return rc;
}

int mb_view_dup(const mb_view_t *view, mb_view_t **copy_p)
{
    mb__view_t v = {view->generation, view->step, NULL, 0,
                    view->source_index, view->n_joiners, NULL};
    v.members = calloc(view->n_members ? view->n_members : 1,
                       sizeof(*v.members));
    if (v.members == NULL || mb__view_set_opts(&v, view->opts) != 0) {
        free(v.members);
        return ST_ENOMEM;
    }
    for (; v.n_members < view->n_members; v.n_members++) {
        if (mb__member_copy(&v.members[v.n_members],
                            &view->members[v.n_members]) != 0) {
            mb__view_free(&v);
            return ST_ENOMEM;
        }
    }
    return view_publish(&v, view->my_index, copy_p);
}

void mb_view_free(mb_view_t *view)
{
    if (view == NULL)
        return;
    mb__view_t v = {0, 0, (mb_member_t *)view->members, view->n_members,
                    -1, 0, (char *)view->opts};
    mb__view_free(&v);
    free(view);
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
