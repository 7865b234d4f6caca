/*
 * request.c - a completion request's life after the handler: its task
 * encodes the prompt (or renders the chat), runs its choices through the
 * engine (one task each; a choice is one sequence of the batcher), and
 * writes what the client is to receive - the whole answer, or the
 * stream's events as tokens come - into the request, waking its
 * connection (serve.c) whenever there is something to send.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "serve_impl.h"

/* ---- requests' lifetime ---------------------------------------------------- */

void wl_request_unref(request *r)
{
    if (__atomic_sub_fetch(&r->refs, 1, __ATOMIC_ACQ_REL))
        return;
    server *srv = r->srv;
    pthread_mutex_lock(&srv->lock);
    if (r->prev)
        r->prev->next = r->next;
    else
        srv->live = r->next;
    if (r->next)
        r->next->prev = r->prev;
    srv->in_flight--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->lock);
    for (int i = 0; i < WL_MAX_N; i++)
        wl_choice_free(&r->choices[i]);
    wl_oai_request_free(&r->q);
    wl_buf_free(&r->out);
    free(r->answer);
    free(r->prompt);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void wl_request_wake_locked(request *r)
{
    if (r->suspended && r->conn) {
        r->suspended = 0;
        MHD_resume_connection(r->conn);
    }
}

/* One choice of a request: the context of its generation's hooks. */
typedef struct choice_run {
    request *r;
    int index, failed;
    uint64_t last_ns;
    wl_finish finish;
    char message[512];
} choice_run;

/* The generation's cancellation hook: the client has gone. While the
 * connection is suspended libmicrohttpd cannot see a hang-up, so the
 * socket is polled here (it is not touched by anyone while suspended). */
static int client_gone(void *ctx)
{
    request *r = ((choice_run *)ctx)->r;
    pthread_mutex_lock(&r->lock);
    if (!r->gone && r->suspended && r->conn) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct pollfd p = {.fd = ci ? ci->connect_fd : -1, .events = POLLRDHUP};
        if (ci && poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            r->gone = 1;
    }
    int gone = r->gone;
    pthread_mutex_unlock(&r->lock);
    return gone;
}

/* ---- the request's task ------------------------------------------------------ */

static void answer_locked(request *r, int status, char *body)
{
    free(r->answer);
    r->answer = body;
    r->status = status;
    r->phase = ANSWER;
    r->done = 1;
    wl_request_wake_locked(r);
}

void wl_request_answer_error(request *r, int status, const char *message, const char *param)
{
    char *body =
        wl_oai_error_body(message, status == 500 ? "server_error" : "invalid_request_error", param);
    pthread_mutex_lock(&r->lock);
    answer_locked(r, status, body);
    pthread_mutex_unlock(&r->lock);
}

/* The prompt's ids: the text encoded, the ids given, or the chat rendered
 * with the model's template and encoded. */
static int prepare_prompt(request *r)
{
    server *srv = r->srv;
    size_t n = 0;
    if (r->q.chat) {
        char *text;
        int add_special;
        if (wl_chat_render(srv->chat, r->q.messages, 1, &text, &add_special))
            return -1;
        /* the template writes every special token it wants (a BOS too):
         * encoded without the tokenizer's own, as transformers does */
        int rc = wl_encode(srv->tk, text, strlen(text), 0, &r->prompt, &n);
        free(text);
        if (rc)
            return -1;
    } else if (json_is_string(r->q.prompt)) {
        if (wl_encode(srv->tk, json_string_value(r->q.prompt), json_string_length(r->q.prompt), 1,
                      &r->prompt, &n))
            return -1;
    } else {
        n = json_array_size(r->q.prompt);
        r->prompt = malloc(n * sizeof *r->prompt);
        if (!r->prompt)
            return wl_fail("out of memory");
        for (size_t i = 0; i < n; i++) {
            json_int_t id = json_integer_value(json_array_get(r->q.prompt, i));
            if (id >= srv->model.cfg.vocab)
                return wl_fail("prompt token %zu is %lld, outside the vocabulary (%d)", i,
                               (long long)id, srv->model.cfg.vocab);
            r->prompt[i] = (int32_t)id;
        }
    }
    r->n_prompt = (int)n;
    if (!n)
        return wl_fail("the prompt encodes to no tokens");
    return 0;
}

