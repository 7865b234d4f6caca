/*
 * loadgen.h - what the parts of weft-llm's load generator share, and what
 * its tests call directly: the server-sent events parser, the loopback
 * check of a URL, the seeded draws (Poisson arrivals, lengths, prompt
 * text), the statistics and the report (loadgen_parse.c,
 * loadgen_report.c), and one request's life on curl (loadgen_client.c);
 * the event loop and the command line are loadgen.c.
 *
 * Errors follow llm.h: 0 or -1, the reason in wl_error(). Times are
 * seconds (double) from the run's start, on CLOCK_MONOTONIC.
 */
#ifndef WL_LOADGEN_H
#define WL_LOADGEN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include <curl/curl.h>

/* ---- server-sent events ---------------------------------------------------- */

/* Called once per event that has a data field, with its data (the data
 * lines joined by "\n", NUL-terminated at data[len]). Returns 0, or -1
 * (reason set with wl_fail) to stop the stream. */
typedef int (*wl_sse_event_fn)(void *ctx, const char *data, size_t len);

/* A parser of one stream, fed bytes as they arrive, in pieces of any size:
 * lines end in "\n", "\r\n" or "\r" (a CR at the end of one piece and a LF
 * at the start of the next are one line end); a blank line dispatches the
 * event; lines opening with ':' are comments; "data" fields (one space
 * after the colon dropped) accumulate, every other field is ignored. */
typedef struct wl_sse {
    wl_sse_event_fn on_event;
    void *ctx;
    char *line; /* the line read so far */
    size_t line_len, line_cap;
    char *data; /* the event's data so far */
    size_t data_len, data_cap;
    int has_data; /* the event has a data field (possibly empty) */
    int after_cr; /* the last byte fed ended a line with a CR */
} wl_sse;

/* The longest line (and event) the parser keeps; past it, an error. */
#define WL_SSE_MAX_LINE ((size_t)16 << 20)

void wl_sse_init(wl_sse *p, wl_sse_event_fn on_event, void *ctx);
/* -1: the callback's error, a line past WL_SSE_MAX_LINE, or no memory. */
int wl_sse_feed(wl_sse *p, const char *buf, size_t n);
/* The stream's end: a last line without its line end, and an event
 * without its closing blank line, are taken as if they had them. */
int wl_sse_end(wl_sse *p);
void wl_sse_free(wl_sse *p);

/* ---- the target ------------------------------------------------------------- */

/* Accepts only http:// URLs whose host is 127.0.0.1, ::1 ([::1]) or
 * localhost (in any case), with no user name or password, and writes the
 * base that the API paths follow ("http://HOST:PORT" and the URL's path,
 * without a trailing "/" or "/v1") to base. Any other URL: -1, saying why. */
int wl_lg_loopback_url(const char *url, char *base, size_t cap);

/* ---- seeded draws --------------------------------------------------------- */

/* n arrival times of a Poisson process of rate requests a second: the
 * first at 0, then exponential gaps of mean 1 / rate. rate = INFINITY:
 * every one at 0. The draws come from *state. */
void wl_lg_arrivals(double *t, int n, double rate, uint64_t *state);
/* Uniform over the integers lo..hi (both included). */
int wl_lg_uniform_int(uint64_t *state, int lo, int hi);
/* A prompt of words words (at least one) drawn from a built-in list of
 * common English words, each after a space: one word is about one token
 * for the byte-level BPE vocabularies of Llama 3, Qwen and GPT-2. Returns
 * a malloc'd string, NULL when out of memory. */
char *wl_lg_prompt(uint64_t *state, int words);

/* ---- statistics ------------------------------------------------------------ */

typedef struct wl_lg_dist {
    size_t n;
    double mean, p50, p90, p99, max; /* NAN when n = 0 */
} wl_lg_dist;

/* The q quantile (0 <= q <= 1) of the sorted v[0, n), by linear
 * interpolation between the closest ranks (position q * (n - 1)); NAN for
 * n = 0. */
double wl_lg_quantile(const double *v, size_t n, double q);
/* Sorts v and summarizes it. */
void wl_lg_summarize(double *v, size_t n, wl_lg_dist *d);

/* ---- requests and the report ----------------------------------------------- */

/* Why a request failed. */
typedef enum wl_lg_reason {
    WL_LG_OK,
    WL_LG_CONNECT,   /* connection refused or not made */
    WL_LG_HTTP,      /* an HTTP status other than 200 */
    WL_LG_TIMEOUT,   /* past --timeout */
    WL_LG_MALFORMED, /* a response that is not the API's (SSE, JSON, fields) */
    WL_LG_SERVER,    /* an error object in a 200 stream */
    WL_LG_TRANSPORT, /* any other transfer error (a connection cut short) */
    WL_LG_REASONS
} wl_lg_reason;

const char *wl_lg_reason_name(wl_lg_reason r);

typedef struct wl_lg_result {
    int prompt_words, max_tokens; /* asked */
    double scheduled, sent;       /* arrival drawn, and when it was sent */
    double ttft, e2e;             /* from sent; ttft NAN when no text came */
    int chunks;                   /* data chunks with text */
    int completion_tokens;        /* usage's, else chunks; -1: not known */
    int prompt_tokens;            /* usage's; -1: not given */
    long http_status;             /* 0: no response */
    wl_lg_reason reason;
    char *error; /* malloc'd, one line; NULL when ok */
    double *itl; /* the gaps between successive chunks with text */
    size_t n_itl, itl_cap;
} wl_lg_result;

typedef struct wl_lg_opts {
    const char *url, *base, *endpoint, *model, *json_path;
    double rate;               /* INFINITY: all at once */
    int requests, concurrency; /* concurrency 0: no cap */
    int prompt_lo, prompt_hi, output_lo, output_hi;
    int stream;
    double timeout, temperature;
    uint64_t seed;
} wl_lg_opts;

typedef struct wl_lg_run {
    double wall;     /* first send to last completion */
    double cpu_user; /* the load generator's own, over the run */
    double cpu_sys;
} wl_lg_run;

/* The table to out and, with o->json_path, the JSON report there (its
 * config, summary and every request). -1 if the JSON cannot be written. */
int wl_lg_report(const wl_lg_opts *o, const wl_lg_result *res, int n, const wl_lg_run *run,
                 FILE *out);

/* ---- the client (loadgen_client.c) ----------------------------------------- */

/* A run's requests: the options, where they go, and their results. */
typedef struct wl_lg_client {
    wl_lg_opts o;
    int chat;                   /* the chat endpoint */
    char base[1024], url[1100]; /* the server's, and the endpoint's */
    struct curl_slist *headers; /* every request's */
    struct timespec t0;         /* the run's start */
    wl_lg_result *res;          /* [o.requests] */
} wl_lg_client;

/* Seconds since c->t0. */
double wl_lg_now(const wl_lg_client *c);
/* GET /v1/models: the first model's id, malloc'd in *model. */
int wl_lg_ask_model(wl_lg_client *c, char **model);
/* Makes request i (its prompt drawn from the seed and i) and adds its
 * transfer to m; its send time is now. -1: it could not be made, and its
 * result says why. */
int wl_lg_start(wl_lg_client *c, CURLM *m, int i);
/* A transfer that curl reported done with code: the request's result is
 * filled in and the transfer freed. */
void wl_lg_finish(CURLM *m, CURL *easy, CURLcode code);

#endif
