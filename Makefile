# ringd - top-level Makefile.
#
#   make            build everything (CUDA library too when nvcc is found)
#   make deps       apt-get install the Debian packages ringd needs (root)
#   make test       install missing packages, build, run the test suite
#   make asan       the test suite again under -fsanitize=address,undefined
#   make bench      run the benchmarks (print TSV tables)
#   make sim        the model of 10..1000 nodes (sim/README.md)
#   make demo       the demo (see README.md)
#   make demo-torch the demo with the PyTorch trainer, and DDP beside it
#   make chaos      seeded fault injection (SEED=n FAULTS=n; chaos/README.md)
#   make scale      64 daemons on loopback: kill 8, join 8 (NODES=n; chaos/)
#   make install    what each module installs (PREFIX=/usr/local, DESTDIR)
#   make deb        Debian packages in build/debs/ (debian/, debhelper)
#   make clean      remove build/
#
# Knobs: BUILD=dir, CUDA=auto|0|1, CUDA_HOME, NVCC_GENCODE, SAN=1, V=1.
# Each module folder has a module.mk that adds its sources to the lists
# below; this file holds only what is common.

BUILD ?= build
CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
NVCC_GENCODE ?= -gencode arch=compute_80,code=sm_80 \
                -gencode arch=compute_90,code=sm_90 \
                -gencode arch=compute_90,code=compute_90
SAN ?= 0
PREFIX ?= /usr/local
DESTDIR ?=
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
PYTHONDIR ?= $(PREFIX)/lib/python3/dist-packages
BINDIR ?= $(PREFIX)/bin
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DOCDIR ?= $(PREFIX)/share/doc/ringd
# Debian: /etc and /lib/systemd/system for PREFIX=/usr (packages), under
# the prefix otherwise (/usr/local/etc, /usr/local/lib/systemd/system).
SYSCONFDIR ?= $(if $(filter /usr,$(PREFIX)),/etc,$(PREFIX)/etc)
UNITDIR ?= $(if $(filter /usr,$(PREFIX)),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d

CC ?= cc
WARN := -Wall -Wextra -Werror -Wstrict-prototypes -Wmissing-prototypes \
        -Wno-missing-field-initializers
CFLAGS ?= -O2 -g
ALL_CFLAGS = -std=c11 $(CFLAGS) $(WARN) -D_GNU_SOURCE -fPIC -pthread \
             -I. -I$(BUILD) $(PKG_CFLAGS) $(SAN_FLAGS)
ALL_LDFLAGS = -pthread $(LDFLAGS) $(SAN_FLAGS)

ifeq ($(SAN),1)
SAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer \
             -fno-sanitize-recover=undefined
endif

ifeq ($(V),1)
Q :=
else
Q := @
endif

# Defined before the fragments so their rules can name them.
CORE_LIB = $(BUILD)/libringd_core.a
TEST_BIN = $(BUILD)/ringd-tests

# Filled in by the module fragments.
LIB_SRCS :=
TEST_SRCS :=
BIN_TARGETS :=
BENCH_BINS :=
INSTALL_TARGETS :=
PKGS :=
LIBS := -lm -ldl

DEB_PACKAGES := build-essential pkg-config curl ca-certificates openssl \
    etcd-server etcd-client libuv1-dev libcurl4-openssl-dev libucx-dev \
    ucx-utils libzstd-dev libsystemd-dev libcjson-dev libxxhash-dev zlib1g-dev \
    libssl-dev \
    iproute2 iptables iputils-ping gnuplot-nox prometheus clang \
    libfuzzer-14-dev \
    python3-numpy python3-venv python3-pip python3-setuptools python3-wheel \
    python3-torch python3-torchvision python3-sklearn

include $(sort $(wildcard */module.mk))
include tests/fuzz/fuzz.mk

PKG_CFLAGS = $(if $(PKGS),$(shell pkg-config --cflags $(PKGS)))
PKG_LIBS = $(if $(PKGS),$(shell pkg-config --libs $(PKGS)))

LIB_OBJS = $(LIB_SRCS:%.c=$(BUILD)/%.o)
TEST_OBJS = $(TEST_SRCS:%.c=$(BUILD)/%.o)

.PHONY: all deps test asan bench bench-deps bench-run demo demo-torch chaos clean install deb
.DEFAULT_GOAL := all

all: $(CORE_LIB) $(BIN_TARGETS) $(TEST_BIN) $(BENCH_BINS) $(CUDA_TARGETS)

# The dependency file names each object both ways, relative to the top
# and absolute: the tests build the install tree with BUILD=/abs/build
# (test-dmn-install.c), and a .d written then named only the absolute
# target, so a later `make` (BUILD=build) saw no header behind its objects
# and linked objects of two layouts of one struct after a header change.
DEP_TARGETS = -MT $(abspath $@) -MT $(patsubst $(CURDIR)/%,%,$(abspath $@))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) $(CFLAGS_EXTRA) -MMD -MP $(DEP_TARGETS) -c $< -o $@

