# common/: status codes and the clock (header-only), logging, JSON fields.
LIB_SRCS += common/log.c common/json.c
TEST_SRCS += tests/test-common.c tests/test-common-json.c
