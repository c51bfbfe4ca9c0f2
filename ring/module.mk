# ring/: fault-aware ring collectives over transport/ and kernels/.
LIB_SRCS += ring/ring.c ring/ring_setup.c ring/ring_hello.c ring/ring_grid.c \
            ring/ring_local.c ring/ring_wait.c ring/ring_hb.c \
            ring/ring_stale.c ring/ring_apply.c
TEST_SRCS += tests/test-ring.c tests/test-ring-args.c

# The helper process of the multi-process ring tests. CORE_LIB is defined
# after the fragments are read, so prerequisites spell the path out.
$(BUILD)/tests/ring-worker: $(BUILD)/tests/ring-worker.o \
                            $(BUILD)/tests/ring-worker-data.o \
                            $(BUILD)/tests/ring-worker-local.o \
                            $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) $(PKG_LIBS) \
	    $(LIBS)

# The test runner spawns the worker, so building the tests builds it.
$(BUILD)/ringd-tests: $(BUILD)/tests/ring-worker

BENCH_BINS += $(BUILD)/bench/ringbench

$(BUILD)/bench/ringbench: $(BUILD)/bench/ringbench.o $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(CORE_LIB) $(PKG_LIBS) $(LIBS)
