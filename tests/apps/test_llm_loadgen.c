/*
 * test_llm_loadgen.c - weft-llm's load generator: its server-sent events
 * parser (a stream cut at every byte, CRLF and lone CR line ends,
 * comments, multi-line data, [DONE] without its blank line, a line too
 * long), its quantiles, its Poisson arrivals and length draws from a
 * printed seed, its loopback check of the URL; and `weft-llm loadgen` run
 * against the small HTTP server of loadgen_server.h: counts, tokens and
 * timings against what the server sent, every failure reason, and the
 * command line's refusals.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <curl/curl.h>
#include <jansson.h>

#include "llm_test.h"
#include "loadgen.h"
#include "loadgen_server.h"

static char *dir;
static uint64_t seed;

static int setup(void **state)
{
    (void)state;
    seed = test_seed();
    dir = scratch_dir();
    return dir && !curl_global_init(CURL_GLOBAL_DEFAULT) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    remove_scratch(dir);
    free(dir);
    return 0;
}

/* ---- server-sent events ---------------------------------------------------- */

typedef struct events {
    char got[16][64];
    int n, fail_at; /* the callback fails on event fail_at (from 1; 0: never) */
} events;

static int collect(void *ctx, const char *data, size_t len)
{
    events *e = ctx;
    assert_int_equal(strlen(data), len); /* NUL-terminated at len */
    if (++e->n == e->fail_at)
        return wl_fail("the callback refused");
    assert_true(e->n <= 16);
    snprintf(e->got[e->n - 1], sizeof e->got[0], "%s", data);
    return 0;
}

/* Every line end, comments, fields other than data, data on two lines,
 * data with no space after the colon or no colon at all. */
static const char stream[] = ": opening comment\n"
                             "\n"
                             "data: {\"text\":\"a\"}\r\n"
                             "\r\n"
                             "event: chunk\n"
                             "id: 7\n"
                             "data:{\"text\":\"b\"}\r"
                             "\r"
                             "data: line one\n"
                             "data:  line two\n"
                             ": a comment inside an event\n"
                             "retry: 10\n"
                             "\n"
                             "data\n"
                             "\n"
                             "data: [DONE]\r\n"
                             "\r\n";
static const char *const want[] = {"{\"text\":\"a\"}", "{\"text\":\"b\"}", "line one\n line two",
                                   "", "[DONE]"};

static void check_events(const events *e, const char *how)
{
    if (e->n != 5)
        fail_msg("%s: %d events, not 5", how, e->n);
    for (int i = 0; i < 5; i++)
        if (strcmp(e->got[i], want[i]))
            fail_msg("%s: event %d is \"%s\", not \"%s\"", how, i, e->got[i], want[i]);
}

static void test_sse_whole_and_cut_everywhere(void **state)
{
    (void)state;
    size_t n = sizeof stream - 1;
    wl_sse p;
    events e = {0};
    wl_sse_init(&p, collect, &e);
    assert_int_equal(wl_sse_feed(&p, stream, n), 0);
    assert_int_equal(wl_sse_end(&p), 0);
    wl_sse_free(&p);
    check_events(&e, "whole");
    /* cut in two at every byte (between each CR and its LF too) */
    for (size_t cut = 0; cut <= n; cut++) {
        char how[64];
        snprintf(how, sizeof how, "cut at %zu", cut);
        memset(&e, 0, sizeof e);
        wl_sse_init(&p, collect, &e);
        assert_int_equal(wl_sse_feed(&p, stream, cut), 0);
        assert_int_equal(wl_sse_feed(&p, stream + cut, n - cut), 0);
        assert_int_equal(wl_sse_end(&p), 0);
        wl_sse_free(&p);
        check_events(&e, how);
    }
    /* a byte at a time, with empty pieces between */
    memset(&e, 0, sizeof e);
    wl_sse_init(&p, collect, &e);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(wl_sse_feed(&p, stream + i, 1), 0);
        assert_int_equal(wl_sse_feed(&p, stream, 0), 0);
    }
    assert_int_equal(wl_sse_end(&p), 0);
    wl_sse_free(&p);
    check_events(&e, "byte by byte");
}

