# examples/: the C trainer (OpenBLAS on the CPU, cuBLAS through kern_gpu
# when a GPU is present) linked against libringd.so.
BIN_TARGETS += $(BUILD)/examples/trainer
DEB_PACKAGES += libopenblas-dev zlib1g-dev python3-numpy python3-sklearn

$(BUILD)/examples/trainer.o $(BUILD)/examples/trainer-model.o: \
    CFLAGS_EXTRA = $(shell pkg-config --cflags openblas)

$(BUILD)/examples/trainer: $(BUILD)/examples/trainer.o \
                           $(BUILD)/examples/trainer-model.o \
                           $(BUILD)/libringd.so $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) -L$(BUILD) -lringd \
	    -Wl,-rpath,'$$ORIGIN/..' $(CORE_LIB) \
	    $(shell pkg-config --libs openblas) -lz $(LIBS)
