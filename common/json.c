/*
 * json.c - shared JSON field helpers (see json.h).
 */
#include "common/json.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/status.h"

#define JSON_EXACT_MAX 9007199254740992.0 /* 2^53 */

int rd_json_i64(const cJSON *obj, const char *name, int64_t *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    *out = 0;
    if (f == NULL)
        return 0;
    if (cJSON_IsNumber(f)) {
        /* Converting a double outside int64 (or NaN) is undefined. */
        if (!(f->valuedouble >= -9223372036854775808.0 &&
              f->valuedouble < 9223372036854775808.0))
            return ST_EPROTO;
        *out = (int64_t)f->valuedouble;
        return 0;
    }
    if (!cJSON_IsString(f) || f->valuestring[0] == '\0')
        return ST_EPROTO;
    char *end;
    errno = 0;
    long long v = strtoll(f->valuestring, &end, 10);
    if (errno != 0 || *end != '\0')
        return ST_EPROTO;
    *out = v;
    return 0;
}

int rd_json_u64(const cJSON *obj, const char *name, uint64_t *out)
{
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!cJSON_IsString(f) || f->valuestring[0] < '0' ||
        f->valuestring[0] > '9')
        return ST_EPROTO;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(f->valuestring, &end, 10);
    if (errno != 0 || *end != '\0')
        return ST_EPROTO;
    *out = v;
    return 0;
}

int rd_json_u32(const cJSON *obj, const char *name, uint32_t max,
                uint32_t *out)
{
    long long v;
    int rc = rd_json_int(cJSON_GetObjectItemCaseSensitive(obj, name), 0,
                         (double)max, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

int rd_json_int(const cJSON *j, double lo, double hi, long long *out)
{
    if (!cJSON_IsNumber(j) || !(j->valuedouble >= lo) ||
        !(j->valuedouble <= hi) ||
        j->valuedouble != (double)(long long)j->valuedouble)
        return ST_EPROTO;
    *out = (long long)j->valuedouble;
    return 0;
}

int rd_json_count(const cJSON *j, long long *out)
{
    if (cJSON_IsNumber(j))
        return rd_json_int(j, 0, JSON_EXACT_MAX, out);
    if (!cJSON_IsString(j) || j->valuestring[0] == '\0')
        return ST_EPROTO;
    char *end;
    errno = 0;
    long long v = strtoll(j->valuestring, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0)
        return ST_EPROTO;
    *out = v;
    return 0;
}

int rd_json_add_u64(cJSON *obj, const char *name, uint64_t v)
{
    char buf[24];
    snprintf(buf, sizeof(buf), "%" PRIu64, v);
    return cJSON_AddStringToObject(obj, name, buf) ? 0 : ST_ENOMEM;
}
