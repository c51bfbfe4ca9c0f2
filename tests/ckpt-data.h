/*
 * ckpt-data.h - what the checkpoint tests encode: weights-like floats
 * from a fixed xorshift sequence (the same in every run), the small
 * changes of a few SGD steps, and the codec settings they use.
 */
#ifndef RINGD_TEST_CKPT_DATA_H
#define RINGD_TEST_CKPT_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckpt.h"

/* zstd level 3, one thread, 4-byte elements. */
extern const ckpt_codec_t tc_codec;

/* The next number of the process's fixed sequence. */
uint32_t tc_rnd32(void);
/* Weights-like floats: roughly normal, scale 0.05. */
void tc_fill_weights(float *w, size_t n);
/* A few SGD-like steps: small changes to every weight. */
void tc_perturb(float *w, size_t n);

#endif
