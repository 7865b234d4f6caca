/*
 * loadgen_server.h - a small OpenAI-style HTTP server for the load
 * generator's tests: a thread listening on 127.0.0.1 (port 0, so the
 * kernel picks a free one) and a thread per connection, keep-alive, that
 * answers GET /v1/models and POST /v1/completions and
 * /v1/chat/completions, streamed or not, with one token every delay_ms.
 *
 * It checks each request against what loadgen must send (the model, the
 * lengths in their ranges, ignore_eos, the temperature) and counts what it
 * sent, so the test compares the report with the server's own count. The
 * stream is sent the awkward ways a parser must survive: a comment first,
 * every other event with CRLF line ends, and some events cut in two
 * writes 1 ms apart. Chosen requests (by the order they came) are
 * answered 500, with a broken chunk, or never (a timeout).
 */
#ifndef LOADGEN_SERVER_H
#define LOADGEN_SERVER_H

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define TS_MAX_CONNS 64

typedef struct test_server {
    /* set before ts_start */
    int delay_ms;
    int fail_nth, broken_nth; /* the nth POST (from 1): 500, a chunk not JSON; 0: none */
    int hang;                 /* answer no POST (until stopped) */
    int models_status;        /* GET /v1/models's status (0: 200) */
    int prompt_lo, prompt_hi, out_lo, out_hi;
    const char *model;
    /* counted while it runs (atomics) */
    int posts, gets, in_flight, max_in_flight;
    long tokens; /* streamed or sent in answers that succeeded */
    int bad;     /* requests that broke the contract */
    char bad_msg[256];
    /* inside */
    int fd, port, stop, n_conns;
    pthread_t thread, conns[TS_MAX_CONNS];
    int conn_fd[TS_MAX_CONNS];
    pthread_mutex_t lock;
} test_server;

typedef struct ts_conn {
    test_server *s;
    int fd;
} ts_conn;

static inline int ts_stopped(test_server *s)
{
    return __atomic_load_n(&s->stop, __ATOMIC_ACQUIRE);
}

static inline void ts_sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) && errno == EINTR)
        ;
}

static inline void ts_bad(test_server *s, const char *what)
{
    pthread_mutex_lock(&s->lock);
    if (!s->bad++)
        snprintf(s->bad_msg, sizeof s->bad_msg, "%s", what);
    pthread_mutex_unlock(&s->lock);
}

static inline int ts_send(int fd, const void *p, size_t n)
{
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One piece of a chunked body. */
static inline int ts_chunk(int fd, const char *p, size_t n)
{
    char head[32];
    int h = snprintf(head, sizeof head, "%zx\r\n", n);
    return ts_send(fd, head, (size_t)h) || ts_send(fd, p, n) || ts_send(fd, "\r\n", 2);
}

static inline int ts_answer(int fd, int status, const char *type, const char *body)
{
    char head[256];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n\r\n", status,
                     status == 200 ? "OK" : "Error", type, strlen(body));
    return ts_send(fd, head, (size_t)h) || ts_send(fd, body, strlen(body));
}

/* Reads one request: its head into buf and its body after it. 0, or -1 at
 * the connection's end (or the server's). */
static inline int ts_read_request(test_server *s, int fd, char *buf, size_t cap, char **body,
                                  size_t *body_len)
{
    size_t n = 0, need = 0;
    char *end = NULL;
    for (;;) {
        if (end && n >= need)
            break;
        struct pollfd p = {fd, POLLIN, 0};
        if (ts_stopped(s))
            return -1;
        if (poll(&p, 1, 50) <= 0)
            continue;
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        if (r <= 0)
            return -1;
        n += (size_t)r;
        buf[n] = 0;
        if (!end && (end = strstr(buf, "\r\n\r\n"))) {
            const char *cl = strcasestr(buf, "\r\nContent-Length:");
            size_t len = cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0;
            need = (size_t)(end + 4 - buf) + len;
            if (need >= cap)
                return -1;
        }
    }
    *body = end + 4;
    *body_len = need - (size_t)(end + 4 - buf);
    return 0;
}

static inline int ts_words(const char *t)
{
    int n = 0;
    for (const char *c = t; *c; c++)
        n += *c != ' ' && (c == t || c[-1] == ' ');
    return n;
}

/* Checks a request's body; returns its stream flag, token count, prompt
 * words and whether it asked for the usage chunk. */
