/*
 * task.h - the test vocabulary: TEST_IMPL and assertions that never compile
 * out. Each test runs in its own process (see runner.c), so a failed
 * assertion prints where and why, then exits the child with status 1.
 */
#ifndef RINGD_TASK_H
#define RINGD_TASK_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"

#define TEST_SKIP 77

/*
 * Skip, saying why: the runner prints the reason after "# SKIP" (one
 * line, at most 200 bytes). Use it instead of a bare TEST_SKIP so a
 * skipped test never reads like a pass.
 */
void test_skip_reason(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));
#define TEST_SKIP_WHY(...)                                                   \
    do {                                                                     \
        test_skip_reason(__VA_ARGS__);                                       \
        return TEST_SKIP;                                                    \
    } while (0)

#define TEST_IMPL(name)                                                      \
    int run_test_##name(void);                                               \
    int run_test_##name(void)

#define TEST_FAIL_(...)                                                      \
    do {                                                                     \
        fprintf(stderr, "assertion failed at %s:%d: ", __FILE__, __LINE__);  \
        fprintf(stderr, __VA_ARGS__);                                        \
        fprintf(stderr, "\n");                                               \
        fflush(stderr);                                                      \
        exit(1);                                                             \
    } while (0)

#define ASSERT(expr)                                                         \
    do {                                                                     \
        if (!(expr))                                                         \
            TEST_FAIL_("%s", #expr);                                         \
    } while (0)

#define ASSERT_MSG(expr, ...)                                                \
    do {                                                                     \
        if (!(expr))                                                         \
            TEST_FAIL_(__VA_ARGS__);                                         \
    } while (0)

/*
 * ASSERT_EQ and friends compare integers as int64_t, and compare as
 * double when either side is floating point: truncating one would make a
 * relative difference of 1e-7 "equal" 0. _Generic picks at compile time
 * and evaluates nothing; each operand is evaluated once.
 */
#define IS_FLOAT_(x) _Generic((x), float: 1, double: 1, long double: 1,     \
                              default: 0)
#define TO_DOUBLE_(x) _Generic((x), float: (x), double: (x),                \
                               long double: (x),                            \
                               default: (double)(intptr_t)(x))

#define ASSERT_CMP_(a, op, b)                                                \
    do {                                                                     \
        if (IS_FLOAT_(a) || IS_FLOAT_(b)) {                                  \
            double a_ = TO_DOUBLE_(a), b_ = TO_DOUBLE_(b);                   \
            if (!(a_ op b_))                                                 \
                TEST_FAIL_("%s %s %s (%.9g vs %.9g)", #a, #op, #b, a_, b_);  \
            break;                                                           \
        }                                                                    \
        int64_t a_ = (int64_t)(a), b_ = (int64_t)(b);                        \
        if (!(a_ op b_))                                                     \
            TEST_FAIL_("%s %s %s (%" PRId64 " vs %" PRId64 ")", #a, #op, #b, \
                       a_, b_);                                              \
    } while (0)

#define ASSERT_EQ(a, b) ASSERT_CMP_(a, ==, b)
#define ASSERT_NE(a, b) ASSERT_CMP_(a, !=, b)
#define ASSERT_LT(a, b) ASSERT_CMP_(a, <, b)
#define ASSERT_LE(a, b) ASSERT_CMP_(a, <=, b)
#define ASSERT_GT(a, b) ASSERT_CMP_(a, >, b)
#define ASSERT_GE(a, b) ASSERT_CMP_(a, >=, b)

#define ASSERT_OK(expr)                                                      \
    do {                                                                     \
        int rc_ = (expr);                                                    \
        if (rc_ != 0)                                                        \
            TEST_FAIL_("%s returned %d (%s)", #expr, rc_,                   \
                       st_strerror(rc_));                                    \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                  \
    do {                                                                     \
        const char *a_ = (a), *b_ = (b);                                     \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)                 \
            TEST_FAIL_("%s == %s (\"%s\" vs \"%s\")", #a, #b,               \
                       a_ ? a_ : "(null)", b_ ? b_ : "(null)");              \
    } while (0)

#endif /* RINGD_TASK_H */
