# client/: libringd.so, what trainers link. It depends on nothing but libc
# (no libuv, no UCX). client.c also goes into the core library so that
# tests can use the client in-process.
LIB_SRCS += client/client.c
BIN_TARGETS += $(BUILD)/libringd.so
TEST_SRCS += $(wildcard tests/test-client-*.c)

$(BUILD)/libringd.so: $(BUILD)/client/client.o client/libringd.map
	@echo "  LD      $@"
	$(Q)$(CC) -shared $(ALL_LDFLAGS) -Wl,-soname,libringd.so \
	    -Wl,--version-script=client/libringd.map -o $@ $<
