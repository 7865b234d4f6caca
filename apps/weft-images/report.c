/*
 * report.c - progress bar, messages and busy time of weft-images.
 *
 * The bar lives on the last line of stderr; a message first erases it and
 * the next redraw puts it back, under one lock, so lines never interleave.
 * With stderr not a terminal there is no bar and messages are plain lines.
 */
#include <stdarg.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

#include "report.h"

enum { BAR_WIDTH = 30, REDRAW_NS = 100000000 };

uint64_t wi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double wi_cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static pthread_mutex_t err_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    bool bar, drawn;
    size_t total, done;
    uint64_t start_ns, drawn_ns;
} bar;

void wi_report_start(size_t total, bool show_bar)
{
    pthread_mutex_lock(&err_lock);
    bar.bar = show_bar;
    bar.total = total;
    bar.done = 0;
    bar.start_ns = wi_now_ns();
    bar.drawn_ns = 0;
    pthread_mutex_unlock(&err_lock);
}

/* Call with err_lock held. */
static void draw(uint64_t now)
{
    double s = (double)(now - bar.start_ns) / 1e9;
    double rate = s > 0 ? (double)bar.done / s : 0;
    size_t fill = bar.total ? bar.done * BAR_WIDTH / bar.total : BAR_WIDTH;
    char cells[BAR_WIDTH + 1];
    for (size_t i = 0; i < BAR_WIDTH; i++)
        cells[i] = i < fill ? '#' : '.';
    cells[BAR_WIDTH] = '\0';
    fprintf(stderr, "\r[%s] %zu/%zu %3d%%  %.0f images/s", cells, bar.done, bar.total,
            bar.total ? (int)(100 * bar.done / bar.total) : 100, rate);
    if (s >= 1 && rate > 0 && bar.done < bar.total) { /* the first second's rate is noise */
        unsigned eta = (unsigned)((double)(bar.total - bar.done) / rate + 0.5);
        fprintf(stderr, "  ETA %u:%02u", eta / 60, eta % 60);
    }
    fputs("\033[K", stderr);
    fflush(stderr);
    bar.drawn = true;
    bar.drawn_ns = now;
}

static void erase(void)
{
    if (bar.drawn) {
        fputs("\r\033[K", stderr);
        bar.drawn = false;
    }
}

void wi_report_msg(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&err_lock);
    erase();
    fputs("weft-images: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    if (bar.bar)
        draw(wi_now_ns());
    pthread_mutex_unlock(&err_lock);
    va_end(ap);
}

void wi_report_progress(size_t done)
{
    if (!bar.bar)
        return;
    uint64_t now = wi_now_ns();
    pthread_mutex_lock(&err_lock);
    bar.done = done;
    if (now - bar.drawn_ns >= REDRAW_NS || done == bar.total)
        draw(now);
    pthread_mutex_unlock(&err_lock);
}

void wi_report_end(void)
{
    pthread_mutex_lock(&err_lock);
    erase();
    bar.bar = false;
    fflush(stderr);
    pthread_mutex_unlock(&err_lock);
}

void wi_activity_init(wi_activity *a)
{
    pthread_mutex_init(&a->lock, NULL);
    a->host = a->device = 0;
    a->last_ns = wi_now_ns();
    a->host_ns = a->device_ns = a->both_ns = 0;
}

/* Call with a->lock held: charge the time since the last change. */
static void advance(wi_activity *a)
{
    uint64_t now = wi_now_ns(), dt = now - a->last_ns;
    a->last_ns = now;
    if (a->host)
        a->host_ns += dt;
    if (a->device)
        a->device_ns += dt;
    if (a->host && a->device)
        a->both_ns += dt;
}

void wi_activity_add(wi_activity *a, int dhost, int ddevice)
{
    pthread_mutex_lock(&a->lock);
    advance(a);
    a->host += (unsigned)dhost;
    a->device += (unsigned)ddevice;
    pthread_mutex_unlock(&a->lock);
}

void wi_activity_settle(wi_activity *a)
{
    pthread_mutex_lock(&a->lock);
    advance(a);
    pthread_mutex_unlock(&a->lock);
}
