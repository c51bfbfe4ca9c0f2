#include "common/log.h"
#include "common/status.h"
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
