/*
 * loadgen_client.c - one request of the load generator on curl: its body,
 * its transfer's options, the callbacks that timestamp and parse what
 * arrives, and its result; and the GET /v1/models that names the model.
 *
 * Each byte of a response is timestamped when curl hands it over (one
 * clock read per write callback), and every event parsed out of those
 * bytes carries that time: chunks that came in one read arrived together.
 *
 * Only loopback: besides the URL's check (loadgen_parse.c), every socket
 * curl opens is checked to be to a loopback address before it is made,
 * proxies are off and redirects are not followed, so no request can leave
 * the machine.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "llm.h"
#include "loadgen.h"

/* A response body kept whole: a response not streamed, or an error's
 * (whose first ERROR_BODY bytes are enough for its message). */
#define MAX_BODY ((size_t)64 << 20)
#define ERROR_BODY ((size_t)64 << 10)

/* One request in flight. */
typedef struct lg_req {
    wl_lg_client *g;
    wl_lg_result *res;
    CURL *easy;
    char *body;
    wl_sse sse;
    wl_buf kept;       /* the body kept whole (see MAX_BODY) */
    int want_stream;   /* a request with "stream": true */
    int got_body;      /* the first bytes of the body came */
    int streaming;     /* a 200 event stream: the bytes go to the parser */
    int done;          /* data: [DONE] came */
    int off_machine;   /* an address off this machine was refused */
    wl_lg_reason fail; /* set by a callback that stopped the transfer */
    char *fail_msg;
    double t_byte, t_chunk; /* the last bytes' arrival; the last chunk with text's */
    char errbuf[CURL_ERROR_SIZE];
} lg_req;

double wl_lg_now(const wl_lg_client *g)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - g->t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - g->t0.tv_nsec);
}

/* Stops the request for reason r (the first reason given stands). */
static int stop(lg_req *q, wl_lg_reason r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int stop(lg_req *q, wl_lg_reason r, const char *fmt, ...)
{
    if (q->fail)
        return -1;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&q->fail_msg, fmt, ap) < 0)
        q->fail_msg = NULL;
    va_end(ap);
    q->fail = r;
    return -1;
}

/* The message of an error body: OpenAI's {"error": {"message": ...}},
 * {"error": "..."}, {"message": ...} or {"detail": ...}, else the text. */
static void error_message(const char *body, size_t len, char *out, size_t cap)
{
    json_t *j = json_loadb(body, len, 0, NULL), *e = json_object_get(j, "error");
    const char *m = NULL;
    if (json_is_object(e))
        m = json_string_value(json_object_get(e, "message"));
    else if (json_is_string(e))
        m = json_string_value(e);
    if (!m)
        m = json_string_value(json_object_get(j, "message"));
    if (!m)
        m = json_string_value(json_object_get(j, "detail"));
    if (m) {
        snprintf(out, cap, "%s", m);
    } else {
        size_t n = len < cap - 1 ? len : cap - 1;
        memcpy(out, body, n);
        out[n] = 0;
    }
    for (char *c = out; *c; c++)
        if (*c == '\n' || *c == '\r')
            *c = ' '; /* one line */
    json_decref(j);
}

/* The text of choices[0]: "text" (completions), "delta"."content" (a chat
 * chunk) or "message"."content" (a chat response); NULL when absent. */
static const char *choice_text(json_t *j, int chat, int stream)
{
    json_t *c = json_array_get(json_object_get(j, "choices"), 0);
    if (chat)
        c = json_object_get(c, stream ? "delta" : "message");
    return json_string_value(json_object_get(c, chat ? "content" : "text"));
}

static void take_usage(wl_lg_result *r, json_t *j)
{
    json_t *u = json_object_get(j, "usage");
    json_t *c = json_object_get(u, "completion_tokens"), *p = json_object_get(u, "prompt_tokens");
    if (json_is_integer(c) && json_integer_value(c) >= 0 && json_integer_value(c) <= INT32_MAX)
        r->completion_tokens = (int)json_integer_value(c);
    if (json_is_integer(p) && json_integer_value(p) >= 0 && json_integer_value(p) <= INT32_MAX)
        r->prompt_tokens = (int)json_integer_value(p);
}

