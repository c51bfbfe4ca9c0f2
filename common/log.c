#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"

/* -1 until first use, then the threshold (see log.h for why it is global). */
static atomic_int log_level = -1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int rd_log_parse_level(const char *s, rd_log_level_t *level_p)
{
    for (int i = 0; i < 4; i++) {
        if (s != NULL && strcmp(s, level_names[i]) == 0) {
            *level_p = (rd_log_level_t)i;
            return 0;
        }
    }
    return ST_EINVAL;
}

static int current_level(void)
{
    int lvl = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (lvl < 0) {
        rd_log_level_t parsed = RD_LOG_INFO;
        (void)rd_log_parse_level(getenv("RINGD_LOG_LEVEL"), &parsed);
        lvl = (int)parsed;
        atomic_store(&log_level, lvl);
    }
    return lvl;
}

void rd_log_set_level(rd_log_level_t level)
{
    atomic_store(&log_level, (int)level);
}

int rd_log_enabled(rd_log_level_t level)
{
    return (int)level <= current_level();
}

void rd_log(rd_log_level_t level, const char *file, int line,
            const char *fmt, ...)
{
    if (!rd_log_enabled(level))
        return;

    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    /* One fprintf per line so lines from threads do not interleave. */
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%d] %s:%d %s\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
            tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            level_names[level], (int)getpid(), base, line, msg);
}