static int on_token(void *ctx, int32_t id, int eos, const float *logits)
{
    choice_run *cr = ctx;
    request *r = cr->r;
    server *srv = r->srv;
    wl_buf emit = {0};
    json_t *lp;
    int stop = wl_choice_token(&r->choices[cr->index], &r->q, srv->tk, id, eos, logits,
                               srv->model.cfg.vocab, &emit, &lp);
    uint64_t now = weft_now_ns();
    if (!__atomic_exchange_n(&r->first_token, 1, __ATOMIC_ACQ_REL))
        wl_metrics_observe(&srv->metrics, WL_TTFT, (double)(now - r->arrived_ns) * 1e-9);
    if (cr->last_ns)
        wl_metrics_observe(&srv->metrics, WL_ITL, (double)(now - cr->last_ns) * 1e-9);
    cr->last_ns = now;
    if (r->q.stream && (emit.len || lp)) {
        pthread_mutex_lock(&r->lock);
        wl_oai_chunk(&r->out, &r->q, r->id, r->created, srv->name, cr->index, emit.data, emit.len,
                     lp, NULL, 0);
        wl_request_wake_locked(r);
        pthread_mutex_unlock(&r->lock);
    } else {
        json_decref(lp);
    }
    wl_buf_free(&emit);
    return stop;
}

/* One choice: one sequence through the engine. */
static void *choice_task(void *arg)
{
    choice_run *cr = arg;
    request *r = cr->r;
    wl_choice *c = &r->choices[cr->index];
    wl_gen g = {.prompt = r->prompt,
                .n_prompt = r->n_prompt,
                .max_tokens = r->max_tokens,
                .sampler = r->q.sampler,
                .ignore_eos = r->q.ignore_eos,
                .priority = r->q.priority,
                .speculate_k = r->q.speculate_k,
                .ngram = r->q.ngram,
                .use_draft = r->q.speculate_k && !r->q.ngram && r->srv->engine.draft,
                .penalties = r->q.penalties,
                .on_token = on_token,
                .wants_logits = r->q.logprobs >= 0,
                .cancelled = client_gone,
                .ctx = cr};
    g.sampler.state += (uint64_t)cr->index; /* choice i: seed + i, as generate --parallel */
    cr->failed = wl_engine_generate(&r->srv->engine, &g, &cr->finish);
    if (cr->failed)
        snprintf(cr->message, sizeof cr->message, "%s", wl_error());
    c->finish = cr->finish == WL_FINISH_LENGTH ? "length" : "stop";
    wl_buf emit = {0};
    wl_choice_flush(c, &emit);
    if (r->q.stream && !cr->failed && cr->finish != WL_FINISH_CANCELLED) {
        pthread_mutex_lock(&r->lock);
        if (emit.len)
            wl_oai_chunk(&r->out, &r->q, r->id, r->created, r->srv->name, cr->index, emit.data,
                         emit.len, NULL, NULL, 0);
        wl_oai_chunk(&r->out, &r->q, r->id, r->created, r->srv->name, cr->index, "", 0, NULL,
                     c->finish, 0);
        wl_request_wake_locked(r);
        pthread_mutex_unlock(&r->lock);
    }
    wl_buf_free(&emit);
    return NULL;
}