static void test_sse_end_of_stream(void **state)
{
    (void)state;
    wl_sse p;
    events e = {0};
    /* [DONE] with no blank line, then with no line end at all */
    const char *tails[] = {"data: x\n\ndata: [DONE]\n", "data: x\n\ndata: [DONE]"};
    for (int t = 0; t < 2; t++) {
        memset(&e, 0, sizeof e);
        wl_sse_init(&p, collect, &e);
        assert_int_equal(wl_sse_feed(&p, tails[t], strlen(tails[t])), 0);
        assert_int_equal(e.n, 1); /* the last event waits for its blank line or the end */
        assert_int_equal(wl_sse_end(&p), 0);
        assert_int_equal(e.n, 2);
        assert_string_equal(e.got[1], "[DONE]");
        wl_sse_free(&p);
    }
    /* comments only, and a CR as the very last byte: no event */
    memset(&e, 0, sizeof e);
    wl_sse_init(&p, collect, &e);
    assert_int_equal(wl_sse_feed(&p, ": ping\r\n\r\n: ping\r", 17), 0);
    assert_int_equal(wl_sse_end(&p), 0);
    assert_int_equal(e.n, 0);
    wl_sse_free(&p);
}

static void test_sse_errors(void **state)
{
    (void)state;
    wl_sse p;
    events e = {.fail_at = 2};
    wl_sse_init(&p, collect, &e);
    const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    assert_int_equal(wl_sse_feed(&p, s, strlen(s)), -1);
    assert_string_equal(wl_error(), "the callback refused");
    assert_int_equal(e.n, 2); /* nothing after the refusal */
    wl_sse_free(&p);
    /* a line past the limit, fed in pieces */
    size_t piece = 1 << 20;
    char *junk = malloc(piece);
    assert_non_null(junk);
    memset(junk, 'x', piece);
    memset(&e, 0, sizeof e);
    wl_sse_init(&p, collect, &e);
    int rc = 0;
    for (size_t fed = 0; !rc && fed <= WL_SSE_MAX_LINE; fed += piece)
        rc = wl_sse_feed(&p, junk, piece);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(wl_error(), "longer than"));
    assert_int_equal(e.n, 0);
    wl_sse_free(&p);
    free(junk);
}

/* ---- statistics and draws ---------------------------------------------------- */

static void test_quantiles(void **state)
{
    (void)state;
    double v[] = {5, 1, 4, 2, 3};
    wl_lg_dist d;
    wl_lg_summarize(v, 5, &d);
    for (int i = 0; i < 5; i++)
        assert_true(v[i] == i + 1); /* sorted */
    assert_int_equal(d.n, 5);
    assert_true(d.mean == 3 && d.p50 == 3 && d.max == 5);
    assert_true(fabs(d.p90 - 4.6) < 1e-12 && fabs(d.p99 - 4.96) < 1e-12);
    assert_true(wl_lg_quantile(v, 5, 0) == 1 && wl_lg_quantile(v, 5, 1) == 5);
    assert_true(wl_lg_quantile(v, 1, 0.99) == 1);
    assert_true(isnan(wl_lg_quantile(v, 0, 0.5)));
    wl_lg_summarize(v, 0, &d);
    assert_true(d.n == 0 && isnan(d.mean) && isnan(d.p99) && isnan(d.max));
    /* 1001 distinct values: the p50 and p90 are the 501st and 901st smallest */
    enum { N = 1001 };
    double *r = malloc(N * sizeof *r);
    uint64_t st = seed;
    for (int i = 0; i < N; i++)
        r[i] = wl_rand_uniform(&st);
    double p50, p90, copy[N];
    memcpy(copy, r, sizeof copy);
    wl_lg_summarize(r, N, &d);
    p50 = d.p50;
    p90 = d.p90;
    int below50 = 0, below90 = 0;
    for (int i = 0; i < N; i++) {
        below50 += copy[i] < p50;
        below90 += copy[i] < p90;
    }
    assert_int_equal(below50, 500);
    assert_int_equal(below90, 900);
    free(r);
}

