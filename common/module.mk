# common/: status codes (header-only) and logging.
LIB_SRCS += common/log.c
TEST_SRCS += tests/test-common.c