static inline void ts_check(test_server *s, json_t *j, int chat, int *stream, int *tokens,
                            int *words, int *usage)
{
    json_t *msg = json_array_get(json_object_get(j, "messages"), 0);
    const char *prompt = chat ? json_string_value(json_object_get(msg, "content"))
                              : json_string_value(json_object_get(j, "prompt"));
    const char *model = json_string_value(json_object_get(j, "model"));
    *stream = json_is_true(json_object_get(j, "stream"));
    *tokens = (int)json_integer_value(json_object_get(j, "max_tokens"));
    *words = prompt ? ts_words(prompt) : 0;
    *usage = json_is_true(json_object_get(json_object_get(j, "stream_options"), "include_usage"));
    if (!model || strcmp(model, s->model))
        ts_bad(s, "the wrong model");
    else if (!prompt || *words < s->prompt_lo || *words > s->prompt_hi)
        ts_bad(s, "a prompt of a length out of its range");
    else if (*tokens < s->out_lo || *tokens > s->out_hi)
        ts_bad(s, "max_tokens out of its range");
    else if (!json_is_true(json_object_get(j, "ignore_eos")))
        ts_bad(s, "no ignore_eos");
    else if (json_number_value(json_object_get(j, "temperature")) != 0)
        ts_bad(s, "a temperature other than 0");
    else if (chat && json_object_get(msg, "role") &&
             strcmp(json_string_value(json_object_get(msg, "role")), "user"))
        ts_bad(s, "a chat message not the user's");
}

/* An event of the stream: CRLF line ends for odd k, and cut in two writes
 * when k % 3 == 1 (the second part after 1 ms). */
static inline int ts_event(int fd, int k, const char *json)
{
    char ev[1024];
    const char *nl = k % 2 ? "\r\n" : "\n";
    int n = snprintf(ev, sizeof ev, "data: %s%s%s", json, nl, nl);
    if (k % 3 != 1)
        return ts_chunk(fd, ev, (size_t)n);
    int half = n / 2;
    if (ts_chunk(fd, ev, (size_t)half))
        return -1;
    ts_sleep_ms(1);
    return ts_chunk(fd, ev + half, (size_t)(n - half));
}

static inline int ts_stream(test_server *s, int fd, int chat, int n, int words, int usage,
                            int broken)
{
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n";
    char ev[512];
    if (ts_send(fd, head, strlen(head)) || ts_chunk(fd, ": keep-alive\n\n", 14))
        return -1;
    if (chat && ts_event(fd, 0,
                         "{\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                         "\"content\":\"\"}}]}"))
        return -1;
    for (int k = 0; k < n; k++) {
        ts_sleep_ms(s->delay_ms);
        if (broken && k == 2)
            return ts_chunk(fd, "data: {not json\n\n", 17) || ts_send(fd, "0\r\n\r\n", 5);
        if (chat)
            snprintf(ev, sizeof ev,
                     "{\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,"
                     "\"delta\":{\"content\":\" w%d\"},\"finish_reason\":null}]}",
                     k);
        else
            snprintf(ev, sizeof ev,
                     "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,"
                     "\"text\":\" w%d\",\"finish_reason\":null}]}",
                     k);
        if (ts_event(fd, k, ev))
            return -1;
    }
    if (usage) {
        snprintf(ev, sizeof ev,
                 "{\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,"
                 "\"total_tokens\":%d}}",
                 words, n, words + n);
        if (ts_event(fd, 1, ev))
            return -1;
    }
    if (ts_chunk(fd, "data: [DONE]\n\n", 14) || ts_send(fd, "0\r\n\r\n", 5))
        return -1;
    __atomic_add_fetch(&s->tokens, n, __ATOMIC_RELAXED);
    return 0;
}