static void test_poisson_arrivals(void **state)
{
    (void)state;
    enum { N = 200001 };
    const double rate = 50;
    double *t = malloc(N * sizeof *t), *t2 = malloc(N * sizeof *t2);
    uint64_t st = seed, st2 = seed;
    wl_lg_arrivals(t, N, rate, &st);
    wl_lg_arrivals(t2, N, rate, &st2);
    assert_memory_equal(t, t2, N * sizeof *t); /* a seed names the arrivals */
    assert_true(t[0] == 0);
    double sum = 0, sq = 0;
    int longer = 0;
    for (int i = 1; i < N; i++) {
        double g = t[i] - t[i - 1];
        assert_true(g >= 0);
        sum += g;
        sq += g * g;
        longer += g > 1 / rate;
    }
    double mean = sum / (N - 1), sd = sqrt(sq / (N - 1) - mean * mean);
    double tail = (double)longer / (N - 1);
    printf("  mean gap %.6f s (1/rate %.6f), sd/mean %.4f, P(gap > mean) %.4f\n", mean, 1 / rate,
           sd / mean, tail);
    /* the mean's standard error is 0.22%, the sd's 0.3%, the tail's 0.11 points */
    assert_true(fabs(mean * rate - 1) < 0.01);
    assert_true(fabs(sd / mean - 1) < 0.02);    /* exponential: sd = mean */
    assert_true(fabs(tail - exp(-1.0)) < 0.01); /* exponential: e^-1 */
    st2 = seed + 1;
    wl_lg_arrivals(t2, 16, rate, &st2);
    assert_true(memcmp(t, t2, 16 * sizeof *t) != 0);
    wl_lg_arrivals(t, 8, INFINITY, &st);
    for (int i = 0; i < 8; i++)
        assert_true(t[i] == 0);
    free(t);
    free(t2);
}

static void test_lengths_and_prompts(void **state)
{
    (void)state;
    uint64_t st = seed;
    int seen[5] = {0};
    double sum = 0;
    enum { N = 50000 };
    for (int i = 0; i < N; i++) {
        int v = wl_lg_uniform_int(&st, 3, 7);
        assert_true(v >= 3 && v <= 7);
        seen[v - 3]++;
        sum += v;
    }
    for (int k = 0; k < 5; k++)
        assert_true(fabs(seen[k] / (double)N - 0.2) < 0.01);
    assert_true(fabs(sum / N - 5) < 0.03);
    for (int i = 0; i < 100; i++)
        assert_int_equal(wl_lg_uniform_int(&st, 9, 9), 9);
    /* a prompt of n words: n words, the same for the same state */
    for (int n = 1; n < 300; n += 37) {
        uint64_t a = seed + (uint64_t)n, b = a;
        char *p = wl_lg_prompt(&a, n), *q = wl_lg_prompt(&b, n);
        assert_int_equal(ts_words(p), n);
        assert_string_equal(p, q);
        assert_true(p[0] != ' ' && p[strlen(p) - 1] != ' ' && !strstr(p, "  "));
        free(p);
        free(q);
    }
}

/* ---- the URL ------------------------------------------------------------------ */

static void test_loopback_url(void **state)
{
    (void)state;
    const char *ok[][2] = {
        {"http://127.0.0.1:8000", "http://127.0.0.1:8000"},
        {"http://127.0.0.1:8000/", "http://127.0.0.1:8000"},
        {"http://localhost:8000/v1", "http://localhost:8000"},
        {"http://LocalHost:8000/v1/", "http://LocalHost:8000"},
        {"http://[::1]:9000", "http://[::1]:9000"},
        {"http://127.0.0.1", "http://127.0.0.1:80"},
        {"HTTP://127.0.0.1:8000/prefix/v1", "http://127.0.0.1:8000/prefix"},
    };
    char base[256];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (wl_lg_loopback_url(ok[i][0], base, sizeof base))
            fail_msg("%s refused: %s", ok[i][0], wl_error());
        assert_string_equal(base, ok[i][1]);
    }
    const char *refused[][2] = {
        {"http://example.com:8000", "loopback"},
        {"http://10.0.0.1:8000", "loopback"},
        {"http://0.0.0.0:8000", "loopback"},
        {"http://127.0.0.2:8000", "loopback"},
        {"http://[::2]:8000", "loopback"},
        {"http://localhost.example.com/", "loopback"},
        {"http://127.0.0.1@example.com/", "user name"},
        {"http://user:secret@127.0.0.1:8000", "user name"},
        {"https://127.0.0.1:8000", "only http"},
        {"ftp://127.0.0.1/", "only http"},
        {"127.0.0.1:8000", "scheme"},
        {"", "scheme"},
        {"http://", "not a URL"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        if (!wl_lg_loopback_url(refused[i][0], base, sizeof base))
            fail_msg("%s accepted as %s", refused[i][0], base);
        if (!strstr(wl_error(), refused[i][1]))
            fail_msg("%s: \"%s\" does not say \"%s\"", refused[i][0], wl_error(), refused[i][1]);
    }
    assert_int_equal(wl_lg_loopback_url("http://127.0.0.1:8000", base, 12), -1);
    assert_non_null(strstr(wl_error(), "too long"));
}

