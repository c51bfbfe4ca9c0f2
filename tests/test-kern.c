#include "kernels/kern.h"
#include "tests/task.h"
TEST_IMPL(kern_names) { ASSERT_EQ(kern_dtype_size(KERN_F32), 4); return 0; }
