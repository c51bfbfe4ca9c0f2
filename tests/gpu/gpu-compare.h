/*
 * gpu-compare.h - the CUDA library checked against the CPU kernels on a
 * GPU (kernels/cuda/ against kernels/kern.h).
 */
#ifndef RINGD_TESTS_GPU_COMPARE_H
#define RINGD_TESTS_GPU_COMPARE_H

#include "kernels/cuda/kern_cuda_api.h"

/*
 * Every (dtype, op) reduce3 and reduce, avg_finish, the four casts and the
 * wire reductions on the device must equal the CPU kernels bit for bit
 * (any NaN matches any NaN). Prints a MISMATCH line per failing check and
 * returns how many failed. A device call that fails exits the process
 * with status 1 after printing the CUDA error.
 */
int gpu_compare_kernels(const kern_cuda_api_t *api);

/*
 * The cuBLAS helpers (dense forward/backward, axpy, scal) against a
 * double-precision CPU computation: a mismatch is a worst relative error
 * above 1e-4 (the worst goes to *worst_p when not NULL). Returns the
 * number of mismatches (0 or 1); device errors exit as above.
 */
int gpu_compare_blas(const kern_cuda_api_t *api, double *worst_p);

#endif /* RINGD_TESTS_GPU_COMPARE_H */
