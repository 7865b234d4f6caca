/*
 * serve.c - `weft-llm serve`: OpenAI's completion API over HTTP/1.1, each
 * request a weft task on the engine (engine.c).
 *
 * GNU libmicrohttpd runs the sockets on one thread of its own (epoll). Its
 * access handler only routes and checks a request's JSON; a completion is
 * handed to a weft task (request.c), which tokenizes the prompt, runs
 * its choices through the engine (one task each; a choice is one sequence
 * of the batcher) and writes what the client is to receive into the
 * request's buffer. The connection is suspended (MHD_suspend_connection)
 * whenever it has nothing to send and resumed by the task that adds
 * something, so no thread waits on a slow generation or a slow client.
 *
 * A request is shared by its connection, its stream's response and its
 * task, each holding a reference; its lock orders the handoffs. The
 * connection is suspended and resumed only under that lock, so a resume
 * always follows its suspend. A client that goes away is seen by
 * libmicrohttpd when a write fails (the completion callback), or, while
 * its connection is suspended, by the task's poll of the socket between
 * steps; the generation is then cancelled and its KV pages go back.
 *
 * A request's "speculate" extension decodes it speculatively (alone, the
 * batch-1 latency path), with the draft model of --draft when the server
 * has one and the request gives no "ngram", else with n-grams.
 *
 * SIGTERM or SIGINT drains: the listening socket closes, requests already
 * in flight finish (new ones on open connections get 503) until
 * --drain-seconds, then the rest are cancelled; the server exits 0.
 *
 * --pipeline 1, run as every rank of an MPI job, splits the model's layers
 * into a stage a rank (as `generate --pipeline` does): rank 0 serves and
 * runs the engine, the other ranks serve its steps (wl_engine_follow) and
 * leave when its engine stops; they keep SIGTERM and SIGINT blocked, so
 * the job drains through rank 0.
 *
 * --tensor-parallel N splits every layer over N GPUs of this process, as
 * `generate --tensor-parallel` does; speculative requests are then
 * refused (400), and --draft and --swap-mb with it.
 */
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve_impl.h"

/* One HTTP request's state on its connection (libmicrohttpd's con_cls). */
typedef struct conn_state {
    int endpoint;
    wl_buf body;
    int too_big;
    uint64_t started_ns;
    request *req;
} conn_state;

/* ---- HTTP ------------------------------------------------------------------------ */

