/*
 * openai.c - OpenAI's completion and chat completion formats: a request's
 * fields checked one by one, each choice's text as tokens arrive (stop
 * strings, characters cut between tokens, logprobs), and the bodies and
 * stream chunks the server answers with.
 *
 * Text is held back while it could still become a stop string or is an
 * unfinished UTF-8 character, so a stream never shows what the final text
 * will not contain, and every JSON string is valid UTF-8 (a byte that can
 * never form a character becomes U+FFFD).
 */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* ---- requests ----------------------------------------------------------------- */

char *wl_oai_error_body(const char *message, const char *type, const char *param)
{
    wl_buf msg = {0};
    wl_utf8_sanitize(&msg, message, strlen(message));
    json_t *e = json_pack("{s:{s:s, s:s, s:s?, s:n}}", "error", "message", msg.data ? msg.data : "",
                          "type", type, "param", param, "code");
    wl_buf_free(&msg);
    char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return text;
}

/* A field's checks, each setting the param at fault on failure. */
typedef struct checker {
    json_t *body;
    const char *param;
} checker;

static int bad(checker *k, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(checker *k, const char *param, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    k->param = param;
    return wl_fail("%s", line);
}

/* The field key if present and not null; NULL otherwise. */
static json_t *field(checker *k, const char *key)
{
    json_t *v = json_object_get(k->body, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_bool(checker *k, const char *key, int *out)
{
    json_t *v = field(k, key);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(k, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int get_int(checker *k, const char *key, long long lo, long long hi, long long *out)
{
    json_t *v = field(k, key);
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return bad(k, key, "'%s' must be an integer", key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(k, key, "'%s' is %lld; it must be from %lld to %lld", key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_number(checker *k, const char *key, double lo, double hi, double *out)
{
    json_t *v = field(k, key);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad(k, key, "'%s' must be a number", key);
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi))
        return bad(k, key, "'%s' is %g; it must be from %g to %g", key, x, lo, hi);
    *out = x;
    return 0;
}

static int get_stop(checker *k, wl_oai_request *r)
{
    json_t *v = field(k, "stop");
    if (!v)
        return 0;
    if (json_is_string(v)) {
        if (!json_string_length(v))
            return bad(k, "stop", "'stop' must not be an empty string");
        r->stop[r->n_stop++] = strdup(json_string_value(v));
        return 0;
    }
    if (!json_is_array(v))
        return bad(k, "stop", "'stop' must be a string or an array of strings");
    if (json_array_size(v) > WL_MAX_STOPS)
        return bad(k, "stop", "'stop' has %zu strings; at most %d", json_array_size(v),
                   WL_MAX_STOPS);
    size_t i;
    json_t *s;
    json_array_foreach(v, i, s)
    {
        if (!json_is_string(s) || !json_string_length(s))
            return bad(k, "stop", "'stop' must hold non-empty strings");
        r->stop[r->n_stop++] = strdup(json_string_value(s));
    }
    return 0;
}

static int get_prompt(checker *k, wl_oai_request *r)
{
    json_t *v = field(k, "prompt");
    if (!v)
        return bad(k, "prompt", "'prompt' is required");
    if (json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)))
        v = json_array_get(v, 0); /* a batch of one prompt */
    if (json_is_string(v)) {
        r->prompt = json_incref(v);
        return 0;
    }
    if (!json_is_array(v) || !json_array_size(v))
        return bad(k, "prompt", "'prompt' must be a string or a non-empty array of token ids");
    size_t i;
    json_t *t;
    json_array_foreach(v, i, t)
    {
        if (json_is_string(t) || json_is_array(t))
            return bad(k, "prompt",
                       "a batch of prompts is not supported: send one request per prompt");
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return bad(k, "prompt", "'prompt' array item %zu is not a token id", i);
    }
    r->prompt = json_incref(v);
    return 0;
}

int wl_oai_parse(json_t *body, int chat, const char *model, wl_oai_request *r, int *status,
                 const char **param)
{
    checker k = {.body = body};
    long long v = 0;
    double d;
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->n = 1;
    r->logprobs = -1;
    r->sampler = (wl_sampler){.temperature = 1, .top_p = 1}; /* OpenAI's defaults */
    *status = 400;
    if (!json_is_object(body)) {
        bad(&k, NULL, "the request body must be a JSON object");
        goto fail;
    }
    json_t *m = field(&k, "model");
    if (m && !json_is_string(m)) {
        bad(&k, "model", "'model' must be a string");
        goto fail;
    }
    if (m && strcmp(json_string_value(m), model)) {
        *status = 404;
        bad(&k, "model", "The model '%s' does not exist (this server has '%s')",
            json_string_value(m), model);
        goto fail;
    }
    if (chat) {
        json_t *msgs = field(&k, "messages");
        if (!msgs || !json_is_array(msgs) || !json_array_size(msgs)) {
            bad(&k, "messages", "'messages' must be a non-empty array");
            goto fail;
        }
        r->messages = json_incref(msgs);
    } else if (get_prompt(&k, r)) {
        goto fail;
    }
    if (get_bool(&k, "stream", &r->stream) || get_bool(&k, "ignore_eos", &r->ignore_eos) ||
        get_bool(&k, "return_token_ids", &r->return_token_ids))
        goto fail;
    json_t *prio = field(&k, "priority");
    if (prio) {
        const char *name = json_string_value(prio);
        if (!name || (strcmp(name, "high") && strcmp(name, "normal") && strcmp(name, "low"))) {
            bad(&k, "priority", "'priority' is \"high\", \"normal\" or \"low\"");
            goto fail;
        }
        r->priority = !strcmp(name, "high")  ? WEFT_PRIO_HIGH
                      : !strcmp(name, "low") ? WEFT_PRIO_LOW
                                             : WEFT_PRIO_NORMAL;
    }
    json_t *so = field(&k, "stream_options");
    if (so) {
        checker ks = {.body = so};
        if (!json_is_object(so) || !r->stream) {
            bad(&k, "stream_options", "'stream_options' is an object, given only with stream");
            goto fail;
        }
        if (get_bool(&ks, "include_usage", &r->include_usage)) {
            k.param = "stream_options";
            goto fail;
        }
    }
    const char *max_key =
        chat && field(&k, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    v = 0;
    if (get_int(&k, max_key, 1, INT32_MAX, &v))
        goto fail;
    r->max_tokens = (int)v;
    v = 1;
    if (get_int(&k, "n", 1, WL_MAX_N, &v))
        goto fail;
    r->n = (int)v;
    d = r->sampler.temperature;
    if (get_number(&k, "temperature", 0, 2, &d))
        goto fail;
    r->sampler.temperature = (float)d;
    d = r->sampler.top_p;
    if (get_number(&k, "top_p", 0, 1, &d))
        goto fail;
    if (d == 0) {
        bad(&k, "top_p", "'top_p' must be above 0");
        goto fail;
    }
    r->sampler.top_p = (float)d;
    v = 0;
    if (get_int(&k, "top_k", 0, INT32_MAX, &v)) /* an extension */
        goto fail;
    r->sampler.top_k = (int)v;
    v = 0; /* extensions: speculative decoding, a sequence decoding alone */
    if (get_int(&k, "speculate", 0, WL_SPEC_MAX_K, &v))
        goto fail;
    r->speculate_k = (int)v;
    v = 0;
    if (get_int(&k, "ngram", 1, WL_NGRAM_MAX, &v))
        goto fail;
    r->ngram = (int)v;
    if (r->ngram && !r->speculate_k) {
        bad(&k, "ngram", "'ngram' is given with 'speculate'");
        goto fail;
    }
    if (field(&k, "seed")) {
        if (get_int(&k, "seed", INT64_MIN, INT64_MAX, &v))
            goto fail;
        r->sampler.state = (uint64_t)v;
        r->seeded = 1;
    }
    d = 0;
    if (get_number(&k, "frequency_penalty", -2, 2, &d))
        goto fail;
    r->penalties.frequency = (float)d;
    d = 0;
    if (get_number(&k, "presence_penalty", -2, 2, &d))
        goto fail;
    r->penalties.presence = (float)d;
    d = 1;
    if (get_number(&k, "repetition_penalty", 0.01, 100, &d)) /* an extension */
        goto fail;
    r->penalties.repetition = (float)d;
    json_t *lb = field(&k, "logit_bias");
    if (lb) {
        const char *key;
        json_t *value;
        if (!json_is_object(lb) || json_object_size(lb) > 300) {
            bad(&k, "logit_bias", "'logit_bias' must be an object of at most 300 token ids");
            goto fail;
        }
        size_t n = json_object_size(lb);
        int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
        float *bias = malloc((n ? n : 1) * sizeof *bias);
        r->penalties.bias_ids = ids;
        r->penalties.bias = bias;
        if (!ids || !bias) {
            bad(&k, "logit_bias", "out of memory");
            goto fail;
        }
        json_object_foreach(lb, key, value)
        {
            char *end;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id > INT32_MAX || !json_is_number(value) ||
                !(json_number_value(value) >= -100 && json_number_value(value) <= 100)) {
                bad(&k, "logit_bias",
                    "'logit_bias' maps token ids (strings of digits) to numbers from -100 to "
                    "100; \"%.40s\" does not",
                    key);
                goto fail;
            }
            ids[r->penalties.n_bias] = (int32_t)id;
            bias[r->penalties.n_bias++] = (float)json_number_value(value);
        }
    }
    if (r->speculate_k && wl_penalties_active(&r->penalties)) {
        bad(&k, "speculate", "'speculate' does not take penalties or logit_bias");
        goto fail;
    }
    if (chat) {
        int want = 0;
        if (get_bool(&k, "logprobs", &want))
            goto fail;
        v = 0;
        if (get_int(&k, "top_logprobs", 0, WL_MAX_TOP, &v))
            goto fail;
        if (v && !want) {
            bad(&k, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto fail;
        }
        r->logprobs = want ? (int)v : -1;
    } else {
        v = -1;
        if (get_int(&k, "logprobs", 0, WL_MAX_TOP, &v))
            goto fail;
        r->logprobs = (int)v;
        int echo = 0;
        if (get_bool(&k, "echo", &echo))
            goto fail;
        if (echo) {
            bad(&k, "echo", "'echo' is not supported by this server");
            goto fail;
        }
    }
    if (get_stop(&k, r))
        goto fail;
    return 0;
fail:
    *param = k.param;
    wl_oai_request_free(r);
    return -1;
}

void wl_oai_request_free(wl_oai_request *r)
{
    free((void *)r->penalties.bias_ids);
    free((void *)r->penalties.bias);
    r->penalties.bias_ids = NULL;
    r->penalties.bias = NULL;
    r->penalties.n_bias = 0;
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    json_decref(r->prompt);
    json_decref(r->messages);
    r->n_stop = 0;
    r->prompt = r->messages = NULL;
}

/* ---- choices ------------------------------------------------------------------ */

void wl_choice_free(wl_choice *c)
{
    wl_buf_free(&c->text);
    wl_buf_free(&c->pending);
    free(c->ids);
    json_decref(c->logprobs);
    memset(c, 0, sizeof *c);
}

/* A token's text for logprobs: its bytes (special tokens as written). */
static json_t *token_text(const wl_tokenizer *tk, int32_t id, wl_buf *bytes)
{
    char buf[1024];
    int n = tk ? wl_decode_token(tk, id, 1, 0, buf, sizeof buf) : -1;
    wl_buf s = {0};
    if (n < 0) {
        char name[32];
        n = snprintf(name, sizeof name, "<id %d>", id);
        memcpy(buf, name, (size_t)n);
    }
    if (bytes)
        wl_buf_append(bytes, buf, (size_t)n);
    wl_utf8_sanitize(&s, buf, (size_t)n);
    json_t *j = json_string(s.data ? s.data : "");
    wl_buf_free(&s);
    return j;
}

static json_t *bytes_array(const wl_buf *b)
{
    json_t *a = json_array();
    for (size_t i = 0; i < b->len; i++)
        json_array_append_new(a, json_integer((unsigned char)b->data[i]));
    return a;
}

/* The log-probabilities of the model's distribution (the logits as they
 * are, before the sampler's temperature and filters). */
static json_t *logprobs_entry(const wl_oai_request *r, const wl_tokenizer *tk, int32_t id,
                              const float *logits, int vocab)
{
    double mx = logits[0], sum = 0;
    for (int i = 1; i < vocab; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    int top[WL_MAX_TOP], nt = 0;
    for (int i = 0; i < vocab; i++) { /* insertion into the top r->logprobs */
        int at = nt;
        while (at > 0 && logits[i] > logits[top[at - 1]])
            at--;
        if (at >= r->logprobs)
            continue;
        if (nt < r->logprobs)
            nt++;
        memmove(top + at + 1, top + at, (size_t)(nt - 1 - at) * sizeof *top);
        top[at] = i;
    }
    if (r->chat) {
        wl_buf b = {0};
        json_t *tok = token_text(tk, id, &b);
        json_t *alts = json_array();
        for (int i = 0; i < nt; i++) {
            wl_buf ab = {0};
            json_t *t = token_text(tk, top[i], &ab);
            json_array_append_new(alts, json_pack("{s:o, s:f, s:o}", "token", t, "logprob",
                                                  logits[top[i]] - lse, "bytes", bytes_array(&ab)));
            wl_buf_free(&ab);
        }
        json_t *e = json_pack("{s:o, s:f, s:o, s:o}", "token", tok, "logprob", logits[id] - lse,
                              "bytes", bytes_array(&b), "top_logprobs", alts);
        wl_buf_free(&b);
        return e;
    }
    json_t *alts = json_object();
    for (int i = 0; i < nt; i++) {
        json_t *t = token_text(tk, top[i], NULL);
        json_object_set_new(alts, json_string_value(t), json_real(logits[top[i]] - lse));
        json_decref(t);
    }
    return json_pack("{s:o, s:f, s:o}", "token", token_text(tk, id, NULL), "logprob",
                     logits[id] - lse, "top", alts);
}

/* Completions' logprobs are four parallel arrays; entries are kept as
 * {token, logprob, top} and laid out so at the end. */
static json_t *completions_logprobs(json_t *entries, size_t text_offset)
{
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array(),
           *offsets = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e)
    {
        json_t *t = json_object_get(e, "token");
        json_array_append(tokens, t);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_array_append(tops, json_object_get(e, "top"));
        json_array_append_new(offsets, json_integer((json_int_t)text_offset));
        text_offset += json_string_length(t);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offsets);
}

/* Moves pending[0, n) to emit and to the choice's text. */
static void emit_pending(wl_choice *c, size_t n, wl_buf *emit)
{
    wl_buf clean = {0};
    wl_utf8_sanitize(&clean, c->pending.data, n);
    if (clean.len) {
        wl_buf_append(emit, clean.data, clean.len);
        wl_buf_append(&c->text, clean.data, clean.len);
    }
    wl_buf_free(&clean);
    memmove(c->pending.data, c->pending.data + n, c->pending.len - n + 1);
    c->pending.len -= n;
}

int wl_choice_token(wl_choice *c, const wl_oai_request *r, const wl_tokenizer *tk, int32_t id,
                    int eos, const float *logits, int vocab, wl_buf *emit, json_t **lp)
{
    *lp = NULL;
    c->tokens++;
    if (r->return_token_ids) {
        if (c->n_ids == c->cap_ids) {
            int cap = c->cap_ids ? 2 * c->cap_ids : 64;
            int32_t *ids = realloc(c->ids, (size_t)cap * sizeof *ids);
            if (ids) {
                c->ids = ids;
                c->cap_ids = cap;
            }
        }
        if (c->n_ids < c->cap_ids)
            c->ids[c->n_ids++] = id;
    }
    if (r->logprobs >= 0 && !eos) {
        *lp = logprobs_entry(r, tk, id, logits, vocab);
        if (!r->stream && *lp) {
            if (!c->logprobs)
                c->logprobs = json_array();
            json_array_append(c->logprobs, *lp);
        }
    }
    if (eos)
        return 0;
    char buf[1024];
    int n = tk ? wl_decode_token(tk, id, 0, 0, buf, sizeof buf) : 0;
    if (n > 0)
        wl_buf_append(&c->pending, buf, (size_t)n);
    if (!c->pending.len)
        return 0;
    /* the earliest stop string in what is held back (earlier text was
     * emitted only where no stop string could start) */
    const char *hit = NULL;
    for (int i = 0; i < r->n_stop; i++) {
        const char *at = memmem(c->pending.data, c->pending.len, r->stop[i], strlen(r->stop[i]));
        if (at && (!hit || at < hit))
            hit = at;
    }
    if (hit) {
        emit_pending(c, (size_t)(hit - c->pending.data), emit);
        c->pending.len = 0;
        c->stopped = 1;
        return 1;
    }
    /* keep the longest tail that begins some stop string */
    size_t keep = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t ls = strlen(r->stop[i]);
        for (size_t t = ls - 1; t > keep; t--)
            if (t <= c->pending.len &&
                !memcmp(c->pending.data + c->pending.len - t, r->stop[i], t)) {
                keep = t;
                break;
            }
    }
    emit_pending(c, wl_utf8_complete(c->pending.data, c->pending.len - keep), emit);
    return 0;
}

void wl_choice_flush(wl_choice *c, wl_buf *emit)
{
    if (c->pending.len)
        emit_pending(c, c->pending.len, emit);
}

/* ---- responses ---------------------------------------------------------------- */

static json_t *text_json(const char *text, size_t len)
{
    json_t *s = json_stringn(text ? text : "", text ? len : 0);
    return s ? s : json_string(""); /* text is sanitized: only an allocation fails here */
}

static void put_event(wl_buf *out, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (!s) {
        out->failed = 1;
        return;
    }
    wl_buf_printf(out, "data: %s\n\n", s);
    free(s);
}

void wl_oai_chunk(wl_buf *out, const wl_oai_request *r, const char *id, long created,
                  const char *model, int index, const char *text, size_t len, json_t *lp,
                  const char *finish, int role_chunk)
{
    json_t *choice;
    if (r->chat) {
        json_t *delta = json_object();
        if (role_chunk)
            json_object_set_new(delta, "role", json_string("assistant"));
        if (role_chunk || len)
            json_object_set_new(delta, "content", text_json(text, len));
        json_t *lpj = lp ? json_pack("{s:[O]}", "content", lp) : json_null();
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "delta", delta, "logprobs", lpj,
                           "finish_reason", finish);
    } else {
        json_t *lpj = json_null();
        if (lp) {
            json_t *one = json_array();
            json_array_append(one, lp);
            lpj = completions_logprobs(one, 0);
            json_decref(one);
        }
        choice = json_pack("{s:i, s:o, s:o, s:s?}", "index", index, "text", text_json(text, len),
                           "logprobs", lpj, "finish_reason", finish);
    }
    json_decref(lp);
    json_t *chunk = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", id, "object",
                              r->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)created, "model", model, "choices", choice);
    if (r->include_usage && chunk)
        json_object_set_new(chunk, "usage", json_null());
    put_event(out, chunk);
    json_decref(chunk);
}

static json_t *usage(int prompt, int completion)
{
    return json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", completion,
                     "total_tokens", prompt + completion);
}

