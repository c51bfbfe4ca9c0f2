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

SIM_FLAGS ?=
.PHONY: sim
sim: $(SIM_BIN)
	$(SIM_BIN) $(SIM_FLAGS)
