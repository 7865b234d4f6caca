/*
 * serve.h - what the parts of `weft-llm serve` share: a byte buffer, the
 * metrics (metrics.c), and the OpenAI request and response formats
 * (openai.c). The HTTP layer and the request tasks are serve.c.
 */
#ifndef WL_SERVE_H
#define WL_SERVE_H

#include <jansson.h>
#include <pthread.h>

#include "llm.h"

/* ---- metrics (metrics.c) ------------------------------------------------ */

enum {
    WL_EP_COMPLETIONS,
    WL_EP_CHAT,
    WL_EP_MODELS,
    WL_EP_HEALTH,
    WL_EP_METRICS,
    WL_EP_OTHER,
    WL_ENDPOINTS
};
extern const char *const wl_endpoint_names[WL_ENDPOINTS];

#define WL_STATUSES 8 /* 200 400 404 405 408 413 500 503, and "other" */
#define WL_BUCKETS 13

typedef struct wl_histogram {
    const double *bounds;        /* WL_BUCKETS upper bounds, seconds */
    long counts[WL_BUCKETS + 1]; /* the last: over every bound */
    double sum;
    long n;
} wl_histogram;

typedef struct wl_metric_values {
    long requests[WL_ENDPOINTS][WL_STATUSES + 1];
    long prompt_tokens, generated_tokens;
    wl_histogram ttft, itl, e2e;
} wl_metric_values;

typedef struct wl_metrics {
    pthread_mutex_t lock;
    wl_metric_values v;
} wl_metrics;

typedef enum wl_latency { WL_TTFT, WL_ITL, WL_E2E } wl_latency;

void wl_metrics_init(wl_metrics *m);
void wl_metrics_destroy(wl_metrics *m);
void wl_metrics_request(wl_metrics *m, int endpoint, int status);
void wl_metrics_tokens(wl_metrics *m, long prompt, long generated);
void wl_metrics_observe(wl_metrics *m, wl_latency which, double seconds);
/* The Prometheus text of m, the engine's counts and the requests in flight. */
void wl_metrics_write(wl_metrics *m, const wl_engine_counts *e, int in_flight, wl_buf *out);

/* ---- OpenAI's completion formats (openai.c) ----------------------------- */

#define WL_MAX_STOPS 4 /* OpenAI's limit on stop strings */
#define WL_MAX_N 16    /* choices a request may ask for */
#define WL_MAX_TOP 20  /* alternatives per token in logprobs */

/* A completion request's fields, checked. */
typedef struct wl_oai_request {
    int chat; /* /v1/chat/completions */
    int stream, include_usage;
    int n;
    int max_tokens; /* 0: not given (the server's default applies) */
    int logprobs;   /* -1: none; else the alternatives per token (0 to WL_MAX_TOP) */
    int ignore_eos, return_token_ids; /* extensions, as vLLM spells them */
    weft_priority priority;           /* extension: "high", "normal" or "low" */
    int speculate_k, ngram;           /* extension: speculative decoding (wl_gen's) */
    wl_penalties penalties; /* OpenAI's two and logit_bias, and repetition_penalty (extension) */
    wl_sampler sampler;
    int seeded;
    char *stop[WL_MAX_STOPS];
    int n_stop;
    json_t *prompt;   /* completions: a string or an array of token ids */
    json_t *messages; /* chat: the messages array */
} wl_oai_request;

/* Checks body (the parsed JSON) as a request to the completions or chat
 * endpoint of model `model`. On an error returns -1 with the message in
 * wl_error(), *status the HTTP status and *param the field at fault (a
 * static string or NULL). Unknown fields are ignored, as OpenAI does;
 * known ones of the wrong type or out of range are errors. */
int wl_oai_parse(json_t *body, int chat, const char *model, wl_oai_request *r, int *status,
                 const char **param);
void wl_oai_request_free(wl_oai_request *r);

/* OpenAI's error object, as JSON text (malloc'd). */
char *wl_oai_error_body(const char *message, const char *type, const char *param);

/* One choice's output as it is generated: its text so far, what is held
 * back (a possible start of a stop string, or an unfinished character),
 * its token ids and logprobs. */
typedef struct wl_choice {
    int index;
    wl_buf text;    /* emitted */
    wl_buf pending; /* decoded, not yet emitted */
    int32_t *ids;
    int n_ids, cap_ids;
    int tokens;         /* generated, the end-of-sequence token included */
    json_t *logprobs;   /* the whole choice's (not streamed), or NULL */
    const char *finish; /* "stop", "length" or NULL while running */
    int stopped;        /* a stop string matched */
} wl_choice;

void wl_choice_free(wl_choice *c);

/* Takes a generated token: its text goes to pending, and what may be shown
 * now is appended to emit (UTF-8). *lp gets the token's logprobs entry
 * (NULL without logprobs), in the chat or completions shape, as the
 * stream's chunk carries it; the choice keeps them too when not streaming.
 * Returns 1 when a stop string matched (the generation stops; the text
 * before it was emitted), else 0. */
int wl_choice_token(wl_choice *c, const wl_oai_request *r, const wl_tokenizer *tk, int32_t id,
                    int eos, const float *logits, int vocab, wl_buf *emit, json_t **lp);
/* The end: what is still held back is emitted (a stop string's possible
 * start was not one). */
void wl_choice_flush(wl_choice *c, wl_buf *emit);

/* A stream's chunk as an SSE event ("data: {...}\n\n") appended to out:
 * text (UTF-8) and lp (may be NULL; the reference is taken) for a choice,
 * with finish (NULL while running); role_chunk: the chat stream's first
 * chunk, which carries the role. */
void wl_oai_chunk(wl_buf *out, const wl_oai_request *r, const char *id, long created,
                  const char *model, int index, const char *text, size_t len, json_t *lp,
                  const char *finish, int role_chunk);
/* The final usage chunk (stream_options.include_usage). */
void wl_oai_usage_chunk(wl_buf *out, const wl_oai_request *r, const char *id, long created,
                        const char *model, int prompt_tokens, int completion_tokens);
/* The whole response of a request that did not stream. */
char *wl_oai_response(const wl_oai_request *r, const char *id, long created, const char *model,
                      wl_choice *choices, int n, int prompt_tokens);

#endif