/* ---- against a server ------------------------------------------------------------ */

static void server_up(test_server *s, int delay_ms)
{
    memset(s, 0, sizeof *s);
    s->delay_ms = delay_ms;
    s->model = "test-model";
    s->prompt_lo = 1;
    s->prompt_hi = 1 << 20;
    s->out_lo = 1;
    s->out_hi = 1 << 20;
    assert_int_equal(ts_start(s), 0);
}

static void server_down(test_server *s)
{
    ts_stop(s);
    if (s->bad)
        fail_msg("the server saw %d bad requests; the first: %s", s->bad, s->bad_msg);
}

/* Runs loadgen with args against URL; its exit status, its stdout and
 * stderr (to free), and its JSON report (with --json, else NULL). */
static int loadgen(const char *url, const char *args, char **out, char **err, json_t **report)
{
    char cmd[2048], *json = path_in(dir, "report.json");
    unlink(json);
    snprintf(cmd, sizeof cmd, "%s loadgen %s %s --json %s", WL_BIN, url, args, json);
    int rc = run_capture(cmd, out, err);
    printf("$ %s\n  exit %d\n%s%s", cmd, rc, *out, *err);
    *report = json_load_file(json, 0, NULL);
    free(json);
    return rc;
}

static json_t *at(json_t *j, const char *a, const char *b)
{
    json_t *v = json_object_get(json_object_get(j, a), b);
    if (!v)
        fail_msg("the report has no %s.%s", a, b);
    return v;
}

static double num(json_t *j, const char *a, const char *b)
{
    return json_number_value(at(j, a, b));
}

/* Streamed completions at Poisson arrivals, at most 4 in flight: the 3rd
 * request answered 500, the others streamed a token every DELAY ms. */
