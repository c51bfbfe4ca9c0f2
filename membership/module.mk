# membership/: the etcd v3 client (etcd_) and membership (mb_): lease,
# leader, views, suspicion, fencing, drain. Tests start a real etcd.
LIB_SRCS += membership/etcd.c membership/etcd-json.c membership/mb.c \
            membership/mb-view.c
TEST_SRCS += tests/test-etcd.c tests/test-etcd-fake.c tests/test-mb.c tests/mb-fixture.c
PKGS += libuv libcurl libcjson
