/*
 * test-mb-keys.c - the etcd key schema (mb_key) and the read-only parsers
 * of node records and views (mb_node_parse, mb_view_parse, mb_view_dup).
 */
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "membership/mb.h"
#include "tests/task.h"

static const char *key(mb_key_t which, const char *node, uint64_t step,
                       uint32_t rank)
{
    static char buf[MB_KEY_MAX];
    ASSERT_OK(mb_key(buf, sizeof(buf), "J", which, node, step, rank));
    return buf;
}

TEST_IMPL(mb_key_paths)
{
    ASSERT_STR_EQ(key(MB_KEY_JOB, NULL, 0, 0), "/ringd/J/");
    ASSERT_STR_EQ(key(MB_KEY_NODES, NULL, 0, 0), "/ringd/J/nodes/");
    ASSERT_STR_EQ(key(MB_KEY_NODE, "n1", 0, 0), "/ringd/J/nodes/n1");
    ASSERT_STR_EQ(key(MB_KEY_LEADER, NULL, 0, 0), "/ringd/J/leader");
    ASSERT_STR_EQ(key(MB_KEY_VIEW, NULL, 0, 0), "/ringd/J/view");
    ASSERT_STR_EQ(key(MB_KEY_DRAIN, "n1", 0, 0), "/ringd/J/drain/n1");
    ASSERT_STR_EQ(key(MB_KEY_SUSPECTS, NULL, 0, 0), "/ringd/J/suspect/");
    ASSERT_STR_EQ(key(MB_KEY_SUSPECT, "n2", 0, 0), "/ringd/J/suspect/n2/");
    ASSERT_STR_EQ(key(MB_KEY_RESHAPES, NULL, 0, 0), "/ringd/J/reshape/");
    ASSERT_STR_EQ(key(MB_KEY_RESHAPE, "n2", 0, 0), "/ringd/J/reshape/n2");
    ASSERT_STR_EQ(key(MB_KEY_CKPT_ALL, NULL, 0, 0), "/ringd/J/ckpt");
    ASSERT_STR_EQ(key(MB_KEY_CKPTS, NULL, 0, 0), "/ringd/J/ckpt/");
    ASSERT_STR_EQ(key(MB_KEY_CKPT, NULL, 150, 0), "/ringd/J/ckpt/150");
    ASSERT_STR_EQ(key(MB_KEY_CKPT_PARTS, NULL, 0, 0),
                  "/ringd/J/ckpt-parts/");
    /* Zero-padded, so etcd's byte order is numeric order. */
    ASSERT_STR_EQ(key(MB_KEY_CKPT_STEP_PARTS, NULL, 150, 0),
                  "/ringd/J/ckpt-parts/00000000000000000150/");
    ASSERT_STR_EQ(key(MB_KEY_CKPT_PART, NULL, 150, 3),
                  "/ringd/J/ckpt-parts/00000000000000000150/00003");
    ASSERT_STR_EQ(key(MB_KEY_HOPS, NULL, 0, 0), "/ringd/J/hop/");
    ASSERT_STR_EQ(key(MB_KEY_HOP, "n2", 0, 0), "/ringd/J/hop/n2");
    /* Too small a buffer: refused, and no half key left behind. */
    char small[12] = "x";
    ASSERT_EQ(mb_key(small, sizeof(small), "J", MB_KEY_NODE, "n1", 0, 0),
              ST_EINVAL);
    ASSERT_STR_EQ(small, "");
    return 0;
}

static const char view_json[] =
    "{\"generation\":3,\"step\":120,\"hosts\":[\"h\",\"g\"],"
    "\"members\":[[\"a\",0,\"11\",2],[\"b\",1,\"9\",1]],"
    "\"joiners\":[1],\"source\":0}";

TEST_IMPL(mb_read_records)
{
    mb_view_t *v = NULL, *copy = NULL;
    const char *why = NULL;
    ASSERT_OK(mb_view_parse(view_json, strlen(view_json), &v, &why));
    ASSERT_EQ(v->generation, 3);
    ASSERT_EQ(v->step, 120);
    ASSERT_EQ(v->n_members, 2);
    ASSERT_EQ(v->my_index, -1);
    ASSERT_EQ(v->source_index, 0);
    ASSERT_EQ(v->n_joiners, 1);
    ASSERT(!v->members[0].joiner && v->members[1].joiner);
    /* Addresses live in the node records, not in the view. */
    ASSERT_EQ(v->members[0].addr_len, 0);
    ASSERT_EQ(v->members[0].lease, 17); /* hex */
    ASSERT_EQ(v->members[1].lease, 9);
    ASSERT_STR_EQ(v->members[1].host, "g");
    ASSERT_OK(mb_view_dup(v, &copy));
    mb_view_free(v);
    ASSERT_STR_EQ(copy->members[1].node, "b"); /* a deep copy */
    ASSERT_EQ(copy->members[0].slots, 2);
    mb_view_free(copy);
    mb_view_free(NULL);

    /* What membership never writes is refused, with a reason. */
    const char *bad[] = {
        "[]", "{\"generation\":0,\"step\":0,\"members\":[],\"joiners\":[]}",
        "{\"generation\":1.5,\"step\":0,\"members\":[],\"joiners\":[]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[],\"members\":[],"
        "\"joiners\":[0]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[],\"members\":[],"
        "\"joiners\":[],\"source\":0}",
        /* the format before compact views: objects with addresses */
        "{\"generation\":1,\"step\":0,\"members\":[{\"node\":\"a\","
        "\"host\":\"h\",\"addr\":\"AQID\",\"lease\":\"17\",\"slots\":2}],"
        "\"joiners\":[]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[\"h\"],"
        "\"members\":[[\"a\",1,\"11\",2]],\"joiners\":[]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[\"h\"],"
        "\"members\":[[\"a\",0,\"-11\",2]],\"joiners\":[]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[\"h\"],"
        "\"members\":[[\"a\",0,\"11\"]],\"joiners\":[]}",
        "{\"generation\":1,\"step\":0,\"hosts\":[\"h\"],"
        "\"members\":[[\"a\",0,\"8000000000000000\",2]],\"joiners\":[]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = NULL;
        why = NULL;
        ASSERT_EQ(mb_view_parse(bad[i], strlen(bad[i]), &v, &why),
                  ST_EPROTO);
        ASSERT(v == NULL && why != NULL);
    }

    mb_node_rec_t rec;
    const char ok[] = "{\"host\":\"h\",\"slots\":4,\"lease\":\"255\"}";
    ASSERT_OK(mb_node_parse("n", ok, strlen(ok), &rec, &why));
    ASSERT_EQ(rec.member.slots, 4);
    ASSERT_EQ(rec.member.lease, 255);
    ASSERT_EQ(rec.member.addr_len, 0);
    ASSERT_EQ(rec.pid, -1);
    mb_node_rec_free(&rec);
    const char neg[] = "{\"host\":\"h\",\"slots\":1,\"lease\":\"1\","
                       "\"pid\":-1}";
    ASSERT_EQ(mb_node_parse("n", neg, strlen(neg), &rec, &why), ST_EPROTO);
    const char frac[] = "{\"host\":\"h\",\"slots\":1.5,\"lease\":\"1\"}";
    ASSERT_EQ(mb_node_parse("n", frac, strlen(frac), &rec, &why),
              ST_EPROTO);
    return 0;
}