static inline int ts_post(test_server *s, int fd, int chat, const char *body, size_t len)
{
    int nth = __atomic_add_fetch(&s->posts, 1, __ATOMIC_RELAXED), rc = 0;
    int now = __atomic_add_fetch(&s->in_flight, 1, __ATOMIC_RELAXED);
    int max = __atomic_load_n(&s->max_in_flight, __ATOMIC_RELAXED);
    while (now > max && !__atomic_compare_exchange_n(&s->max_in_flight, &max, now, 0,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    json_t *j = json_loadb(body, len, 0, NULL);
    int stream = 0, n = 0, words = 0, usage = 0;
    if (!json_is_object(j))
        ts_bad(s, "a body that is not JSON");
    else
        ts_check(s, j, chat, &stream, &n, &words, &usage);
    json_decref(j);
    if (s->hang) {
        while (!ts_stopped(s))
            ts_sleep_ms(10);
        rc = -1;
    } else if (nth == s->fail_nth) {
        rc = ts_answer(fd, 500, "application/json",
                       "{\"error\":{\"message\":\"induced failure\",\"type\":\"server_error\"}}");
    } else if (stream) {
        rc = ts_stream(s, fd, chat, n, words, usage, nth == s->broken_nth);
    } else {
        char text[4096] = "", answer[8192];
        for (int k = 0; k < n && strlen(text) < sizeof text - 16; k++)
            snprintf(text + strlen(text), sizeof text - strlen(text), " w%d", k);
        ts_sleep_ms(s->delay_ms * n);
        if (chat)
            snprintf(answer, sizeof answer,
                     "{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                     "\"content\":\"%s\"}}],",
                     text);
        else
            snprintf(answer, sizeof answer, "{\"choices\":[{\"index\":0,\"text\":\"%s\"}],", text);
        snprintf(answer + strlen(answer), sizeof answer - strlen(answer),
                 "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                 words, n, words + n);
        rc = ts_answer(fd, 200, "application/json", answer);
        if (!rc)
            __atomic_add_fetch(&s->tokens, n, __ATOMIC_RELAXED);
    }
    __atomic_sub_fetch(&s->in_flight, 1, __ATOMIC_RELAXED);
    return rc;
}

static inline void *ts_conn_main(void *arg)
{
    ts_conn c = *(ts_conn *)arg;
    test_server *s = c.s;
    char *buf = (char *)malloc(1 << 20), *body;
    size_t len;
    free(arg);
    int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* each write its own segment */
    while (buf && !ts_read_request(s, c.fd, buf, 1 << 20, &body, &len)) {
        int rc;
        if (!strncmp(buf, "GET /v1/models ", 15)) {
            __atomic_add_fetch(&s->gets, 1, __ATOMIC_RELAXED);
            int status = s->models_status ? s->models_status : 200;
            char models[256];
            snprintf(models, sizeof models,
                     status == 200 ? "{\"object\":\"list\",\"data\":[{\"id\":\"%s\"}]}"
                                   : "{\"error\":{\"message\":\"no models here\"}}",
                     s->model);
            rc = ts_answer(c.fd, status, "application/json", models);
        } else if (!strncmp(buf, "POST /v1/completions ", 21)) {
            rc = ts_post(s, c.fd, 0, body, len);
        } else if (!strncmp(buf, "POST /v1/chat/completions ", 26)) {
            rc = ts_post(s, c.fd, 1, body, len);
        } else {
            ts_bad(s, "a request to an unknown path");
            rc = ts_answer(c.fd, 404, "application/json", "{\"error\":\"not found\"}");
        }
        if (rc)
            break;
    }
    free(buf);
    return NULL;
}

static inline void *ts_main(void *arg)
{
    test_server *s = (test_server *)arg;
    while (!ts_stopped(s)) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        ts_conn *c = (ts_conn *)malloc(sizeof *c);
        if (!c || s->n_conns == TS_MAX_CONNS) {
            ts_bad(s, "too many connections for the test server");
            free(c);
            close(fd);
            continue;
        }
        *c = (ts_conn){s, fd};
        s->conn_fd[s->n_conns] = fd;
        if (pthread_create(&s->conns[s->n_conns], NULL, ts_conn_main, c)) {
            free(c);
            close(fd);
            continue;
        }
        s->n_conns++;
    }
    return NULL;
}

/* Listens on 127.0.0.1, port 0; s->port is the port given. */
static inline int ts_start(test_server *s)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    socklen_t al = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    pthread_mutex_init(&s->lock, NULL);
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s->fd < 0 || bind(s->fd, (struct sockaddr *)&a, sizeof a) || listen(s->fd, 128) ||
        getsockname(s->fd, (struct sockaddr *)&a, &al))
        return -1;
    s->port = ntohs(a.sin_port);
    return pthread_create(&s->thread, NULL, ts_main, s) ? -1 : 0;
}

static inline void ts_stop(test_server *s)
{
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    pthread_join(s->thread, NULL);
    for (int i = 0; i < s->n_conns; i++) {
        pthread_join(s->conns[i], NULL);
        close(s->conn_fd[i]);
    }
    close(s->fd);
    pthread_mutex_destroy(&s->lock);
}

#endif
