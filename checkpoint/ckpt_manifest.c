/*
 * ckpt_manifest.c - the manifest of a complete checkpoint, as JSON.
 *
 * It is read back from etcd and from disk, so parsing treats it as hostile:
 * every field is type-checked, 64-bit numbers travel as decimal strings
 * (JSON numbers lose precision above 2^53), and the shards must tile the
 * state exactly, in order.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint/ckpt.h"
#include "common/json.h"
#include "common/log.h"
#include "common/status.h"

#define MAX_SHARDS 65536

ckpt_manifest_t *ckpt_manifest_new(uint32_t nshards)
{
    if (nshards == 0 || nshards > MAX_SHARDS)
        return NULL;
    ckpt_manifest_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->nshards = nshards;
    m->members = calloc(nshards, sizeof(char *));
    m->shards = calloc(nshards, sizeof(ckpt_manifest_shard_t));
    if (m->members == NULL || m->shards == NULL) {
        ckpt_manifest_free(m);
        return NULL;
    }
    return m;
}

void ckpt_manifest_free(ckpt_manifest_t *m)
{
    if (m == NULL)
        return;
    for (uint32_t i = 0; m->members && i < m->nshards; i++)
        free(m->members[i]);
    free(m->members);
    free(m->shards);
    free(m);
}

int ckpt_manifest_to_json(const ckpt_manifest_t *m, char **json_p)
{
    int rc = ST_ENOMEM;
    cJSON *root = cJSON_CreateObject(), *sh = NULL;
    if (root == NULL)
        return rc;
    if (cJSON_AddNumberToObject(root, "version", CKPT_FORMAT_VERSION) ==
            NULL ||
        rd_json_add_u64(root, "step", m->step) ||
        rd_json_add_u64(root, "generation", m->generation) ||
        rd_json_add_u64(root, "total_size", m->total_size) ||
        cJSON_AddNumberToObject(root, "elem_size", m->elem_size) == NULL ||
        (sh = cJSON_AddArrayToObject(root, "shards")) == NULL)
        goto out;
    for (uint32_t i = 0; i < m->nshards; i++) {
        const ckpt_manifest_shard_t *s = &m->shards[i];
        cJSON *o = cJSON_CreateObject();
        if (o == NULL)
            goto out;
        cJSON_AddItemToArray(sh, o);
        if (rd_json_add_u64(o, "offset", s->offset) ||
            rd_json_add_u64(o, "size", s->size) ||
            rd_json_add_u64(o, "xxh64", s->raw_xxh64) ||
            rd_json_add_u64(o, "base_step", s->base_step) ||
            cJSON_AddNumberToObject(o, "owner", s->owner) == NULL ||
            cJSON_AddNumberToObject(o, "replica", s->replica) == NULL ||
            cJSON_AddNumberToObject(o, "flags", s->flags) == NULL ||
            cJSON_AddStringToObject(o, "member",
                                    m->members[i] ? m->members[i] : "") ==
                NULL)
            goto out;
    }
    *json_p = cJSON_PrintUnformatted(root);
    rc = *json_p ? 0 : ST_ENOMEM;
out:
    cJSON_Delete(root);
    return rc;
}

static int parse_shards(const cJSON *arr, ckpt_manifest_t *m)
{
    uint64_t expect = 0;
    for (uint32_t i = 0; i < m->nshards; i++) {
        const cJSON *o = cJSON_GetArrayItem(arr, (int)i);
        ckpt_manifest_shard_t *s = &m->shards[i];
        const cJSON *mem = cJSON_GetObjectItemCaseSensitive(o, "member");
        if (!cJSON_IsObject(o) || rd_json_u64(o, "offset", &s->offset) ||
            rd_json_u64(o, "size", &s->size) ||
            rd_json_u64(o, "xxh64", &s->raw_xxh64) ||
            rd_json_u64(o, "base_step", &s->base_step) ||
            rd_json_u32(o, "owner", m->nshards - 1, &s->owner) ||
            rd_json_u32(o, "replica", m->nshards - 1, &s->replica) ||
            rd_json_u32(o, "flags", CKPT_F_ALL, &s->flags) ||
            !cJSON_IsString(mem))
            return ST_EPROTO;
        if (s->offset != expect || s->size > m->total_size - s->offset)
            return ST_EPROTO; /* shards must tile the state in order */
        expect = s->offset + s->size;
        m->members[i] = strdup(mem->valuestring);
        if (m->members[i] == NULL)
            return ST_ENOMEM;
    }
    return expect == m->total_size ? 0 : ST_EPROTO;
}

int ckpt_manifest_from_json(const char *json, size_t len,
                            ckpt_manifest_t **m_p)
{
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (root == NULL) {
        RD_WARN("checkpoint: manifest is not valid JSON");
        return ST_EPROTO;
    }
    int rc = ST_EPROTO;
    ckpt_manifest_t *m = NULL;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "shards");
    uint32_t version = 0, elem = 0;
    uint64_t step, gen, total;
    if (rd_json_u32(root, "version", 1000, &version) ||
        version != CKPT_FORMAT_VERSION || rd_json_u64(root, "step", &step) ||
        rd_json_u64(root, "generation", &gen) ||
        rd_json_u64(root, "total_size", &total) ||
        rd_json_u32(root, "elem_size", 8, &elem) || !cJSON_IsArray(arr))
        goto out;
    int n = cJSON_GetArraySize(arr);
    m = ckpt_manifest_new(n > 0 ? (uint32_t)n : 0);
    if (m == NULL)
        goto out;
    m->step = step;
    m->generation = gen;
    m->total_size = total;
    m->elem_size = elem;
    rc = parse_shards(arr, m);
out:
    cJSON_Delete(root);
    if (rc != 0) {
        RD_WARN("checkpoint: manifest rejected (%s)", st_strerror(rc));
        ckpt_manifest_free(m);
        return rc;
    }
    *m_p = m;
    return 0;
}