static int push_itl(wl_lg_result *r, double gap)
{
    if (r->n_itl == r->itl_cap) {
        size_t cap = r->itl_cap ? 2 * r->itl_cap : 64;
        double *v = realloc(r->itl, cap * sizeof *v);
        if (!v)
            return -1;
        r->itl = v;
        r->itl_cap = cap;
    }
    r->itl[r->n_itl++] = gap;
    return 0;
}

/* One event of a stream: a chunk, an error, or [DONE]. */
static int on_event(void *arg, const char *data, size_t len)
{
    lg_req *q = arg;
    wl_lg_result *r = q->res;
    if (q->done)
        return stop(q, WL_LG_MALFORMED, "malformed SSE: data after [DONE]");
    if (!strcmp(data, "[DONE]")) {
        q->done = 1;
        return 0;
    }
    json_error_t je;
    /* generated text may hold any byte, NUL too (\u0000) */
    json_t *j = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        return stop(q, WL_LG_MALFORMED,
                    "malformed SSE: a data chunk is not a JSON object (%s): %.80s",
                    j ? "another JSON value" : je.text, data);
    }
    json_t *e = json_object_get(j, "error");
    if (e) {
        char *s = json_dumps(j, JSON_COMPACT), msg[512];
        error_message(s ? s : "", s ? strlen(s) : 0, msg, sizeof msg);
        free(s);
        json_decref(j);
        return stop(q, WL_LG_SERVER, "an error in the stream: %s", msg);
    }
    take_usage(r, j);
    const char *text = choice_text(j, q->g->chat, 1);
    if (text && *text) {
        if (!r->chunks)
            r->ttft = q->t_byte - r->sent;
        else if (push_itl(r, q->t_byte - q->t_chunk)) {
            json_decref(j);
            return stop(q, WL_LG_TRANSPORT, "out of memory");
        }
        q->t_chunk = q->t_byte;
        r->chunks++;
    }
    json_decref(j);
    return 0;
}

static size_t on_write(char *p, size_t size, size_t nmemb, void *arg)
{
    lg_req *q = arg;
    size_t n = size * nmemb;
    if (!n)
        return 0;
    q->t_byte = wl_lg_now(q->g);
    if (!q->got_body) {
        long status = 0;
        char *type = NULL;
        q->got_body = 1;
        curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_getinfo(q->easy, CURLINFO_CONTENT_TYPE, &type);
        if (status == 200 && q->want_stream) {
            if (!type || strncasecmp(type, "text/event-stream", 17)) {
                stop(q, WL_LG_MALFORMED, "asked for a stream, the response's Content-Type is %s",
                     type ? type : "missing");
                return 0;
            }
            q->streaming = 1;
        }
    }
    if (q->streaming) {
        if (wl_sse_feed(&q->sse, p, n)) {
            stop(q, WL_LG_MALFORMED, "%s", wl_error()); /* unless the event said why */
            return 0;
        }
        return n;
    }
    long status = 0;
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &status);
    size_t limit = status == 200 ? MAX_BODY : ERROR_BODY;
    if (q->kept.len + n > limit) {
        if (status != 200)
            return n; /* the message is in the first bytes; the rest is dropped */
        stop(q, WL_LG_MALFORMED, "a response longer than %zu bytes", MAX_BODY);
        return 0;
    }
    wl_buf_append(&q->kept, p, n);
    if (q->kept.failed) {
        stop(q, WL_LG_TRANSPORT, "out of memory");
        return 0;
    }
    return n;
}

/* Every socket curl opens: only to a loopback address. */
static int loopback_addr(const struct sockaddr *a)
{
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(v6) || (IN6_IS_ADDR_V4MAPPED(v6) && v6->s6_addr[12] == 127);
    }
    return 0;
}

static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
    lg_req *q = arg;
    if (purpose != CURLSOCKTYPE_IPCXN || !loopback_addr(&a->addr)) {
        if (q)
            q->off_machine = 1; /* said if no other address of the host connects */
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype, a->protocol);
}

