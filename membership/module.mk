# membership/: the etcd v3 client (etcd_) and membership (mb_): lease,
# leader, views, suspicion, fencing, drain. Tests start a real etcd.
LIB_SRCS += membership/etcd.c membership/etcd-kv.c membership/etcd-watch.c \
            membership/etcd-json.c \
            membership/mb.c membership/mb-lease.c membership/mb-watch.c \
            membership/mb-view.c \
            membership/mb-leader.c membership/mb-blame.c membership/mb-suspect.c \
            membership/mb-keys.c membership/mb-sign.c
TEST_SRCS += tests/test-etcd.c tests/test-etcd-fake.c tests/mb-fixture.c \
             tests/mb-members.c tests/test-mb-view.c tests/test-mb-watch.c \
             tests/test-mb-life.c tests/test-mb-blame.c \
             tests/test-mb-keys.c
PKGS += libuv libcurl libcjson libcrypto libzstd
BENCH_BINS += $(BUILD)/bench/viewchange

# The bench starts a real etcd with the test fixture.
$(BUILD)/bench/viewchange: $(BUILD)/bench/viewchange.o \
    $(BUILD)/tests/mb-fixture.o $(BUILD)/tests/helpers.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) \
	    $(PKG_LIBS) $(LIBS)
