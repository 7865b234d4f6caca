/*
 * metrics.c - the server's counters and latency histograms, written as
 * Prometheus' text exposition format for GET /metrics.
 *
 * Every update takes one mutex for a few instructions: requests end at
 * most a few thousand times a second and tokens are counted per token, so
 * a lock is cheaper to reason about than a field of atomics and costs
 * nothing measurable beside a forward step. Labels come from fixed lists
 * (the endpoints the server knows, the statuses it answers), so a client
 * cannot grow the output by inventing paths.
 */
#include <stdlib.h>
#include <string.h>

#include "serve.h"

const char *const wl_endpoint_names[WL_ENDPOINTS] = {
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "other"};

static const int statuses[WL_STATUSES] = {200, 400, 404, 405, 408, 413, 500, 503};

/* Upper bounds of the buckets, in seconds (+Inf follows). */
static const double ttft_bounds[WL_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                               1,     2.5,  5,     10,   30,  60};
static const double itl_bounds[WL_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                              0.1,   0.25,   0.5,   1,    2.5,  5};
static const double e2e_bounds[WL_BUCKETS] = {0.05, 0.1, 0.25, 0.5, 1,   2.5, 5,
                                              10,   20,  30,   60,  120, 300};

void wl_metrics_init(wl_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->lock, NULL);
    m->v.ttft.bounds = ttft_bounds;
    m->v.itl.bounds = itl_bounds;
    m->v.e2e.bounds = e2e_bounds;
}

void wl_metrics_destroy(wl_metrics *m)
{
    pthread_mutex_destroy(&m->lock);
}

static void observe(wl_histogram *h, double seconds)
{
    int b = 0;
    while (b < WL_BUCKETS && seconds > h->bounds[b])
        b++;
    h->counts[b]++;
    h->sum += seconds;
    h->n++;
}

void wl_metrics_request(wl_metrics *m, int endpoint, int status)
{
    int s = 0;
    while (s < WL_STATUSES - 1 && statuses[s] != status)
        s++;
    if (statuses[s] != status)
        s = WL_STATUSES; /* "other" */
    pthread_mutex_lock(&m->lock);
    m->v.requests[endpoint][s]++;
    pthread_mutex_unlock(&m->lock);
}

void wl_metrics_tokens(wl_metrics *m, long prompt, long generated)
{
    pthread_mutex_lock(&m->lock);
    m->v.prompt_tokens += prompt;
    m->v.generated_tokens += generated;
    pthread_mutex_unlock(&m->lock);
}

void wl_metrics_observe(wl_metrics *m, wl_latency which, double seconds)
{
    pthread_mutex_lock(&m->lock);
    observe(which == WL_TTFT ? &m->v.ttft : which == WL_ITL ? &m->v.itl : &m->v.e2e, seconds);
    pthread_mutex_unlock(&m->lock);
}

static void put_histogram(wl_buf *out, const char *name, const char *help, const wl_histogram *h)
{
    wl_buf_printf(out, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long cumulative = 0;
    for (int b = 0; b < WL_BUCKETS; b++) {
        cumulative += h->counts[b];
        wl_buf_printf(out, "%s_bucket{le=\"%g\"} %ld\n", name, h->bounds[b], cumulative);
    }
    cumulative += h->counts[WL_BUCKETS];
    wl_buf_printf(out, "%s_bucket{le=\"+Inf\"} %ld\n%s_sum %.6f\n%s_count %ld\n", name, cumulative,
                  name, h->sum, name, h->n);
}

static void put_gauge(wl_buf *out, const char *name, const char *help, long v)
{
    wl_buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n%s %ld\n", name, help, name, name, v);
}

void wl_metrics_write(wl_metrics *m, const wl_engine_counts *e, int in_flight, wl_buf *out)
{
    pthread_mutex_lock(&m->lock);
    wl_metric_values snap = m->v; /* formatted outside the lock */
    pthread_mutex_unlock(&m->lock);
    wl_buf_printf(out, "# HELP weft_llm_requests_total HTTP requests answered, by endpoint and "
                       "status.\n# TYPE weft_llm_requests_total counter\n");
    for (int p = 0; p < WL_ENDPOINTS; p++)
        for (int s = 0; s <= WL_STATUSES; s++)
            if (snap.requests[p][s] || (s == 0 && p < 2)) {
                char status[16];
                snprintf(status, sizeof status, "%d", statuses[s < WL_STATUSES ? s : 0]);
                wl_buf_printf(out, "weft_llm_requests_total{endpoint=\"%s\",status=\"%s\"} %ld\n",
                              wl_endpoint_names[p], s < WL_STATUSES ? status : "other",
                              snap.requests[p][s]);
            }
    wl_buf_printf(out,
                  "# HELP weft_llm_prompt_tokens_total Prompt tokens of admitted requests.\n"
                  "# TYPE weft_llm_prompt_tokens_total counter\nweft_llm_prompt_tokens_total "
                  "%ld\n"
                  "# HELP weft_llm_generation_tokens_total Tokens generated.\n"
                  "# TYPE weft_llm_generation_tokens_total counter\n"
                  "weft_llm_generation_tokens_total %ld\n"
                  "# HELP weft_llm_batch_steps_total Batched steps run (decode tokens and "
                  "prompts' chunks).\n"
                  "# TYPE weft_llm_batch_steps_total counter\nweft_llm_batch_steps_total %ld\n"
                  "# HELP weft_llm_batch_rows_total Tokens those steps took: decode tokens "
                  "and prompt tokens.\n"
                  "# TYPE weft_llm_batch_rows_total counter\nweft_llm_batch_rows_total %ld\n"
                  "# HELP weft_llm_prefix_shared_tokens_total Prompt tokens whose KV pages "
                  "another prompt had computed.\n"
                  "# TYPE weft_llm_prefix_shared_tokens_total counter\n"
                  "weft_llm_prefix_shared_tokens_total %ld\n"
                  "# HELP weft_llm_preemptions_total Sequences that gave their KV pages back, "
                  "to recompute them (or swap them back in) when admitted again.\n"
                  "# TYPE weft_llm_preemptions_total counter\nweft_llm_preemptions_total %ld\n"
                  "# HELP weft_llm_swaps_total Preempted sequences whose keys and values "
                  "waited in host memory instead of being recomputed.\n"
                  "# TYPE weft_llm_swaps_total counter\nweft_llm_swaps_total %ld\n",
                  snap.prompt_tokens, snap.generated_tokens, e->steps, e->rows, e->shared_tokens,
                  e->preemptions, e->swaps);
    put_gauge(out, "weft_llm_requests_in_flight", "Completion requests being handled.", in_flight);
    put_gauge(out, "weft_llm_sequences_running", "Sequences admitted and generating.", e->running);
    put_gauge(out, "weft_llm_sequences_queued", "Sequences waiting for KV pages or a batch place.",
              e->queued);
    put_gauge(out, "weft_llm_kv_pages_total", "Pages of the paged KV cache.", e->pages);
    put_gauge(out, "weft_llm_kv_pages_used", "KV pages holding tokens.", e->used_pages);
    put_gauge(out, "weft_llm_kv_pages_reserved", "KV pages promised to running sequences.",
              e->reserved_pages);
    put_histogram(out, "weft_llm_time_to_first_token_seconds",
                  "From a request's arrival to its first generated token.", &snap.ttft);
    put_histogram(out, "weft_llm_inter_token_latency_seconds",
                  "Between successive tokens of a sequence.", &snap.itl);
    put_histogram(out, "weft_llm_request_duration_seconds",
                  "From a completion request's arrival to its last token.", &snap.e2e);
}
