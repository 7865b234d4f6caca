/*
 * serve_impl.h - what the server's HTTP side (serve.c) and its requests'
 * tasks (request.c) share: the server, a request and how they hand a
 * request's answer over (serve.c's top comment says how it runs).
 */
#ifndef WL_SERVE_IMPL_H
#define WL_SERVE_IMPL_H

#include <microhttpd.h>

#include "serve.h"

typedef struct request request;

typedef struct server {
    /* options */
    const char *dir, *host, *backend, *port_file, *name;
    int port, max_seqs, kv_pages, max_model_len, default_max_tokens, workers, drain_seconds;
    int idle_timeout, body_timeout, share_prefixes;
    int prefill_chunk;      /* the engine's: prompt tokens a chunk, 0 whole */
    int step_prompt_tokens; /* the batcher's prompt budget beside decodes, 0 none */
    int swap_mb;            /* host memory for preempted sequences' caches; 0: recompute */
    int pipeline;           /* a stage of layers a rank of the MPI job (rank 0 serves) */
    int sparse_2_4;         /* the dense projections pruned to 2:4, multiplied sparse */
    int ranks;              /* tensor parallel over this many GPUs (1: off) */
    wl_model **models;      /* each rank's (wl_open_ranks: the first is model) */
    wl_link *link;
    size_t max_body;
    const char *draft_dir; /* speculative requests' draft model; NULL: n-grams */
    /* parts */
    wl_model model, draft;
    wl_tokenizer *tk;
    wl_chat *chat;
    weft_runtime *rt;
    wl_engine engine;
    struct MHD_Daemon *daemon;
    wl_metrics metrics;
    /* the requests alive (their objects, from the handler to the last
     * reference), for draining */
    pthread_mutex_t lock;
    pthread_cond_t idle;
    request *live;
    int in_flight, draining;
    uint64_t next_id;
} server;

/* Where a request's answer stands: the handler suspends the connection
 * while PENDING; ANSWER is a whole body (an error, or a response that did
 * not stream); STREAMING is a stream of events in out. */
typedef enum phase { PENDING, ANSWER, STREAMING } phase;

struct request {
    server *srv;
    request *prev, *next; /* srv->live */
    int refs;             /* atomic: the connection, the stream's response, the task */
    int endpoint;
    wl_oai_request q;
    char id[48];
    long created;
    uint64_t arrived_ns;
    int32_t *prompt;
    int n_prompt, max_tokens;
    wl_choice choices[WL_MAX_N];
    int first_token; /* atomic: the request's first token was timed */
    /* under lock */
    pthread_mutex_t lock;
    struct MHD_Connection *conn; /* NULL once the connection is done with it */
    phase phase;
    int status;
    char *answer;
    wl_buf out; /* stream bytes not yet sent */
    size_t sent;
    int done, suspended, gone;
};

/* Drops a reference; the last frees the request and takes it off the
 * server's list (and says so to a drain waiting for none). */
void wl_request_unref(request *r);
/* Under r->lock: the connection has something to do again (resumed if
 * it was suspended for want of it). */
void wl_request_wake_locked(request *r);
/* The whole answer is this error (OpenAI's error object). */
void wl_request_answer_error(request *r, int status, const char *message, const char *param);
/* The request's task (arg: the request, whose task reference it drops). */
void *wl_request_task(void *arg);

#endif