void wl_oai_usage_chunk(wl_buf *out, const wl_oai_request *r, const char *id, long created,
                        const char *model, int prompt_tokens, int completion_tokens)
{
    json_t *chunk = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", id, "object",
                              r->chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)created, "model", model, "choices", "usage",
                              usage(prompt_tokens, completion_tokens));
    put_event(out, chunk);
    json_decref(chunk);
}

char *wl_oai_response(const wl_oai_request *r, const char *id, long created, const char *model,
                      wl_choice *choices, int n, int prompt_tokens)
{
    json_t *list = json_array();
    int completion = 0;
    for (int i = 0; i < n; i++) {
        wl_choice *c = &choices[i];
        json_t *choice, *lpj = json_null();
        completion += c->tokens;
        if (c->logprobs)
            lpj = r->chat ? json_pack("{s:O}", "content", c->logprobs)
                          : completions_logprobs(c->logprobs, 0);
        if (r->chat)
            choice = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s}", "index", c->index, "message",
                               "role", "assistant", "content", text_json(c->text.data, c->text.len),
                               "logprobs", lpj, "finish_reason", c->finish ? c->finish : "stop");
        else
            choice = json_pack("{s:i, s:o, s:o, s:s}", "index", c->index, "text",
                               text_json(c->text.data, c->text.len), "logprobs", lpj,
                               "finish_reason", c->finish ? c->finish : "stop");
        if (choice && r->return_token_ids) {
            json_t *ids = json_array();
            for (int t = 0; t < c->n_ids; t++)
                json_array_append_new(ids, json_integer(c->ids[t]));
            json_object_set_new(choice, "token_ids", ids);
        }
        json_array_append_new(list, choice);
    }
    json_t *body =
        json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
                  r->chat ? "chat.completion" : "text_completion", "created", (json_int_t)created,
                  "model", model, "choices", list, "usage", usage(prompt_tokens, completion));
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return text;
}
