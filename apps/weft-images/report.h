/*
 * report.h - what weft-images tells its user while it runs and at the end:
 * the progress bar, per-file messages, and the time accounting behind the
 * summary (how long host work and device work were each in progress, and
 * both at once).
 */
#ifndef WEFT_IMAGES_REPORT_H
#define WEFT_IMAGES_REPORT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

uint64_t wi_now_ns(void);
/* CPU time of the whole process, user and system, in seconds. */
double wi_cpu_seconds(void);

/* ---- stderr: messages and the progress bar ------------------------------ */

/* Start reporting; the bar is drawn only when show_bar (stderr is a
 * terminal and the user did not ask for quiet). */
void wi_report_start(size_t total, bool show_bar);
/* One line on stderr ("weft-images: " prefixed), clear of the bar. Safe
 * from any thread. */
void wi_report_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Redraw the bar with done of total, at most ten times a second. */
void wi_report_progress(size_t done);
/* Erase the bar for good. */
void wi_report_end(void);

/* ---- busy time ------------------------------------------------------------ */

/* Counts of host work and device work in progress, integrated over time:
 * the union of the stretches with host work, with device work, and with
 * both at once. */
typedef struct wi_activity {
    pthread_mutex_t lock;
    unsigned host, device;
    uint64_t last_ns;
    uint64_t host_ns, device_ns, both_ns;
} wi_activity;

void wi_activity_init(wi_activity *a);
/* Host work (dhost) or device work (ddevice) starts (+1) or ends (-1). */
void wi_activity_add(wi_activity *a, int dhost, int ddevice);
/* Close the books at now. */
void wi_activity_settle(wi_activity *a);

#endif
