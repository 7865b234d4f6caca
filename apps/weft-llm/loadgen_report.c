/*
 * loadgen_report.c - the load generator's report: a table on stdout and,
 * with --json, one JSON document of the run's options, its summary and
 * every request.
 *
 * Latencies and token rates count the requests that succeeded only; the
 * failed ones are counted by reason, with the first message of each. TTFT
 * and ITL exist for streamed requests only (a response not streamed has
 * one arrival), TPOT for those of two tokens or more. A value that does
 * not exist is "-" in the table and null in the JSON (so are infinite
 * rates).
 */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"
#include "loadgen.h"

typedef struct summary {
    int ok, failed, by_reason[WL_LG_REASONS];
    const char *example[WL_LG_REASONS]; /* each reason's first message */
    long long out_tokens;               /* of the requests that succeeded */
    int unknown_tokens;                 /* succeeded, no usage to count their tokens */
    int other_length;                   /* succeeded with a length other than max_tokens */
    double prompt_words, prompt_tokens; /* means: asked, and usage's where given */
    int prompt_tokens_n;
    double achieved_rate, req_per_s, tok_per_s;
    wl_lg_dist ttft, itl, tpot, e2e;
} summary;

/* The requests' values as arrays, then their distributions. */
static int distributions(const wl_lg_result *res, int n, summary *s)
{
    size_t n_itl = 0, k_ttft = 0, k_itl = 0, k_tpot = 0, k_e2e = 0;
    for (int i = 0; i < n; i++)
        n_itl += res[i].reason == WL_LG_OK ? res[i].n_itl : 0;
    double *ttft = malloc(((size_t)n + 1) * sizeof *ttft);
    double *tpot = malloc(((size_t)n + 1) * sizeof *tpot);
    double *e2e = malloc(((size_t)n + 1) * sizeof *e2e);
    double *itl = malloc((n_itl + 1) * sizeof *itl);
    int rc = -1;
    if (!ttft || !tpot || !e2e || !itl) {
        wl_fail("out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        const wl_lg_result *r = &res[i];
        if (r->reason != WL_LG_OK)
            continue;
        e2e[k_e2e++] = r->e2e;
        if (!isnan(r->ttft))
            ttft[k_ttft++] = r->ttft;
        if (!isnan(r->ttft) && r->completion_tokens > 1)
            tpot[k_tpot++] = (r->e2e - r->ttft) / (r->completion_tokens - 1);
        for (size_t k = 0; k < r->n_itl; k++)
            itl[k_itl++] = r->itl[k];
    }
    wl_lg_summarize(ttft, k_ttft, &s->ttft);
    wl_lg_summarize(itl, k_itl, &s->itl);
    wl_lg_summarize(tpot, k_tpot, &s->tpot);
    wl_lg_summarize(e2e, k_e2e, &s->e2e);
    rc = 0;
out:
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    return rc;
}

static int summarize(const wl_lg_result *res, int n, const wl_lg_run *run, summary *s)
{
    double first = INFINITY, last = -INFINITY, words = 0, ptok = 0;
    memset(s, 0, sizeof *s);
    for (int i = 0; i < n; i++) {
        const wl_lg_result *r = &res[i];
        first = r->sent < first ? r->sent : first;
        last = r->sent > last ? r->sent : last;
        words += r->prompt_words;
        if (r->reason != WL_LG_OK) {
            s->failed++;
            if (!s->by_reason[r->reason]++)
                s->example[r->reason] = r->error;
            continue;
        }
        s->ok++;
        if (r->completion_tokens < 0)
            s->unknown_tokens++;
        else
            s->out_tokens += r->completion_tokens;
        s->other_length += r->completion_tokens >= 0 && r->completion_tokens != r->max_tokens;
        if (r->prompt_tokens >= 0) {
            ptok += r->prompt_tokens;
            s->prompt_tokens_n++;
        }
    }
    s->prompt_words = n ? words / n : NAN;
    s->prompt_tokens = s->prompt_tokens_n ? ptok / s->prompt_tokens_n : NAN;
    s->achieved_rate = n > 1 && last > first ? (n - 1) / (last - first) : INFINITY;
    s->req_per_s = run->wall > 0 ? s->ok / run->wall : NAN;
    s->tok_per_s = run->wall > 0 ? (double)s->out_tokens / run->wall : NAN;
    return distributions(res, n, s);
}

/* ---- the table ------------------------------------------------------------- */

static void cell_ms(FILE *f, double v)
{
    if (isnan(v))
        fprintf(f, " %9s", "-");
    else
        fprintf(f, " %9.2f", v * 1e3);
}

static void row(FILE *f, const char *name, const wl_lg_dist *d)
{
    fprintf(f, "  %-6s", name);
    cell_ms(f, d->mean);
    cell_ms(f, d->p50);
    cell_ms(f, d->p90);
    cell_ms(f, d->p99);
    cell_ms(f, d->max);
    fprintf(f, " %8zu\n", d->n);
}

static void range(FILE *f, int lo, int hi)
{
    if (lo == hi)
        fprintf(f, "%d", lo);
    else
        fprintf(f, "%d-%d", lo, hi);
}

static void table(FILE *f, const wl_lg_opts *o, const summary *s, const wl_lg_run *run)
{
    fprintf(f, "weft-llm loadgen: %s/v1/%s, model %s, %s\n", o->base,
            strcmp(o->endpoint, "chat") ? "completions" : "chat/completions", o->model,
            o->stream ? "streamed" : "not streamed");
    fprintf(f, "  %d requests, rate ", o->requests);
    if (isinf(o->rate))
        fprintf(f, "inf (all at once)");
    else
        fprintf(f, "%g/s (Poisson)", o->rate);
    fprintf(f, ", concurrency ");
    if (o->concurrency)
        fprintf(f, "%d", o->concurrency);
    else
        fprintf(f, "not capped");
    fprintf(f, ", prompt ");
    range(f, o->prompt_lo, o->prompt_hi);
    fprintf(f, " words, output ");
    range(f, o->output_lo, o->output_hi);
    fprintf(f, " tokens, seed %llu\n", (unsigned long long)o->seed);
    fprintf(f, "requests     %d ok, %d failed\n", s->ok, s->failed);
    for (int r = 1; r < WL_LG_REASONS; r++)
        if (s->by_reason[r])
            fprintf(f, "  %-10s %d, the first: %.200s\n", wl_lg_reason_name((wl_lg_reason)r),
                    s->by_reason[r], s->example[r] ? s->example[r] : "");
    fprintf(f, "wall time    %.3f s\n", run->wall);
    fprintf(f, "throughput   %.2f requests/s, %.1f output tokens/s (%lld tokens", s->req_per_s,
            s->tok_per_s, s->out_tokens);
    if (s->unknown_tokens)
        fprintf(f, "; %d responses without usage not counted", s->unknown_tokens);
    fprintf(f, ")\n");
    if (isinf(s->achieved_rate))
        fprintf(f, "arrivals     all at once\n");
    else
        fprintf(f, "arrivals     %.2f requests/s achieved\n", s->achieved_rate);
    fprintf(f, "prompts      %.1f words on average", s->prompt_words);
    if (s->prompt_tokens_n)
        fprintf(f, ", %.1f tokens by the server's count", s->prompt_tokens);
    fprintf(f, "\n");
    if (s->other_length)
        fprintf(f, "outputs      %d of %d not of the asked length (ignore_eos not honoured?)\n",
                s->other_length, s->ok);
    fprintf(f, "latency (ms)     mean       p50       p90       p99       max        n\n");
    row(f, "TTFT", &s->ttft);
    row(f, "ITL", &s->itl);
    row(f, "TPOT", &s->tpot);
    row(f, "E2E", &s->e2e);
    double cpu = run->cpu_user + run->cpu_sys;
    fprintf(f, "loadgen CPU  %.3f s user + %.3f s system (%.1f%% of one core over the wall time)\n",
            run->cpu_user, run->cpu_sys, run->wall > 0 ? 100 * cpu / run->wall : 0.0);
}

/* ---- the JSON ---------------------------------------------------------------- */

static json_t *num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *count(long long v)
{
    return v < 0 ? json_null() : json_integer(v);
}

static json_t *dist(const wl_lg_dist *d)
{
    return json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "n", (json_int_t)d->n, "mean", num(d->mean),
                     "p50", num(d->p50), "p90", num(d->p90), "p99", num(d->p99), "max",
                     num(d->max));
}