static void test_run_streamed(void **state)
{
    (void)state;
    enum { DELAY = 15, N = 12 };
    test_server s;
    server_up(&s, DELAY);
    s.fail_nth = 3;
    s.prompt_lo = 5, s.prompt_hi = 9, s.out_lo = 3, s.out_hi = 6;
    char url[64], args[256], *out, *err;
    json_t *r;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    snprintf(args, sizeof args,
             "--requests %d --rate 200 --concurrency 4 --prompt-tokens 5-9 --output-tokens 3-6 "
             "--seed %llu",
             N, (unsigned long long)seed);
    int rc = loadgen(url, args, &out, &err, &r);
    server_down(&s);
    assert_int_equal(rc, 1); /* one request failed */
    assert_non_null(r);
    assert_non_null(strstr(out, "11 ok, 1 failed"));
    assert_int_equal(s.gets, 1); /* the model asked of /v1/models */
    assert_int_equal(s.posts, N);
    assert_true(s.max_in_flight <= 4);
    assert_int_equal(num(r, "summary", "ok"), N - 1);
    assert_int_equal(num(r, "summary", "failed"), 1);
    json_t *by = at(r, "summary", "failed_by_reason");
    assert_int_equal(json_integer_value(json_object_get(by, "http")), 1);
    assert_string_equal(json_string_value(at(r, "config", "model")), "test-model");
    /* the server's count of tokens is the report's */
    assert_int_equal(num(r, "summary", "output_tokens"), s.tokens);
    /* arrivals: the seed's, and none sent before its time */
    double arrive[N];
    uint64_t st = seed;
    wl_lg_arrivals(arrive, N, 200, &st);
    json_t *reqs = json_object_get(r, "requests");
    assert_int_equal(json_array_size(reqs), N);
    long itls = 0;
    for (int i = 0; i < N; i++) {
        json_t *q = json_array_get(reqs, (size_t)i);
        int max = (int)json_integer_value(json_object_get(q, "max_tokens"));
        int words = (int)json_integer_value(json_object_get(q, "prompt_words"));
        double ttft = json_number_value(json_object_get(q, "ttft_s"));
        double e2e = json_number_value(json_object_get(q, "e2e_s"));
        assert_true(json_number_value(json_object_get(q, "scheduled_s")) == arrive[i]);
        assert_true(json_number_value(json_object_get(q, "sent_s")) >= arrive[i]);
        assert_true(max >= 3 && max <= 6 && words >= 5 && words <= 9);
        if (strcmp(json_string_value(json_object_get(q, "reason")), "ok")) {
            assert_string_equal(json_string_value(json_object_get(q, "reason")), "http");
            assert_int_equal(json_integer_value(json_object_get(q, "http_status")), 500);
            assert_non_null(strstr(json_string_value(json_object_get(q, "error")),
                                   "HTTP 500: induced failure"));
            continue;
        }
        /* ignore_eos: exactly max_tokens, one chunk each; the server
         * counted the prompt's words as its tokens */
        assert_int_equal(json_integer_value(json_object_get(q, "completion_tokens")), max);
        assert_int_equal(json_integer_value(json_object_get(q, "chunks")), max);
        assert_int_equal(json_integer_value(json_object_get(q, "prompt_tokens")), words);
        /* the server sleeps DELAY ms before each token: the first comes
         * DELAY ms after the request at the earliest, the last max DELAY */
        assert_true(ttft >= DELAY * 1e-3);
        assert_true(e2e >= max * DELAY * 1e-3 && e2e >= ttft);
        itls += max - 1;
    }
    assert_int_equal(json_integer_value(json_object_get(at(r, "summary", "ttft_s"), "n")), N - 1);
    json_t *itl = at(r, "summary", "itl_s");
    assert_int_equal(json_integer_value(json_object_get(itl, "n")), itls);
    double p50 = json_number_value(json_object_get(itl, "p50"));
    /* a gap is DELAY ms (1 more for an event cut in two); half of it
     * leaves room for a chunk read late and the next on time */
    assert_true(p50 >= 0.5 * DELAY * 1e-3 && p50 < 1.0);
    assert_true(num(r, "summary", "achieved_rate") > 0);
    assert_true(num(r, "summary", "output_tokens_per_s") > 0);
    assert_true(json_is_object(at(r, "summary", "loadgen_cpu_s")));
    json_decref(r);
    free(out);
    free(err);
}

/* Chat, streamed and not; completions not streamed: every request ok,
 * tokens from usage; no TTFT without a stream. */
static void test_run_chat_and_not_streamed(void **state)
{
    (void)state;
    const char *modes[] = {"--endpoint chat", "--endpoint chat --no-stream", "--no-stream"};
    for (int m = 0; m < 3; m++) {
        test_server s;
        server_up(&s, 5);
        char url[64], args[256], *out, *err;
        json_t *r;
        snprintf(url, sizeof url, "http://localhost:%d/v1", s.port);
        snprintf(args, sizeof args, "--requests 5 --model test-model --output-tokens 4 %s",
                 modes[m]);
        int rc = loadgen(url, args, &out, &err, &r);
        server_down(&s);
        assert_int_equal(rc, 0);
        assert_int_equal(s.gets, 0); /* --model given */
        assert_int_equal(s.posts, 5);
        assert_int_equal(num(r, "summary", "ok"), 5);
        assert_int_equal(num(r, "summary", "output_tokens"), 20);
        assert_int_equal(s.tokens, 20);
        json_t *ttft = at(r, "summary", "ttft_s");
        assert_int_equal(json_integer_value(json_object_get(ttft, "n")), m == 0 ? 5 : 0);
        if (m == 0)
            assert_true(json_number_value(json_object_get(ttft, "p50")) >= 5e-3);
        else
            assert_true(json_is_null(json_object_get(ttft, "p50")));
        json_decref(r);
        free(out);
        free(err);
    }
}

/* A chunk that is not JSON, a server that never answers, a port nobody
 * listens on, a server without /v1/models. */
