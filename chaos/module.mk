# chaos/: the seeded fault harness (chaos.sh, `make chaos`) and its quick
# seeded run inside `make test` (tests/test-chaos.c; root only).
TEST_SRCS += tests/test-chaos.c
