# checkpoint/: shard codec (shuffle, XOR delta, zstd, xxh64), atomic files,
# manifests, retention and verified restore.
LIB_SRCS += checkpoint/ckpt_codec.c checkpoint/ckpt_file.c \
            checkpoint/ckpt_manifest.c checkpoint/ckpt_store.c
TEST_SRCS += tests/test-ckpt.c
PKGS += libzstd libxxhash libcjson
