# bench/e2e: the product path (real etcd, daemons, trainers) against the
# raw ring and Gloo. It reuses the tests' daemon and etcd fixtures.
BENCH_BINS += $(BUILD)/bench/e2e

$(BUILD)/bench/e2e: $(BUILD)/bench/e2e.o $(BUILD)/bench/e2e-rows.o \
    $(BUILD)/bench/e2e-mem.o $(BUILD)/bench/e2e-vs-gloo.o \
    $(BUILD)/bench/e2e-worker.o \
    $(BUILD)/tests/dmn-util.o \
    $(BUILD)/tests/mb-fixture.o $(BUILD)/tests/helpers.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) \
	    $(PKG_LIBS) $(LIBS)

# Gloo is the peer to beat, built for the benchmark only (never linked
# into ringd) and only where Debian's libgloo-dev is installed; make
# bench installs it first (bench-deps), and bench/e2e without it stops
# naming what is missing instead of printing a ratio of 0.
CXX ?= c++
ifneq ($(wildcard /usr/include/gloo/allreduce_ring.h),)
E2E_GLOO := $(BUILD)/bench/e2e-gloo
bench-run: $(E2E_GLOO)
$(BUILD)/bench/e2e: | $(E2E_GLOO)
endif

$(BUILD)/bench/e2e-gloo: bench/e2e-gloo.cc
	@mkdir -p $(dir $@)
	@echo "  CXX     $@"
	$(Q)$(CXX) -O2 -std=c++17 -pthread -o $@ $< -lgloo

# bench/etcd-load: M lightweight members (leases, keepalives, watches)
# against a real etcd started with the tests' fixture (bench/README.md).
BENCH_BINS += $(BUILD)/bench/etcd-load

$(BUILD)/bench/etcd-load: $(BUILD)/bench/etcd-load.o \
    $(BUILD)/tests/mb-fixture.o $(BUILD)/tests/helpers.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) \
	    $(PKG_LIBS) $(LIBS)

# bench/coll-steps: the C trainer bench/torch-layer.py sets against
# ringd.torch (not in make bench: the Python script drives it).
BIN_TARGETS += $(BUILD)/bench/coll-steps

$(BUILD)/bench/coll-steps: $(BUILD)/bench/coll-steps.o $(BUILD)/libringd.so
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< -L$(BUILD) -lringd \
	    -Wl,-rpath,'$$ORIGIN/..'