static void test_run_failures(void **state)
{
    (void)state;
    test_server s;
    char url[64], *out, *err;
    json_t *r;
    server_up(&s, 2);
    s.broken_nth = 1;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    assert_int_equal(loadgen(url, "--requests 2 --concurrency 1 --output-tokens 5", &out, &err, &r),
                     1);
    server_down(&s);
    assert_int_equal(num(r, "summary", "ok"), 1);
    json_t *q = json_array_get(json_object_get(r, "requests"), 0);
    assert_string_equal(json_string_value(json_object_get(q, "reason")), "malformed");
    assert_non_null(strstr(json_string_value(json_object_get(q, "error")), "not a JSON object"));
    json_decref(r);
    free(out);
    free(err);

    server_up(&s, 2);
    s.hang = 1;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    assert_int_equal(loadgen(url, "--requests 2 --timeout 0.3 --model test-model", &out, &err, &r),
                     1);
    server_down(&s);
    assert_int_equal(
        json_integer_value(json_object_get(at(r, "summary", "failed_by_reason"), "timeout")), 2);
    json_decref(r);
    free(out);
    free(err);

    /* a port just freed: connection refused */
    server_up(&s, 2);
    int port = s.port;
    server_down(&s);
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    assert_int_equal(loadgen(url, "--requests 3 --model m", &out, &err, &r), 1);
    assert_int_equal(
        json_integer_value(json_object_get(at(r, "summary", "failed_by_reason"), "connect")), 3);
    assert_non_null(strstr(out, "connect"));
    json_decref(r);
    free(out);
    free(err);
    /* no model given and none to ask for */
    assert_int_equal(loadgen(url, "--requests 3", &out, &err, &r), 1);
    assert_non_null(strstr(err, "/v1/models"));
    assert_non_null(strstr(err, "--model"));
    assert_null(r);
    free(out);
    free(err);
    server_up(&s, 2);
    s.models_status = 404;
    snprintf(url, sizeof url, "http://127.0.0.1:%d", s.port);
    assert_int_equal(loadgen(url, "--requests 3", &out, &err, &r), 1);
    server_down(&s);
    assert_non_null(strstr(err, "HTTP 404: no models here"));
    assert_int_equal(s.posts, 0);
    free(out);
    free(err);
}

/* The command line's refusals: exit status 2, saying why. */
static void test_cli_refusals(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"http://192.168.1.1:8000", "loopback"},
        {"http://example.com/", "loopback"},
        {"https://localhost:8000", "only http"},
        {"http://127.0.0.1:1 --rate 0", "--rate"},
        {"http://127.0.0.1:1 --rate fast", "--rate"},
        {"http://127.0.0.1:1 --requests 0", "--requests"},
        {"http://127.0.0.1:1 --prompt-tokens 9-3", "--prompt-tokens"},
        {"http://127.0.0.1:1 --output-tokens 0", "--output-tokens"},
        {"http://127.0.0.1:1 --endpoint embeddings", "--endpoint"},
        {"http://127.0.0.1:1 --timeout", "--timeout"},
        {"http://127.0.0.1:1 --frobnicate 1", "unknown option"},
        {"http://127.0.0.1:1 http://127.0.0.1:2", "one URL"},
        {"--rate 1", "URL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512], *out, *err;
        snprintf(cmd, sizeof cmd, "%s loadgen %s", WL_BIN, cases[i][0]);
        int rc = run_capture(cmd, &out, &err);
        if (rc != 2 || !strstr(err, cases[i][1]))
            fail_msg("%s: exit %d, \"%s\" (want 2 and \"%s\")", cmd, rc, err, cases[i][1]);
        free(out);
        free(err);
    }
    char cmd[512], *out, *err;
    snprintf(cmd, sizeof cmd, "%s loadgen --help", WL_BIN);
    assert_int_equal(run_capture(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "one word"));
    free(out);
    free(err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sse_whole_and_cut_everywhere),
        cmocka_unit_test(test_sse_end_of_stream),
        cmocka_unit_test(test_sse_errors),
        cmocka_unit_test(test_quantiles),
        cmocka_unit_test(test_poisson_arrivals),
        cmocka_unit_test(test_lengths_and_prompts),
        cmocka_unit_test(test_loopback_url),
        cmocka_unit_test(test_run_streamed),
        cmocka_unit_test(test_run_chat_and_not_streamed),
        cmocka_unit_test(test_run_failures),
        cmocka_unit_test(test_cli_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
