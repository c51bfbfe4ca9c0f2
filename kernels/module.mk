# kernels/: CPU reductions and casts (scalar, AVX2, AVX-512 chosen at run
# time) and the loader of the optional CUDA library.
LIB_SRCS += kernels/kern.c kernels/kern_scalar.c kernels/kern_avx2.c \
            kernels/kern_avx512.c kernels/kern_gpu.c
TEST_SRCS += tests/test-kern.c tests/test-kern-gpu.c tests/gpu/gpu-compare.c
BENCH_BINS += $(BUILD)/bench/kernels

$(BUILD)/kernels/kern_avx2.o: CFLAGS_EXTRA = -mavx2 -mfma -mf16c
$(BUILD)/kernels/kern_avx512.o: CFLAGS_EXTRA = -mavx512f -mavx512bw \
    -mavx512vl -mavx512dq -mavx2 -mfma -mf16c

$(BUILD)/bench/kernels: $(BUILD)/bench/kernels.o $(CORE_LIB)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $< $(CORE_LIB) $(PKG_LIBS) $(LIBS)

# The CUDA library: built when nvcc exists (CUDA=auto), always (CUDA=1) or
# never (CUDA=0). Nothing links it; kern_gpu.c loads it with dlopen.
ifeq ($(CUDA),auto)
CUDA_BUILD := $(if $(wildcard $(NVCC)),1,0)
else
CUDA_BUILD := $(CUDA)
endif

CUDA_SRCS := $(wildcard kernels/cuda/*.cu)
CUDA_OBJS := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
CUDA_LIB := $(BUILD)/libringd_cuda.so
ifeq ($(CUDA_BUILD),1)
CUDA_TARGETS += $(CUDA_LIB)
endif

$(BUILD)/kernels/cuda/%.o: kernels/cuda/%.cu kernels/cuda/kern_cuda_api.h \
    kernels/cuda/kern_cuda-int.h kernels/kern-ieee.h common/status.h
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) -O2 -std=c++17 -I. -Xcompiler -fPIC,-fvisibility=hidden,-Wall,-Werror \
	    $(NVCC_GENCODE) -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJS)
	@echo "  LD      $@"
	$(Q)$(CC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 \
	    -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart_static \
	    -ldl -lpthread -lrt -lstdc++
