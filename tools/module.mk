# tools/: ringctl, the operator's command line. It reads etcd through
# membership's key helper and parsers, and speaks the local API of
# proto/; it needs the libraries membership/module.mk adds, named here so
# the order of the module files does not matter.
PKGS += libuv libcurl libcjson
BIN_TARGETS += $(BUILD)/ringctl
TEST_SRCS += tests/test-tools-calls.c

INSTALL_TARGETS += install-tools
.PHONY: install-tools
install-tools: $(BUILD)/ringctl
	install -d $(DESTDIR)$(BINDIR)
	install -m 755 $(BUILD)/ringctl $(DESTDIR)$(BINDIR)/ringctl

$(BUILD)/ringctl: $(BUILD)/tools/ringctl.o $(BUILD)/tools/ringctl-ckpt.o \
    $(BUILD)/tools/ringctl-hops.o $(BUILD)/tools/ringctl-wait.o \
    $(BUILD)/libringd_core.a
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) $(PKG_LIBS) \
	    $(LIBS)
