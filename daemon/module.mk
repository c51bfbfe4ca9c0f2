# daemon/: the ringd daemon (local API server, step machine, metrics,
# config, checkpoint orchestration); the job engine is job/. The daemon
# objects also go into the core library so that tests can drive the
# config parser in-process.
LIB_SRCS += daemon/dmn.c daemon/server.c daemon/step.c daemon/step-queue.c \
            daemon/metrics.c daemon/config.c daemon/checkpoint.c \
            daemon/copy.c daemon/jobs.c daemon/base.c \
            daemon/conn.c daemon/state.c \
            daemon/drain.c daemon/fuse.c
# Parsers of untrusted input, loop-free for the fuzz harnesses.
LIB_SRCS += daemon/msg.c
PKGS += libuv libsystemd libcurl libcjson
BIN_TARGETS += $(BUILD)/ringd
TEST_SRCS += $(wildcard tests/test-dmn-*.c) tests/dmn-util.c \
             tests/ring-cluster.c

INSTALL_TARGETS += install-daemon
.PHONY: install-daemon
install-daemon: $(BUILD)/ringd
	install -d $(DESTDIR)$(BINDIR)
	install -m 755 $(BUILD)/ringd $(DESTDIR)$(BINDIR)/ringd

$(BUILD)/ringd: $(BUILD)/daemon/main.o $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(CORE_LIB) $(PKG_LIBS) $(LIBS)
