/*
 * blocking.h - a runtime's pool of threads that may block, for
 * weft_blocking (blocking.c has the protocol).
 */
#ifndef WEFT_BLOCKING_H
#define WEFT_BLOCKING_H

#include <pthread.h>
#include <stdbool.h>

struct weft__blocking_job;

typedef struct weft__blocking {
    pthread_mutex_t lock;
    pthread_cond_t work;             /* a job was queued, or stopping */
    struct weft__blocking_job *head; /* queued, not yet taken; FIFO */
    struct weft__blocking_job *tail;
    unsigned queued;    /* jobs on the queue */
    unsigned idle;      /* threads waiting on work */
    unsigned max;       /* the bound on threads */
    unsigned nthreads;  /* threads started, all kept until stop */
    pthread_t *threads; /* max entries, allocated with the first */
    bool stopping;
} weft__blocking;

/* Set up an empty pool of at most max threads (0: the default). Starts no
 * thread and cannot fail. */
void weft__blocking_init(weft__blocking *b, unsigned max);

/* Stop and join the pool's threads. No job may be queued or running: every
 * caller is a task of the runtime, and they have all ended. */
void weft__blocking_fini(weft__blocking *b);

#endif
