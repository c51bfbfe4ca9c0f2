# tests/fuzz/: libFuzzer harnesses of every parser of untrusted input
# (tests/fuzz/README.md). Built with clang into their own directory, the
# parsers' sources instrumented too; the seed corpora live in
# tests/fuzz/corpus/<target>/.
#
#   make fuzz-build        build $(FUZZ_BUILD)/fuzz-<target>
#   make fuzz SECONDS=n    run every target n seconds (default 60), one
#                          after the other; new inputs are kept in
#                          $(FUZZ_BUILD)/corpus/<target>, crashes in
#                          $(FUZZ_BUILD)/crash-<target>-*
FUZZ_BUILD ?= $(BUILD)/fuzz
FUZZ_CC ?= clang
SECONDS ?= 60
FUZZ_TARGETS := proto etcd view ckpt config

FUZZ_SAN := -fsanitize=address,undefined -fno-sanitize-recover=undefined \
            -fno-omit-frame-pointer
FUZZ_CFLAGS = -std=c11 -g -O1 $(WARN) -D_GNU_SOURCE -pthread -I. \
              $(PKG_CFLAGS) -fsanitize=fuzzer-no-link $(FUZZ_SAN)

FUZZ_SRCS_proto := daemon/msg.c
FUZZ_SRCS_etcd := membership/etcd-json.c membership/etcd-watch.c \
                  membership/etcd.c membership/etcd-kv.c common/json.c
FUZZ_SRCS_view := membership/mb-view.c membership/etcd-json.c common/json.c
FUZZ_SRCS_ckpt := checkpoint/ckpt_codec.c checkpoint/ckpt_manifest.c \
                  checkpoint/ckpt_file.c \
                  common/json.c
FUZZ_SRCS_config := daemon/config.c
FUZZ_COMMON := common/log.c tests/fuzz/fuzz-common.c

FUZZ_BINS := $(FUZZ_TARGETS:%=$(FUZZ_BUILD)/fuzz-%)

$(FUZZ_BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  FUZZCC  $<"
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

# rd_log is wrapped so that rejected inputs are not logged (fuzz-common.c).
define FUZZ_LINK
$(FUZZ_BUILD)/fuzz-$(1): $(FUZZ_BUILD)/obj/tests/fuzz/fuzz-$(1).o \
    $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_SRCS_$(1)) $(FUZZ_COMMON))
	@echo "  LD      $$@"
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer $(FUZZ_SAN) -pthread -o $$@ $$^ \
	    -Wl,--wrap=rd_log $$(PKG_LIBS) $$(LIBS)
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call FUZZ_LINK,$(t))))

.PHONY: fuzz fuzz-build fuzz-if-available
fuzz-build: $(FUZZ_BINS)

fuzz: fuzz-build
	$(Q)for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(FUZZ_BUILD)/corpus/$$t || exit 1; \
	    echo "== fuzz-$$t: $(SECONDS) s"; \
	    $(FUZZ_BUILD)/fuzz-$$t -max_total_time=$(SECONDS) \
	        -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- \
	        $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t || exit 1; \
	done

# make test builds the harnesses where clang can link libFuzzer (the
# fuzz_short test runs them); elsewhere that test skips and says why.
fuzz-if-available:
	$(Q)if echo 'int LLVMFuzzerTestOneInput(const char *d, long n)' \
	        '{ (void)d; (void)n; return 0; }' \
	    | $(FUZZ_CC) -x c -fsanitize=fuzzer -o /dev/null - 2>/dev/null; \
	then $(MAKE) --no-print-directory fuzz-build; \
	else echo "fuzz: $(FUZZ_CC) cannot link libFuzzer; fuzz_short will" \
	    "skip"; fi

# The short run of every harness and the regression tests of what the
# fuzzers found, in the C runner.
TEST_SRCS += tests/test-fuzz.c
