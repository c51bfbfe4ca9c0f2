# sim/: the calibrated model of ringd at 10..1000 nodes (sim/README.md).
# Not part of the core library: the test runner links sim.o for the
# model's invariants, and `make sim` runs the model with this machine's
# measured inputs in sim/data/ (SIM_FLAGS adds flags).
SIM_BIN = $(BUILD)/sim/ringd-sim
BIN_TARGETS += $(SIM_BIN)
TEST_SRCS += tests/test-sim.c

$(SIM_BIN): $(BUILD)/sim/sim-main.o $(BUILD)/sim/sim.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) $(LIBS)

$(TEST_BIN): $(BUILD)/sim/sim.o

# The etcd figures measured here at 1000 members (bench/etcd-load: the
# keepalives at TTL 10 s, the TTL that kept every lease at 1000 here; the
# fan-out's fit, etcd CPU per watcher and per watcher and kB of view, on this
# machine's 2 cores) and the packed view after a failure, 4.3 B a member
# (mb_view_size_1000: 4 269 bytes at 1000 without joiners; 7.0 with 999).
SIM_ETCD ?= --etcd-load sim/data/etcd-load-1000.txt --lease-ttl-s 10 \
	--view-bytes-per-member 4.3 --etcd-cores 2
SIM_FLAGS ?=
.PHONY: sim
sim: $(SIM_BIN)
	$(SIM_BIN) $(SIM_ETCD) $(SIM_FLAGS)
