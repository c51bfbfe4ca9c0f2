/*
 * fuzz-common.c - shared by every harness.
 *
 * The parsers log each input they reject, and at millions of inputs the
 * log would cost more than the parsing. The harnesses are linked with
 * --wrap=rd_log: the message is still formatted, so a format that reads
 * past its argument is caught, then dropped unless FUZZ_LOG is set.
 */
#include "tests/fuzz/fuzz.h"

#include <stdarg.h>
#include <string.h>

#include "common/log.h"

void __real_rd_log(rd_log_level_t level, const char *file, int line,
                   const char *fmt, ...);
void __wrap_rd_log(rd_log_level_t level, const char *file, int line,
                   const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void __wrap_rd_log(rd_log_level_t level, const char *file, int line,
                   const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    static int show = -1;
    if (show < 0)
        show = getenv("FUZZ_LOG") != NULL;
    if (show)
        __real_rd_log(level, file, line, "%s", msg);
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (s != NULL) {
        memcpy(s, data, size);
        s[size] = '\0';
    }
    return s;
}
