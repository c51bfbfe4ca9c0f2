# client/: libringd.so, what trainers link. It depends on nothing but libc
# (no libuv, no UCX). Its objects also go into the core library so that
# tests can use the client in-process.
CLIENT_OBJS := $(BUILD)/client/client.o $(BUILD)/client/client-coll.o \
    $(BUILD)/client/client-wait.o $(BUILD)/client/client-conn.o
LIB_SRCS += client/client.c client/client-coll.c client/client-wait.c \
    client/client-conn.c
BIN_TARGETS += $(BUILD)/libringd.so
TEST_SRCS += $(wildcard tests/test-client-*.c) tests/test-ringrun.c

$(BUILD)/libringd.so: $(CLIENT_OBJS) client/libringd.map
	@echo "  LD      $@"
	$(Q)$(CC) -shared $(ALL_LDFLAGS) -Wl,-soname,libringd.so \
	    -Wl,--version-script=client/libringd.map -o $@ $(CLIENT_OBJS)

# make install: the library, its header, and the Python package, which
# learns from ringd/_config.py where the library went; the launcher
# ringrun in BINDIR, told where the package went.
INSTALL_TARGETS += install-client
.PHONY: install-client
install-client: $(BUILD)/libringd.so
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCLUDEDIR)
	install -m 755 $(BUILD)/libringd.so $(DESTDIR)$(LIBDIR)/libringd.so
	install -m 644 include/ringd.h $(DESTDIR)$(INCLUDEDIR)/ringd.h
	cd client/python && find ringd -name '*.py' ! -name _config.py \
	    -exec install -D -m 644 {} $(DESTDIR)$(PYTHONDIR)/{} \;
	printf 'LIBDIR = "%s"\n' '$(LIBDIR)' \
	    > $(DESTDIR)$(PYTHONDIR)/ringd/_config.py
	install -d $(DESTDIR)$(BINDIR)
	sed 's|^PYTHONDIR = None$$|PYTHONDIR = "$(PYTHONDIR)"|' \
	    client/python/ringrun > $(DESTDIR)$(BINDIR)/ringrun
	chmod 755 $(DESTDIR)$(BINDIR)/ringrun