static json_t *config_json(const wl_lg_opts *o)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:i, s:o, s:[ii], s:[ii], s:f, s:f, s:I}",
                     "url", o->url, "base", o->base, "endpoint", o->endpoint, "model", o->model,
                     "stream", o->stream, "rate", num(o->rate), "requests", o->requests,
                     "concurrency", o->concurrency ? json_integer(o->concurrency) : json_null(),
                     "prompt_words", o->prompt_lo, o->prompt_hi, "output_tokens", o->output_lo,
                     o->output_hi, "temperature", o->temperature, "timeout_s", o->timeout, "seed",
                     (json_int_t)o->seed);
}

static json_t *summary_json(const summary *s, const wl_lg_run *run)
{
    json_t *by = json_object();
    for (int r = 1; r < WL_LG_REASONS; r++)
        json_object_set_new(by, wl_lg_reason_name((wl_lg_reason)r), json_integer(s->by_reason[r]));
    return json_pack("{s:i, s:i, s:o, s:f, s:o, s:o, s:I, s:i, s:i, s:o, s:o, s:o, s:o, s:o, "
                     "s:o, s:o, s:{s:f, s:f}}",
                     "ok", s->ok, "failed", s->failed, "failed_by_reason", by, "wall_s", run->wall,
                     "requests_per_s", num(s->req_per_s), "output_tokens_per_s", num(s->tok_per_s),
                     "output_tokens", (json_int_t)s->out_tokens, "responses_without_usage",
                     s->unknown_tokens, "other_output_length", s->other_length, "achieved_rate",
                     num(s->achieved_rate), "prompt_words_mean", num(s->prompt_words),
                     "prompt_tokens_mean", num(s->prompt_tokens), "ttft_s", dist(&s->ttft), "itl_s",
                     dist(&s->itl), "tpot_s", dist(&s->tpot), "e2e_s", dist(&s->e2e),
                     "loadgen_cpu_s", "user", run->cpu_user, "system", run->cpu_sys);
}

