# chaos/: the seeded fault harness (chaos.sh, `make chaos`) and its quick
# seeded run inside `make test` (tests/test-chaos.c; root only); the scale
# run (scale.sh, `make scale`) and its 10-node variant (tests/test-scale.c).
TEST_SRCS += tests/test-chaos.c tests/test-scale.c

# make scale: NODES daemons on loopback through one job (chaos/scale.sh;
# NODES, KILL, JOIN and SCALE_* pass through the environment).
.PHONY: scale
scale: all
	BUILD=$(BUILD) chaos/scale.sh
