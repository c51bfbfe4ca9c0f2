/*
 * log.h - one line per event on stderr: time, level, where, message.
 *
 * The threshold is the one process-wide setting outside daemon/main.c: it is
 * read once from RINGD_LOG_LEVEL (error|warn|info|debug) and may be changed
 * with rd_log_set_level(); it is an atomic int, so any thread may log.
 * Functions that detect an error log it once, where it is detected; callers
 * pass the code up without logging again.
 */
#ifndef RINGD_LOG_H
#define RINGD_LOG_H

typedef enum {
    RD_LOG_ERROR = 0,
    RD_LOG_WARN = 1,
    RD_LOG_INFO = 2,
    RD_LOG_DEBUG = 3,
} rd_log_level_t;

void rd_log(rd_log_level_t level, const char *file, int line,
            const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void rd_log_set_level(rd_log_level_t level);
int rd_log_enabled(rd_log_level_t level);
/* Parse "error", "warn", "info", "debug"; returns 0 or ST_EINVAL. */
int rd_log_parse_level(const char *s, rd_log_level_t *level_p);

#define RD_ERROR(...) rd_log(RD_LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)
#define RD_WARN(...) rd_log(RD_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define RD_INFO(...) rd_log(RD_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define RD_DEBUG(...)                                                        \
    do {                                                                     \
        if (rd_log_enabled(RD_LOG_DEBUG))                                    \
            rd_log(RD_LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__);           \
    } while (0)

#endif /* RINGD_LOG_H */
