# transport/: UCX context, worker, endpoints, tagged messages.
LIB_SRCS += transport/tp.c
PKGS += ucx
TEST_SRCS += tests/test-tp.c