void *wl_request_task(void *arg)
{
    request *r = arg;
    server *srv = r->srv;
    choice_run runs[WL_MAX_N];
    weft_task *tasks[WL_MAX_N];
    int spawned = 1, status = 200;
    memset(runs, 0, sizeof runs);
    for (int i = 0; i < r->q.penalties.n_bias; i++)
        if (r->q.penalties.bias_ids[i] >= srv->model.cfg.vocab) {
            char msg[160];
            snprintf(msg, sizeof msg, "logit_bias: token %d is outside the vocabulary (%d)",
                     r->q.penalties.bias_ids[i], srv->model.cfg.vocab);
            wl_request_answer_error(r, 400, msg, "logit_bias");
            status = 400;
            goto out;
        }
    if (r->q.speculate_k && (srv->engine.link || srv->engine.tp)) {
        wl_request_answer_error(r, 400,
                                "'speculate': this server's model is split (a pipeline, tensor "
                                "parallel), which does not decode speculatively",
                                "speculate");
        status = 400;
        goto out;
    }
    if (prepare_prompt(r)) {
        wl_request_answer_error(r, 400, wl_error(), r->q.chat ? "messages" : "prompt");
        status = 400;
        goto out;
    }
    int room = srv->engine.max_tokens - r->n_prompt; /* past the context: the check says so */
    room = room < 1 ? 1 : room;
    r->max_tokens = r->q.max_tokens ? r->q.max_tokens
                    : r->q.chat ? (room < srv->default_max_tokens ? room : srv->default_max_tokens)
                                : 16; /* OpenAI's default for completions */
    if (wl_engine_check(&srv->engine, r->n_prompt, r->max_tokens)) {
        wl_request_answer_error(r, 400, wl_error(), "max_tokens");
        status = 400;
        goto out;
    }
    for (int i = 0; i < r->q.n; i++)
        r->choices[i].index = i;
    if (r->q.stream) {
        pthread_mutex_lock(&r->lock);
        r->phase = STREAMING;
        for (int i = 0; r->q.chat && i < r->q.n; i++) /* the chat stream opens with the role */
            wl_oai_chunk(&r->out, &r->q, r->id, r->created, srv->name, i, "", 0, NULL, NULL, 1);
        wl_request_wake_locked(r);
        pthread_mutex_unlock(&r->lock);
    }
    /* choice 0 here, the others in tasks of their own */
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "choice";
    opts.priority = r->q.priority;
    opts.device = srv->engine.device;
    for (int i = 0; i < r->q.n; i++)
        runs[i] = (choice_run){.r = r, .index = i};
    for (; spawned < r->q.n; spawned++)
        if (weft_spawn(srv->rt, &tasks[spawned], choice_task, &runs[spawned], &opts) != WEFT_OK) {
            runs[spawned].failed = 1;
            snprintf(runs[spawned].message, sizeof runs[spawned].message, "%s", weft_last_error());
            break;
        }
    choice_task(&runs[0]);
    for (int i = 1; i < spawned; i++)
        weft_join(tasks[i], NULL);
    const char *failure = NULL;
    int completion = 0;
    for (int i = 0; i < r->q.n; i++) {
        completion += r->choices[i].tokens;
        if (runs[i].failed && !failure)
            failure = runs[i].message;
    }
    wl_metrics_tokens(&srv->metrics, r->n_prompt, completion);
    wl_metrics_observe(&srv->metrics, WL_E2E, (double)(weft_now_ns() - r->arrived_ns) * 1e-9);
    pthread_mutex_lock(&r->lock);
    if (r->q.stream) {
        if (failure) {
            char *e = wl_oai_error_body(failure, "server_error", NULL);
            wl_buf_printf(&r->out, "data: %s\n\n", e ? e : "{}");
            free(e);
            status = 500;
        } else if (r->q.include_usage) {
            wl_oai_usage_chunk(&r->out, &r->q, r->id, r->created, srv->name, r->n_prompt,
                               completion);
        }
        wl_buf_printf(&r->out, "data: [DONE]\n\n");
        r->done = 1;
        wl_request_wake_locked(r);
    } else if (failure) {
        status = 500;
        answer_locked(r, 500, wl_oai_error_body(failure, "server_error", NULL));
    } else {
        char *body =
            wl_oai_response(&r->q, r->id, r->created, srv->name, r->choices, r->q.n, r->n_prompt);
        status = body ? 200 : 500;
        answer_locked(r, status,
                      body ? body : wl_oai_error_body("out of memory", "server_error", NULL));
    }
    pthread_mutex_unlock(&r->lock);
out:
    wl_metrics_request(&srv->metrics, r->endpoint, status);
    wl_request_unref(r);
    return NULL;
}