/* The options every transfer of the run shares. */
static void common_opts(CURL *e, const wl_lg_client *g, lg_req *q, char *errbuf)
{
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROXY, ""); /* never through a proxy from the environment */
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
#endif
    curl_easy_setopt(e, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(e, CURLOPT_OPENSOCKETDATA, q);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)(g->o.timeout * 1000));
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    errbuf[0] = 0;
}

/* ---- the model --------------------------------------------------------------- */

int wl_lg_ask_model(wl_lg_client *g, char **model)
{
    lg_req q = {.g = g};
    char url[1200], err[CURL_ERROR_SIZE];
    snprintf(url, sizeof url, "%s/v1/models", g->base);
    q.easy = curl_easy_init();
    if (!q.easy)
        return wl_fail("could not make a curl handle");
    common_opts(q.easy, g, NULL, err);
    curl_easy_setopt(q.easy, CURLOPT_URL, url);
    curl_easy_setopt(q.easy, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(q.easy, CURLOPT_WRITEDATA, &q);
    CURLcode c = curl_easy_perform(q.easy);
    long status = 0;
    curl_easy_getinfo(q.easy, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(q.easy);
    int rc = -1;
    json_t *j = NULL;
    if (c) {
        wl_fail("GET %s: %s; is the server up? (or give --model NAME)", url,
                err[0] ? err : curl_easy_strerror(c));
    } else if (status != 200) {
        char msg[256];
        error_message(q.kept.data ? q.kept.data : "", q.kept.len, msg, sizeof msg);
        wl_fail("GET %s: HTTP %ld: %s (give --model NAME)", url, status, msg);
    } else {
        j = json_loadb(q.kept.data ? q.kept.data : "", q.kept.len, 0, NULL);
        const char *id =
            json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
        if (!id || !*id)
            wl_fail("GET %s: no model id in the answer (data[0].id); give --model NAME", url);
        else if (!(*model = strdup(id)))
            wl_fail("out of memory");
        else
            rc = 0;
    }
    json_decref(j);
    wl_buf_free(&q.kept);
    free(q.fail_msg);
    return rc;
}

/* ---- requests ---------------------------------------------------------------- */

static char *request_body(const wl_lg_client *g, const char *prompt, int max_tokens)
{
    json_t *b = json_object();
    if (!b)
        return NULL;
    json_object_set_new(b, "model", json_string(g->o.model));
    if (g->chat) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("user"));
        json_object_set_new(m, "content", json_string(prompt));
        json_t *msgs = json_array();
        json_array_append_new(msgs, m);
        json_object_set_new(b, "messages", msgs);
    } else {
        json_object_set_new(b, "prompt", json_string(prompt));
    }
    json_object_set_new(b, "max_tokens", json_integer(max_tokens));
    json_object_set_new(b, "temperature", json_real(g->o.temperature));
    json_object_set_new(b, "stream", json_boolean(g->o.stream));
    json_object_set_new(b, "ignore_eos", json_true()); /* outputs of the asked length */
    if (g->o.stream) {
        json_t *so = json_object(); /* the usage in the stream's last chunk */
        json_object_set_new(so, "include_usage", json_true());
        json_object_set_new(b, "stream_options", so);
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void free_req(CURLM *m, lg_req *q)
{
    if (q->easy) {
        curl_multi_remove_handle(m, q->easy);
        curl_easy_cleanup(q->easy);
    }
    wl_sse_free(&q->sse);
    free(q->body);
    wl_buf_free(&q->kept);
    free(q->fail_msg);
    free(q);
}

static void set_error(wl_lg_result *r, wl_lg_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(wl_lg_result *r, wl_lg_reason reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&r->error, fmt, ap) < 0)
        r->error = NULL;
    va_end(ap);
    r->reason = reason;
}

int wl_lg_start(wl_lg_client *g, CURLM *m, int i)
{
    wl_lg_result *r = &g->res[i];
    uint64_t words = g->o.seed * 0x2545f4914f6cdd1dull + 0x9e37 + (uint64_t)i;
    lg_req *q = calloc(1, sizeof *q);
    char *prompt = q ? wl_lg_prompt(&words, r->prompt_words) : NULL;
    if (q) {
        q->g = g;
        q->res = r;
        q->want_stream = g->o.stream;
        wl_sse_init(&q->sse, on_event, q);
        q->body = prompt ? request_body(g, prompt, r->max_tokens) : NULL;
        q->easy = curl_easy_init();
    }
    free(prompt);
    r->sent = wl_lg_now(g);
    if (!q || !q->body || !q->easy) {
        set_error(r, WL_LG_TRANSPORT, "could not make the request (out of memory)");
        if (q)
            free_req(m, q);
        return -1;
    }
    CURL *e = q->easy;
    common_opts(e, g, q, q->errbuf);
    curl_easy_setopt(e, CURLOPT_URL, g->url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, g->headers);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, q->body);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, q);
    curl_easy_setopt(e, CURLOPT_PRIVATE, q);
    if (curl_multi_add_handle(m, e) != CURLM_OK) {
        set_error(r, WL_LG_TRANSPORT, "curl would not take the request");
        curl_easy_cleanup(e);
        q->easy = NULL;
        free_req(m, q);
        return -1;
    }
    return 0;
}

