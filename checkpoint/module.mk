# checkpoint/: shard codec (shuffle, XOR delta, zstd, xxh64), atomic files,
# manifests, retention and verified restore.
LIB_SRCS += checkpoint/ckpt_codec.c checkpoint/ckpt_file.c \
            checkpoint/ckpt_manifest.c checkpoint/ckpt_store.c \
            checkpoint/ckpt_writer.c
TEST_SRCS += tests/test-ckpt.c tests/test-ckpt-codec.c tests/test-ckpt-file.c \
             tests/test-ckpt-writer.c tests/ckpt-data.c
PKGS += libzstd libxxhash libcjson
BENCH_BINS += $(BUILD)/bench/ckpt-cost

$(BUILD)/bench/ckpt-cost: $(BUILD)/bench/ckpt-cost.o $(BUILD)/tests/helpers.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(PKG_LIBS) $(LIBS) -lz
BENCH_BINS += bench/ckpt-overhead.sh