static json_t *request_json(int i, const wl_lg_result *r)
{
    double sum = 0, max = NAN;
    for (size_t k = 0; k < r->n_itl; k++) {
        sum += r->itl[k];
        max = k && max > r->itl[k] ? max : r->itl[k];
    }
    return json_pack(
        "{s:i, s:s, s:o, s:I, s:i, s:i, s:f, s:f, s:o, s:f, s:i, s:o, s:o, s:o, s:o}", "index", i,
        "reason", wl_lg_reason_name(r->reason), "error",
        r->error ? json_string(r->error) : json_null(), "http_status", (json_int_t)r->http_status,
        "prompt_words", r->prompt_words, "max_tokens", r->max_tokens, "scheduled_s", r->scheduled,
        "sent_s", r->sent, "ttft_s", num(r->ttft), "e2e_s", r->e2e, "chunks", r->chunks,
        "completion_tokens", count(r->completion_tokens), "prompt_tokens", count(r->prompt_tokens),
        "itl_mean_s", num(r->n_itl ? sum / (double)r->n_itl : NAN), "itl_max_s", num(max));
}

static int write_json(const char *path, const wl_lg_opts *o, const wl_lg_result *res, int n,
                      const summary *s, const wl_lg_run *run)
{
    json_t *reqs = json_array();
    for (int i = 0; reqs && i < n; i++)
        if (json_array_append_new(reqs, request_json(i, &res[i])))
            break;
    json_t *root = json_pack("{s:o, s:o, s:o}", "config", config_json(o), "summary",
                             summary_json(s, run), "requests", reqs);
    if (!root || json_array_size(reqs) != (size_t)n) {
        json_decref(root);
        return wl_fail("could not build the JSON report (out of memory?)");
    }
    int rc = json_dump_file(root, path, JSON_INDENT(1)) ? -1 : 0;
    json_decref(root);
    return rc ? wl_fail("--json %s: could not write the report", path) : 0;
}

int wl_lg_report(const wl_lg_opts *o, const wl_lg_result *res, int n, const wl_lg_run *run,
                 FILE *out)
{
    summary s;
    if (summarize(res, n, run, &s))
        return -1;
    table(out, o, &s, run);
    fflush(out);
    return o->json_path ? write_json(o->json_path, o, res, n, &s, run) : 0;
}