/* A response not streamed: its text and usage. */
static void take_response(lg_req *q)
{
    wl_lg_result *r = q->res;
    json_error_t je;
    json_t *j = json_loadb(q->kept.data ? q->kept.data : "", q->kept.len, JSON_ALLOW_NUL, &je);
    if (!json_is_object(j))
        set_error(r, WL_LG_MALFORMED, "the response is not a JSON object (%s)",
                  j ? "another JSON value" : je.text);
    else if (!choice_text(j, q->g->chat, 0))
        set_error(r, WL_LG_MALFORMED, "the response has no choices[0].%s",
                  q->g->chat ? "message.content" : "text");
    else
        take_usage(r, j);
    json_decref(j);
}

static void finish(lg_req *q, CURLcode c)
{
    wl_lg_result *r = q->res;
    double end = wl_lg_now(q->g);
    curl_easy_getinfo(q->easy, CURLINFO_RESPONSE_CODE, &r->http_status);
    r->e2e = (q->got_body && !q->fail && !c ? q->t_byte : end) - r->sent;
    const char *why = q->errbuf[0] ? q->errbuf : curl_easy_strerror(c);
    if (q->fail) {
        set_error(r, q->fail, "%s", q->fail_msg ? q->fail_msg : "stopped");
    } else if (c == CURLE_OPERATION_TIMEDOUT) {
        set_error(r, WL_LG_TIMEOUT, "no complete answer in %g s (%s)", q->g->o.timeout, why);
    } else if (c == CURLE_COULDNT_CONNECT || c == CURLE_COULDNT_RESOLVE_HOST) {
        set_error(r, WL_LG_CONNECT, "%s",
                  q->off_machine ? "refused to connect to an address off this machine" : why);
    } else if (c) {
        set_error(r, WL_LG_TRANSPORT, "%s", why);
    } else if (r->http_status != 200) {
        char msg[512];
        error_message(q->kept.data ? q->kept.data : "", q->kept.len, msg, sizeof msg);
        set_error(r, WL_LG_HTTP, "HTTP %ld: %s", r->http_status, msg[0] ? msg : "(no body)");
    } else if (!q->want_stream) {
        take_response(q);
    } else if (!q->streaming) {
        set_error(r, WL_LG_MALFORMED, "asked for a stream, the response has no body");
    } else if (wl_sse_end(&q->sse) || q->fail) {
        set_error(r, q->fail ? q->fail : WL_LG_MALFORMED, "%s",
                  q->fail_msg ? q->fail_msg : wl_error());
    } else if (!q->done) {
        set_error(r, WL_LG_MALFORMED, "malformed SSE: the stream ended without data: [DONE]");
    }
    if (r->reason == WL_LG_OK && q->want_stream && r->completion_tokens < 0)
        r->completion_tokens = r->chunks;
}

void wl_lg_finish(CURLM *m, CURL *easy, CURLcode c)
{
    char *priv;
    curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
    lg_req *q = (lg_req *)priv;
    finish(q, c);
    free_req(m, q);
}
