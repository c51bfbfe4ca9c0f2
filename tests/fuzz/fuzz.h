/*
 * fuzz.h - what the libFuzzer harnesses share (fuzz-common.c).
 *
 * Each harness feeds its input to the very function the daemon calls on
 * untrusted bytes and checks what that function promises beyond not
 * crashing; a broken promise aborts through FUZZ_ASSERT, which libFuzzer
 * reports as a crash with the input saved.
 */
#ifndef RINGD_FUZZ_H
#define RINGD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_ASSERT(expr)                                                    \
    do {                                                                     \
        if (!(expr)) {                                                       \
            fprintf(stderr, "fuzz assertion failed at %s:%d: %s\n",          \
                    __FILE__, __LINE__, #expr);                              \
            abort();                                                         \
        }                                                                    \
    } while (0)

/* A malloc'd copy of data with a NUL after it (NULL if out of memory);
 * for parsers whose callers hand them NUL-terminated text. */
char *fuzz_strndup(const uint8_t *data, size_t size);

#endif /* RINGD_FUZZ_H */
