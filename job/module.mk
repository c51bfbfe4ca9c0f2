# job/: the elastic job engine (job_): the backend table, solo and fake,
# and the ring backend (etcd membership + the UCX ring on a ring thread,
# its checkpoint records in etcd, the together-restore). Most of its tests
# run through the daemon (tests/test-dmn-*.c); the job secret's core and
# job_allreduce's checks have their own.
LIB_SRCS += job/job.c job/job_solo.c job/job_ring.c job/job_ring_thread.c \
            job/job_ring_ckpt.c job/job_ring_restore.c job/job_auth.c \
            job/job_ring_auth.c job/job_ring_commit.c job/job_ring_hops.c \
            job/job_ring_mb.c job/job_ring_opts.c job/job_ring_view.c
PKGS += libuv libcurl libcjson ucx libcrypto
TEST_SRCS += tests/test-job-auth.c tests/test-job-reduce.c