$(CORE_LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# The test list is every TEST_IMPL(name) in the test sources.
# Remade on every build and replaced only when it changed: a test file
# removed (a branch switched) is newer than nothing, yet must leave.
$(BUILD)/test-list.h: FORCE
	@mkdir -p $(dir $@)
	$(Q)grep -ho '^TEST_IMPL([A-Za-z0-9_]*)' $(TEST_SRCS) \
	    | sed 's/^TEST_IMPL/TEST_ENTRY/' > $@.tmp && \
	    { cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@; }

.PHONY: FORCE
FORCE:

$(BUILD)/tests/runner.o: $(BUILD)/test-list.h

$(TEST_BIN): $(TEST_OBJS) $(BUILD)/tests/runner.o $(BUILD)/tests/helpers.o \
             $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $(filter %.o,$^) $(CORE_LIB) \
	    $(PKG_LIBS) $(LIBS)

# make test installs what is missing first, so that it works on a fresh
# machine as the first command; the build itself runs after deps.
test: deps
	$(MAKE) all
	$(MAKE) fuzz-if-available
	$(TEST_BIN)

asan:
	$(MAKE) BUILD=build/asan SAN=1 CUDA=0 test

# The peers the benchmarks compare against (Gloo), installed as deps
# installs the project's own; the rest runs in a fresh make so the
# bench's rules see the headers just installed.
BENCH_PACKAGES := libgloo-dev
bench-deps: deps
	@$(MAKE) --no-print-directory deps DEB_PACKAGES="$(BENCH_PACKAGES)"

bench: bench-deps
	@$(MAKE) --no-print-directory bench-run

bench-run: all
	@for b in $(BENCH_BINS); do echo "== $$b"; $$b || exit 1; done

# A local cluster through a real training job, a node killed and one
# added (examples/demo.sh says how).
demo: deps
	$(MAKE) all
	BUILD=$(BUILD) examples/demo.sh

# The same with the PyTorch trainer, then the job under DDP for the step
# time (examples/demo-torch.sh says how).
demo-torch: deps
	$(MAKE) all
	BUILD=$(BUILD) examples/demo-torch.sh

# Seeded fault injection through a real job (chaos/README.md). SEED
# defaults to a random one, which chaos.sh prints for a replay.
SEED ?=
FAULTS ?= 10
KINDS ?=
ETCD3 ?=
chaos: all
	BUILD=$(BUILD) chaos/chaos.sh $(if $(SEED),-s $(SEED)) -f $(FAULTS) \
	    $(if $(KINDS),--kinds $(KINDS)) $(if $(filter 1,$(ETCD3)),--etcd3)

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	      | grep -q 'install ok installed' || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all present"; exit 0; fi; \
	echo "deps: installing" $$missing; \
	SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    $$SUDO apt-get install -y -q --no-install-recommends $$missing

# Each module adds its install-<module> target; DESTDIR stages the tree
# for packaging, paths written into installed files omit it.
install: $(INSTALL_TARGETS)

# Debian packages (ringd, libringd, libringd-dev, python3-ringd) from
# debian/, built with debhelper in a copy of the tree under build/, the
# .debs left in build/debs/. debhelper and dpkg-dev are installed here,
# for this target only.
DEB_TOOLS := debhelper dpkg-dev fakeroot
deb:
	@missing=$$(for p in $(DEB_TOOLS) $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
	      | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    SUDO=; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	    $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	        $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
	rm -rf build/debsrc && mkdir -p build/debsrc/ringd build/debs
	tar --exclude=./build --exclude=./.git -cf - . \
	    | tar -xf - -C build/debsrc/ringd
	cd build/debsrc/ringd && dpkg-buildpackage -b -us -uc
	mv build/debsrc/*.deb build/debs/
	@ls build/debs/*.deb

clean:
	rm -rf build

-include $(shell find $(BUILD) -path '*/debsrc' -prune -o -name '*.d' -type f -print 2>/dev/null)