static enum MHD_Result send_body(struct MHD_Connection *conn, int status, const char *type,
                                 char *body)
{
    if (!body)
        return MHD_NO; /* out of memory: close the connection */
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result send_error(server *srv, struct MHD_Connection *conn, conn_state *cs,
                                  int status, const char *message, const char *param)
{
    const char *type = status == 404   ? "not_found_error"
                       : status == 503 ? "service_unavailable"
                                       : "invalid_request_error";
    wl_metrics_request(&srv->metrics, cs->endpoint, status);
    return send_body(conn, status, "application/json", wl_oai_error_body(message, type, param));
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    request *r = cls;
    (void)pos;
    pthread_mutex_lock(&r->lock);
    ssize_t n;
    if (r->sent < r->out.len) {
        size_t k = r->out.len - r->sent < max ? r->out.len - r->sent : max;
        memcpy(buf, r->out.data + r->sent, k);
        r->sent += k;
        if (r->sent == r->out.len)
            r->sent = r->out.len = 0; /* all sent: the buffer starts over */
        n = (ssize_t)k;
    } else if (r->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        r->suspended = 1;
        MHD_suspend_connection(r->conn);
        n = 0;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

static void stream_released(void *cls)
{
    wl_request_unref(cls);
}

/* The handler's turn on a completion whose task is running: wait
 * (suspended), send the whole answer, or start the stream. */
static enum MHD_Result continue_completion(struct MHD_Connection *conn, conn_state *cs)
{
    request *r = cs->req;
    pthread_mutex_lock(&r->lock);
    if (r->phase == PENDING) {
        r->suspended = 1;
        MHD_suspend_connection(conn);
        pthread_mutex_unlock(&r->lock);
        return MHD_YES;
    }
    if (r->phase == ANSWER) {
        char *body = r->answer;
        int status = r->status;
        r->answer = NULL;
        pthread_mutex_unlock(&r->lock);
        return send_body(conn, status, "application/json", body);
    }
    pthread_mutex_unlock(&r->lock);
    __atomic_add_fetch(&r->refs, 1, __ATOMIC_RELAXED); /* the response's */
    struct MHD_Response *resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 16384, stream_reader, r, stream_released);
    if (!resp) {
        wl_request_unref(r);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result start_completion(server *srv, struct MHD_Connection *conn, conn_state *cs)
{
    json_error_t je;
    json_t *body = json_loadb(cs->body.data ? cs->body.data : "", cs->body.len, 0, &je);
    if (!body) {
        char msg[400];
        snprintf(msg, sizeof msg, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                 je.line, je.column);
        return send_error(srv, conn, cs, 400, msg, NULL);
    }
    request *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(body);
        return MHD_NO;
    }
    int status;
    const char *param;
    int rc = wl_oai_parse(body, cs->endpoint == WL_EP_CHAT, srv->name, &r->q, &status, &param);
    json_decref(body);
    if (!rc && r->q.chat && !srv->chat) {
        rc = wl_fail("this model has no chat template (tokenizer_config.json)");
        status = 400;
        param = "messages";
        wl_oai_request_free(&r->q);
    }
    if (rc) {
        free(r);
        return send_error(srv, conn, cs, status, wl_error(), param);
    }
    r->srv = srv;
    r->endpoint = cs->endpoint;
    r->refs = 2; /* the connection's and the task's */
    r->conn = conn;
    r->created = (long)time(NULL);
    r->arrived_ns = weft_now_ns();
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_lock(&srv->lock);
    uint64_t serial = ++srv->next_id;
    r->next = srv->live;
    if (srv->live)
        srv->live->prev = r;
    srv->live = r;
    srv->in_flight++;
    pthread_mutex_unlock(&srv->lock);
    snprintf(r->id, sizeof r->id, "%s-%016llx%08llx", r->q.chat ? "chatcmpl" : "cmpl",
             (unsigned long long)r->arrived_ns, (unsigned long long)serial);
    if (!r->q.seeded) /* no seed: a different draw each request */
        r->q.sampler.state = r->arrived_ns * 0x9e3779b97f4a7c15ull ^ serial;
    cs->req = r;
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "request";
    opts.priority = r->q.priority; /* a priority class is a weft task priority */
    opts.device = srv->engine.device;
    if (weft_spawn(srv->rt, NULL, wl_request_task, r, &opts) != WEFT_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "could not start the request's task: %s", weft_last_error());
        wl_request_answer_error(r, 500, msg, NULL);
        wl_metrics_request(&srv->metrics, r->endpoint, 500);
        wl_request_unref(r); /* the task's reference */
    }
    return continue_completion(conn, cs);
}

static int endpoint_of(const char *url)
{
    for (int i = 0; i < WL_EP_OTHER; i++)
        if (!strcmp(url, wl_endpoint_names[i]))
            return i;
    return WL_EP_OTHER;
}

static char *models_body(server *srv)
{
    json_t *j = json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data", "id",
                          srv->name, "object", "model", "created", (json_int_t)time(NULL),
                          "owned_by", "weft", "max_model_len", srv->engine.max_tokens);
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    server *srv = cls;
    conn_state *cs = *con_cls;
    (void)version;
    if (!cs) { /* the headers are in */
        cs = calloc(1, sizeof *cs);
        if (!cs)
            return MHD_NO;
        *con_cls = cs;
        cs->endpoint = endpoint_of(url);
        cs->started_ns = weft_now_ns();
        const char *length =
            MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (length && strtoull(length, NULL, 10) > srv->max_body) {
            char msg[160];
            snprintf(msg, sizeof msg, "the body is %s bytes; this server takes at most %zu", length,
                     srv->max_body);
            return send_error(srv, conn, cs, 413, msg, NULL);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (weft_now_ns() - cs->started_ns > (uint64_t)srv->body_timeout * 1000000000ull)
            return MHD_NO; /* a body trickling in too slowly: the connection closes */
        if (!cs->too_big && cs->body.len + *upload_size > srv->max_body) {
            cs->too_big = 1; /* the rest is read and dropped; 413 at the end */
            wl_buf_free(&cs->body);
        }
        if (!cs->too_big)
            wl_buf_append(&cs->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (cs->req)
        return continue_completion(conn, cs);
    if (cs->too_big || cs->body.failed) {
        char msg[160];
        snprintf(msg, sizeof msg, "the body is over %zu bytes, this server's limit", srv->max_body);
        return send_error(srv, conn, cs, 413, msg, NULL);
    }
    int get = !strcmp(method, MHD_HTTP_METHOD_GET), post = !strcmp(method, MHD_HTTP_METHOD_POST);
    int draining = __atomic_load_n(&srv->draining, __ATOMIC_ACQUIRE);
    switch (cs->endpoint) {
    case WL_EP_HEALTH:
        if (!get)
            break;
        wl_metrics_request(&srv->metrics, cs->endpoint, draining ? 503 : 200);
        return send_body(conn, draining ? 503 : 200, "application/json",
                         strdup(draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}"));
    case WL_EP_METRICS: {
        if (!get)
            break;
        wl_engine_counts counts;
        wl_buf text = {0};
        wl_engine_stats(&srv->engine, &counts);
        pthread_mutex_lock(&srv->lock);
        int in_flight = srv->in_flight;
        pthread_mutex_unlock(&srv->lock);
        wl_metrics_request(&srv->metrics, cs->endpoint, 200);
        wl_metrics_write(&srv->metrics, &counts, in_flight, &text);
        if (text.failed) {
            wl_buf_free(&text);
            return MHD_NO;
        }
        return send_body(conn, 200, "text/plain; version=0.0.4", text.data);
    }
    case WL_EP_MODELS:
        if (!get)
            break;
        wl_metrics_request(&srv->metrics, cs->endpoint, 200);
        return send_body(conn, 200, "application/json", models_body(srv));
    case WL_EP_COMPLETIONS:
    case WL_EP_CHAT:
        if (!post)
            break;
        if (draining)
            return send_error(srv, conn, cs, 503, "the server is shutting down", NULL);
        return start_completion(srv, conn, cs);
    default: {
        char msg[300];
        snprintf(msg, sizeof msg, "no such endpoint: %s %.200s", method, url);
        return send_error(srv, conn, cs, 404, msg, NULL);
    }
    }
    char msg[300];
    snprintf(msg, sizeof msg, "%s takes %s, not %s", url,
             cs->endpoint == WL_EP_COMPLETIONS || cs->endpoint == WL_EP_CHAT ? "POST" : "GET",
             method);
    return send_error(srv, conn, cs, 405, msg, NULL);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    conn_state *cs = *con_cls;
    (void)cls;
    (void)conn;
    if (!cs)
        return;
    request *r = cs->req;
    if (r) {
        pthread_mutex_lock(&r->lock);
        r->conn = NULL;
        r->suspended = 0;
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            r->gone = 1; /* its generation stops at its next token */
        pthread_mutex_unlock(&r->lock);
        wl_request_unref(r);
    }
    wl_buf_free(&cs->body);
    free(cs);
    *con_cls = NULL;
}

static void log_mhd(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    fprintf(stderr, "weft-llm serve: ");
    vfprintf(stderr, fmt, ap);
}

/* ---- the command --------------------------------------------------------------- */

static int usage(void)
{
    fprintf(stderr,
            "usage: weft-llm serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--port-file PATH]\n"
            "                [--model-name NAME] [--max-seqs 64] [--kv-pages N] "
            "[--max-model-len N]\n"
            "                [--default-max-tokens 1024] [--workers N] [--backend "
            "host|cuda|auto]\n"
            "                [--max-body-bytes N] [--idle-timeout S] [--body-timeout S] "
            "[--drain-seconds S]\n"
            "                [--share-prefixes 1|0] [--prefill-chunk 512] [--swap-mb 0] "
            "[--draft DIR]\n"
            "                [--step-prompt-tokens 0] (N: at most N prompt tokens a step "
            "beside decodes)\n"
            "                [--pipeline 0|1] (1: every rank of an MPI job, a stage of layers "
            "each)\n"
            "                [--sparse-2-4 0|1] (1: the dense projections pruned to 2:4, "
            "multiplied sparse)\n"
            "                [--tensor-parallel N] (every layer split over N GPUs)\n");
    return 2;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* The address to listen on: a numeric IPv4 or IPv6 address, or a name. */
static int resolve(const char *host, int port, struct sockaddr_storage *sa)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *res;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc)
        return wl_fail("--host %s: %s", host, gai_strerror(rc));
    memcpy(sa, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

/* Waits until no request is alive or the deadline (CLOCK_MONOTONIC) passes. */
static int wait_idle(server *srv, const struct timespec *deadline)
{
    pthread_mutex_lock(&srv->lock);
    while (srv->in_flight > 0)
        if (pthread_cond_timedwait(&srv->idle, &srv->lock, deadline) == ETIMEDOUT)
            break;
    int left = srv->in_flight;
    pthread_mutex_unlock(&srv->lock);
    return left;
}

static int run_server(server *srv)
{
    char path[PATH_MAX];
    int rc = 1, engine_up = 0, sig;
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    /* every thread started from here on (workers, libmicrohttpd's) leaves
     * these to sigwait below */
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (wl_model_open(&srv->model, srv->dir))
        goto out;
    srv->model.sparse_2_4 = srv->sparse_2_4;
    wl_show_load_on(&srv->model, "weights");
    if (wl_open_ranks(&srv->models, &srv->model, srv->dir, srv->ranks))
        goto out;
    snprintf(path, sizeof path, "%s/tokenizer.json", srv->dir);
    if (wl_tokenizer_load(&srv->tk, path))
        goto out;
    if (srv->draft_dir) {
        if (wl_draft_open(&srv->draft, srv->draft_dir, srv->tk))
            goto out;
        wl_show_load_on(&srv->draft, "the draft's weights");
    }
    if (wl_chat_load(&srv->chat, srv->dir)) {
        fprintf(stderr, "weft-llm serve: no chat completions: %s\n", wl_error());
        srv->chat = NULL;
    }
    if (!srv->name) {
        const char *slash = strrchr(srv->dir, '/');
        srv->name = slash && slash[1] ? slash + 1 : srv->dir;
    }
    weft_config cfg = WEFT_CONFIG_INIT;
    cfg.workers = (unsigned)srv->workers;
    cfg.stack_size = 1 << 20;
    cfg.backend = !strcmp(srv->backend, "host")   ? WEFT_BACKEND_HOST
                  : !strcmp(srv->backend, "cuda") ? WEFT_BACKEND_CUDA
                                                  : WEFT_BACKEND_AUTO;
    if (weft_runtime_create(&srv->rt, &cfg) != WEFT_OK) {
        wl_fail("weft runtime: %s", weft_last_error());
        goto out;
    }
    /* defaults that fit a GPU for Llama 3.1 8B (2 MiB a page): a context of
     * at most 8192 tokens, and pages for every place at 2048 tokens */
    int context = srv->max_model_len                    ? srv->max_model_len
                  : srv->model.cfg.max_positions < 8192 ? srv->model.cfg.max_positions
                                                        : 8192;
    if (!srv->kv_pages)
        srv->kv_pages =
            (srv->max_seqs * (context < 2048 ? context : 2048) + WL_KV_PAGE - 1) / WL_KV_PAGE;
    if (srv->pipeline && wl_link_open(&srv->link, srv->rt))
        goto out;
    if (srv->link && wl_link_rank(srv->link) != 0) { /* a later stage: rank 0's steps, then out */
        rc = wl_engine_follow(srv->rt, &srv->model, srv->kv_pages, srv->max_seqs, context,
                              srv->link) != 0;
        if (!rc)
            fprintf(stderr, "weft-llm serve: rank %d: the pipeline ended\n",
                    wl_link_rank(srv->link));
        goto out;
    }
    if (srv->ranks > 1 ? wl_engine_start_tp(&srv->engine, srv->rt, srv->models, srv->ranks,
                                            srv->kv_pages, srv->max_seqs, context)
                       : wl_engine_start_pipeline(&srv->engine, srv->rt, &srv->model, srv->kv_pages,
                                                  srv->max_seqs, context, srv->link))
        goto out;
    engine_up = 1;
    if (srv->draft_dir && wl_engine_set_draft(&srv->engine, &srv->draft))
        goto out;
    srv->engine.kv.sharing = srv->share_prefixes; /* before any sequence */
    srv->engine.prefill_chunk = srv->prefill_chunk;
    wl_batcher_set_prompt_budget(srv->engine.batcher, srv->step_prompt_tokens);
    srv->engine.swap_bytes = (size_t)srv->swap_mb << 20;
    struct sockaddr_storage sa;
    if (resolve(srv->host, srv->port, &sa))
        goto out;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME |
                     MHD_USE_ERROR_LOG | (sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    srv->daemon = MHD_start_daemon(
        flags, (uint16_t)srv->port, NULL, NULL, on_request, srv, MHD_OPTION_EXTERNAL_LOGGER,
        log_mhd, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, srv, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)srv->idle_timeout,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)10000, MHD_OPTION_END);
    if (!srv->daemon) {
        wl_fail("cannot listen on %s port %d: %s", srv->host, srv->port, strerror(errno));
        goto out;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : srv->port;
    fprintf(stderr,
            "weft-llm serve: %s on http://%s:%d (%d places, %d KV pages of %d tokens, context "
            "%d)\n",
            srv->name, srv->host, port, srv->max_seqs, srv->kv_pages, WL_KV_PAGE, context);
    if (srv->port_file) {
        FILE *f = fopen(srv->port_file, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f)) {
            wl_fail("--port-file %s: %s", srv->port_file, strerror(errno));
            goto out;
        }
    }
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "weft-llm serve: %s: draining (up to %d s)\n", strsignal(sig),
            srv->drain_seconds);
    __atomic_store_n(&srv->draining, 1, __ATOMIC_RELEASE);
    MHD_socket listener = MHD_quiesce_daemon(srv->daemon);
    if (listener != MHD_INVALID_SOCKET)
        close(listener);
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += srv->drain_seconds;
    if (wait_idle(srv, &deadline)) {
        pthread_mutex_lock(&srv->lock);
        int cancelled = 0;
        for (request *r = srv->live; r; r = r->next, cancelled++) {
            pthread_mutex_lock(&r->lock);
            r->gone = 1; /* ends at its next token, or leaves the queue */
            pthread_mutex_unlock(&r->lock);
        }
        pthread_mutex_unlock(&srv->lock);
        fprintf(stderr, "weft-llm serve: cancelled %d requests at the deadline\n", cancelled);
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += 30;
        if (wait_idle(srv, &deadline)) {
            wl_fail("requests still running 30 s after they were cancelled");
            goto out;
        }
    }
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "weft-llm serve: %s\n", wl_error());
    if (srv->daemon && !srv->in_flight)
        MHD_stop_daemon(srv->daemon); /* no connection is suspended: every request has ended */
    if (engine_up && wl_engine_stop(&srv->engine) && !rc) {
        fprintf(stderr, "weft-llm serve: %s\n", wl_error());
        rc = 1;
    }
    wl_link_close(srv->link);
    if (srv->rt)
        weft_runtime_destroy(srv->rt);
    wl_chat_free(srv->chat);
    wl_tokenizer_free(srv->tk);
    wl_model_close(&srv->model);
    wl_close_ranks(srv->models, srv->ranks);
    wl_model_close(&srv->draft);
    if (!rc && engine_up)
        fprintf(stderr, "weft-llm serve: stopped\n");
    return rc;
}

/* run_server as a rank of an MPI job (--pipeline 1). */
static int run_server_job(void *srv)
{
    return run_server(srv);
}

int wl_serve_main(int argc, char **argv)
{
    server srv = {.host = "127.0.0.1",
                  .backend = "auto",
                  .port = 8000,
                  .max_seqs = 64,
                  .default_max_tokens = 1024,
                  .workers = 4,
                  .drain_seconds = 30,
                  .idle_timeout = 30,
                  .body_timeout = 30,
                  .max_body = 1 << 20,
                  .share_prefixes = 1,
                  .prefill_chunk = WL_PREFILL_CHUNK,
                  .ranks = 1};
    if (argc < 1 || argv[0][0] == '-')
        return usage();
    srv.dir = argv[0];
    for (int i = 1; i < argc; i += 2) { /* every option takes a value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        int bad = i + 1 >= argc, n = 0;
        if (!strcmp(a, "--host"))
            srv.host = v;
        else if (!strcmp(a, "--port"))
            bad |= parse_int(v, 0, 65535, &srv.port);
        else if (!strcmp(a, "--port-file"))
            srv.port_file = v;
        else if (!strcmp(a, "--model-name"))
            srv.name = v;
        else if (!strcmp(a, "--backend"))
            bad |= strcmp(v, "host") && strcmp(v, "cuda") && strcmp(v, "auto");
        else if (!strcmp(a, "--max-seqs"))
            bad |= parse_int(v, 1, 4096, &srv.max_seqs);
        else if (!strcmp(a, "--kv-pages"))
            bad |= parse_int(v, 1, 1 << 24, &srv.kv_pages);
        else if (!strcmp(a, "--max-model-len"))
            bad |= parse_int(v, 1, 1 << 24, &srv.max_model_len);
        else if (!strcmp(a, "--default-max-tokens"))
            bad |= parse_int(v, 1, 1 << 24, &srv.default_max_tokens);
        else if (!strcmp(a, "--workers"))
            bad |= parse_int(v, 1, 1024, &srv.workers);
        else if (!strcmp(a, "--max-body-bytes"))
            bad |= parse_int(v, 64, INT_MAX, &n);
        else if (!strcmp(a, "--idle-timeout"))
            bad |= parse_int(v, 1, 86400, &srv.idle_timeout);
        else if (!strcmp(a, "--body-timeout"))
            bad |= parse_int(v, 1, 86400, &srv.body_timeout);
        else if (!strcmp(a, "--drain-seconds"))
            bad |= parse_int(v, 0, 86400, &srv.drain_seconds);
        else if (!strcmp(a, "--share-prefixes"))
            bad |= parse_int(v, 0, 1, &srv.share_prefixes);
        else if (!strcmp(a, "--prefill-chunk"))
            bad |= parse_int(v, 0, 1 << 24, &srv.prefill_chunk);
        else if (!strcmp(a, "--step-prompt-tokens"))
            bad |= parse_int(v, 0, 1 << 24, &srv.step_prompt_tokens);
        else if (!strcmp(a, "--swap-mb"))
            bad |= parse_int(v, 0, 1 << 24, &srv.swap_mb);
        else if (!strcmp(a, "--draft"))
            srv.draft_dir = v;
        else if (!strcmp(a, "--pipeline"))
            bad |= parse_int(v, 0, 1, &srv.pipeline);
        else if (!strcmp(a, "--sparse-2-4"))
            bad |= parse_int(v, 0, 1, &srv.sparse_2_4);
        else if (!strcmp(a, "--tensor-parallel"))
            bad |= parse_int(v, 1, WL_MAX_RANKS, &srv.ranks);
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "weft-llm serve: bad option or value: %s %s\n", a, v);
            return usage();
        }
        if (!strcmp(a, "--backend"))
            srv.backend = v;
        if (!strcmp(a, "--max-body-bytes"))
            srv.max_body = (size_t)n;
    }
    if ((srv.pipeline || srv.ranks > 1) && (srv.draft_dir || srv.swap_mb)) {
        fprintf(stderr, "weft-llm serve: a split model (--pipeline, --tensor-parallel) takes no "
                        "--draft and no --swap-mb\n");
        return usage();
    }
    if (srv.pipeline && srv.ranks > 1) {
        fprintf(stderr, "weft-llm serve: --pipeline or --tensor-parallel, not both\n");
        return usage();
    }
    pthread_mutex_init(&srv.lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&srv.idle, &ca);
    pthread_condattr_destroy(&ca);
    wl_metrics_init(&srv.metrics);
    int rc = srv.pipeline ? wl_link_job("weft-llm serve", run_server_job, &srv) : run_server(&srv);
    wl_metrics_destroy(&srv.metrics);
    pthread_cond_destroy(&srv.idle);
    pthread_mutex_destroy(&srv.lock);
    return rc;
}
