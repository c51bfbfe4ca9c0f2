#include "kernels/kern_gpu.h"
#include "tests/task.h"
TEST_IMPL(kern_gpu_fallback) { kern_gpu_t *g = NULL; int rc = kern_gpu_open("/nonexistent/libringd_cuda.so", &g); ASSERT_EQ(rc, ST_ENOTSUP); return 0; }
