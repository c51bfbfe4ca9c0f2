# daemon/: the ringd daemon (local API server, step machine, backends,
# metrics, config) and ringctl. The daemon objects also go into the core
# library so that tests can drive the config parser in-process.
LIB_SRCS += daemon/dmn.c daemon/server.c daemon/step.c daemon/metrics.c \
            daemon/config.c daemon/backend.c \
            daemon/backend_solo.c daemon/backend_ring.c \
            daemon/backend_ring_thread.c daemon/backend_ring_ckpt.c \
            daemon/backend_ring_restore.c \
            daemon/checkpoint.c
# Parsers of untrusted input, loop-free for the fuzz harnesses.
LIB_SRCS += daemon/msg.c
# ringctl talks to etcd itself (membership/etcd.h, cJSON): it needs the
# libraries membership/module.mk adds, named here so the order of the
# module files does not matter.
PKGS += libuv libsystemd libcurl libcjson
BIN_TARGETS += $(BUILD)/ringd $(BUILD)/ringctl
TEST_SRCS += $(wildcard tests/test-dmn-*.c) tests/dmn-util.c

$(BUILD)/ringd: $(BUILD)/daemon/main.o $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(CORE_LIB) $(PKG_LIBS) $(LIBS)

$(BUILD)/ringctl: $(BUILD)/daemon/ringctl.o $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(CORE_LIB) $(PKG_LIBS) $(LIBS)
