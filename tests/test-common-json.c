/*
 * test-common-json.c - the shared JSON field helpers against hostile
 * values: every reader refuses what is not exactly its type and range.
 */
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/json.h"
#include "common/status.h"
#include "tests/task.h"

static cJSON *parse(const char *text)
{
    cJSON *o = cJSON_Parse(text);
    ASSERT(o != NULL);
    return o;
}

TEST_IMPL(common_json_fields)
{
    cJSON *o = parse("{\"s\":\"18446744073709551615\",\"neg\":\"-1\","
                     "\"empty\":\"\",\"junk\":\"12x\",\"num\":7,"
                     "\"frac\":2.5,\"big\":5e9,\"lease\":\"-3\","
                     "\"i\":\"-42\"}");
    uint64_t u = 99;
    ASSERT_OK(rd_json_u64(o, "s", &u));
    ASSERT_EQ(u, UINT64_MAX);
    u = 99;
    ASSERT_EQ(rd_json_u64(o, "neg", &u), ST_EPROTO);
    ASSERT_EQ(rd_json_u64(o, "empty", &u), ST_EPROTO);
    ASSERT_EQ(rd_json_u64(o, "junk", &u), ST_EPROTO);
    ASSERT_EQ(rd_json_u64(o, "num", &u), ST_EPROTO); /* not a string */
    ASSERT_EQ(rd_json_u64(o, "missing", &u), ST_EPROTO);
    ASSERT_EQ(u, 99); /* untouched on failure */

    uint32_t v = 5;
    ASSERT_OK(rd_json_u32(o, "num", 7, &v));
    ASSERT_EQ(v, 7);
    ASSERT_EQ(rd_json_u32(o, "num", 6, &v), ST_EPROTO);
    ASSERT_EQ(rd_json_u32(o, "frac", 10, &v), ST_EPROTO);
    ASSERT_EQ(rd_json_u32(o, "big", UINT32_MAX, &v), ST_EPROTO);
    ASSERT_EQ(rd_json_u32(o, "s", UINT32_MAX, &v), ST_EPROTO);

    /* etcd leaves default fields out: missing is 0, not an error. */
    int64_t i = 1;
    ASSERT_OK(rd_json_i64(o, "missing", &i));
    ASSERT_EQ(i, 0);
    ASSERT_OK(rd_json_i64(o, "i", &i));
    ASSERT_EQ(i, -42);
    ASSERT_EQ(rd_json_i64(o, "junk", &i), ST_EPROTO);

    long long c = 0;
    ASSERT_OK(rd_json_count(cJSON_GetObjectItem(o, "num"), &c));
    ASSERT_EQ(c, 7);
    ASSERT_EQ(rd_json_count(cJSON_GetObjectItem(o, "lease"), &c),
              ST_EPROTO);
    ASSERT_EQ(rd_json_count(cJSON_GetObjectItem(o, "frac"), &c),
              ST_EPROTO);
    ASSERT_EQ(rd_json_count(NULL, &c), ST_EPROTO);

    cJSON *w = cJSON_CreateObject();
    ASSERT_OK(rd_json_add_u64(w, "x", UINT64_MAX));
    ASSERT_OK(rd_json_u64(w, "x", &u));
    ASSERT_EQ(u, UINT64_MAX);
    cJSON_Delete(w);
    cJSON_Delete(o);
    return 0;
}
