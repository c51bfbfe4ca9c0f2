#include "common/log.h"
#include "common/status.h"
#include "common/wire.h"
#include "tests/task.h"

TEST_IMPL(status_ranges)
{
    ASSERT(st_is_link_failure(ST_ELINK));
    ASSERT(st_is_link_failure(ST_EUNAVAIL));
    ASSERT(!st_is_link_failure(ST_EPEER));
    ASSERT(st_is_peer_failure(ST_EPEER_TIMEOUT));
    ASSERT(st_is_ring_failure(ST_ERESHAPE));
    ASSERT(st_is_job_failure(ST_EFENCED));
    ASSERT(!st_is_job_failure(ST_OK));
    ASSERT(!st_is_peer_failure(-22));
    ASSERT_STR_EQ(st_strerror(-2), "No such file or directory");
    ASSERT_STR_EQ(st_strerror(ST_ERESHAPE), "view changed, redo the step");
    ASSERT_STR_EQ(st_strerror(-4999), "unknown error");
    return 0;
}

TEST_IMPL(log_levels)
{
    rd_log_level_t lvl;
    ASSERT_OK(rd_log_parse_level("debug", &lvl));
    ASSERT_EQ(lvl, RD_LOG_DEBUG);
    ASSERT_EQ(rd_log_parse_level("loud", &lvl), ST_EINVAL);
    ASSERT_EQ(rd_log_parse_level(NULL, &lvl), ST_EINVAL);
    rd_log_set_level(RD_LOG_WARN);
    ASSERT(rd_log_enabled(RD_LOG_ERROR));
    ASSERT(!rd_log_enabled(RD_LOG_INFO));
    return 0;
}

/*
 * rd_wire_parse takes exactly the three concrete names, which are
 * rd_wire_name's; anything else (the default's name, another case, a
 * prefix, a longer string, NULL) is -1 with *w_p untouched.
 */
TEST_IMPL(wire_parse)
{
    static const struct {
        const char *name;
        rd_wire_t w;
    } ok[] = {{"none", RD_WIRE_NONE}, {"bf16", RD_WIRE_BF16},
              {"f16", RD_WIRE_F16}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        rd_wire_t w = RD_WIRE_COUNT;
        ASSERT_EQ(rd_wire_parse(ok[i].name, &w), 0);
        ASSERT_EQ(w, ok[i].w);
        ASSERT_STR_EQ(rd_wire_name(w), ok[i].name);
    }
    static const char *const bad[] = {"", "BF16", "bf", "bf166", "None",
                                      "f16 ", " f16", "default", "?"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        rd_wire_t w = RD_WIRE_COUNT;
        ASSERT_MSG(rd_wire_parse(bad[i], &w) == -1, "\"%s\" taken",
                   bad[i]);
        ASSERT_EQ(w, RD_WIRE_COUNT);
    }
    rd_wire_t w = RD_WIRE_COUNT;
    ASSERT_EQ(rd_wire_parse(NULL, &w), -1);
    ASSERT_EQ(w, RD_WIRE_COUNT);
    /* Outside the enum the name is "?", which parses to nothing. */
    ASSERT_STR_EQ(rd_wire_name(RD_WIRE_COUNT), "?");
    ASSERT_STR_EQ(rd_wire_name((rd_wire_t)-1), "?");
    ASSERT_STR_EQ(rd_wire_name(RD_WIRE_DEFAULT), "default");
    return 0;
}
