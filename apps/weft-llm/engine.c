/*
 * engine.c - a model served to many sequences: the weights on the backend,
 * the paged KV cache, the batcher's task, and the life of one generation
 * (admission, prefill, each step, its end) as plain code in the caller's
 * task. `weft-llm generate` runs its sequences through it, and so does
 * `weft-llm serve`, so a request's tokens are the command line's.
 *
 * A prompt starts where the pages other prompts published for the same
 * first tokens end, when the cache shares prefixes (kv.c); its own
 * whole pages are published after its prefill. A batch generation joins
 * the batcher at once and hands its prompt to the batcher's steps a chunk
 * at a time (wl_batcher_prefill), so prompts are prefilled together and
 * beside the running decodes, one pass over every row a step.
 *
 * Admission: a generation reserves the pages its prompt and its first
 * step need, and a place in the batch, before it starts, and grows its
 * reservation a page at a time as it decodes. When the cache cannot
 * promise a page, the newest running generation in the batch is
 * preempted: its task gives its pages and place back, queues again ahead
 * of later arrivals of its priority, and once admitted recomputes what it
 * had (its prompt and tokens, a prefill) and decodes on from its pending
 * token, its sampler and penalties where they were. The newest goes, so
 * the oldest always progress; a generation that is itself the newest
 * gives its own pages back. With a swap budget (swap_bytes), a decoding
 * generation's keys and values go to host memory instead and come back
 * into new pages when it is admitted again, bit for bit: nothing is
 * recomputed. Waiters are admitted in order of priority,
 * then of arrival (a queue of nodes on their tasks' stacks), so a long
 * prompt is not starved by a stream of short ones of its class; one that
 * is cancelled while it waits leaves the queue.
 *
 * A generation that asks for speculative decoding (wl_gen's speculate_k)
 * reserves what it can ever need (it is never preempted) and a place, but after
 * its prefill it decodes alone in its task (speculate), not through the
 * batcher: a round runs several tokens of one sequence, which a batch step
 * (one token of each member) does not take. It is the batch-1 latency path.
 * Its drafts come from n-grams of its text or from the engine's draft model
 * (wl_engine_set_draft), which decodes them in a sequence of its own, in
 * a cache of its own with the target's page count: a draft sequence holds
 * fewer tokens than its generation reserved in the target's cache, and
 * only speculative generations have one, so the draft's pages never run
 * out before the target's reservations do.
 *
 * Admission wakes only the queue's head (a condition variable a waiter),
 * so a thousand queued requests cost no more than one when pages come back.
 */
#include <stdlib.h>
#include <string.h>

#include "llm.h"

/* One generation, a node of the admission queue while it waits, of the
 * running list once admitted. */
typedef struct wl_waiter {
    struct wl_waiter *next;
    int pages;         /* reserved, or to reserve */
    int place;         /* it decodes in the batch (a speculative one decodes alone) */
    int rank;          /* 0 high, 1 normal, 2 low: the queue's order, arrival within a rank */
    int front;         /* preempted: queued ahead of its rank's later arrivals */
    long serial;       /* its first admission's: the newest is the largest */
    int preempt;       /* told to give its pages back (under the engine's lock) */
    const wl_seq *seq; /* its sequence, while it has one */
    weft_cond *turn;   /* signalled when, queued, it may be admitted */
} wl_waiter;

static int rank_of(weft_priority p)
{
    return p == WEFT_PRIO_HIGH ? 0 : p == WEFT_PRIO_LOW ? 2 : 1;
}

static int pages_for(const wl_engine *e, int tokens)
{
    return (tokens + e->kv.page_size - 1) / e->kv.page_size;
}

/* m as l's rank's stage (its layers alone uploaded and cached). */
static int take_stage(wl_model *m, wl_link *l)
{
    int first, end;
    return wl_link_stage(l, m->cfg.layers, &first, &end) || wl_model_set_stage(m, first, end);
}

/* Whether the model is split (a pipeline, tensor parallel): every prompt
 * then goes through the batcher's steps, which every part runs, and
 * nothing speculates or swaps. */
static int split(const wl_engine *e)
{
    return e->link || e->tp;
}

static void *setup_task(void *arg)
{
    wl_engine *e = arg;
    int failed = (e->link && take_stage(e->model, e->link)) ||
                 (e->tp && wl_model_set_shard(e->model, 0, wl_tp_ranks(e->tp))) ||
                 wl_model_upload(e->model) ||
                 wl_kv_create(&e->kv, e->model, e->kv_pages, WL_KV_PAGE) ||
                 wl_batcher_create(&e->batcher, e->model, &e->kv, e->max_seqs, e->max_tokens,
                                   e->batcher_chunk) ||
                 (e->link && wl_batcher_link(e->batcher, e->link));
    if (e->tp) { /* every rank ready, or the first failure */
        if (failed || wl_batcher_tp(e->batcher, e->tp))
            wl_tp_break(e->tp, 0, "%s", wl_error());
        failed = wl_tp_barrier(e->tp);
    }
    if (!failed &&
        (weft_mutex_create(&e->lock) != WEFT_OK || weft_cond_create(&e->pages_back) != WEFT_OK ||
         weft_task_device(&e->device) != WEFT_OK))
        failed = wl_fail("engine: %s", weft_last_error());
    if (failed)
        snprintf(e->message, sizeof e->message, "%s", wl_error());
    return failed ? e : NULL;
}

/* The draft model's weights and cache, given back (what of them was made). */
static int drop_draft(wl_engine *e)
{
    if (e->draft_kv.lock_made)
        wl_kv_destroy(&e->draft_kv);
    memset(&e->draft_kv, 0, sizeof e->draft_kv);
    int rc = e->draft ? wl_model_release(e->draft) : 0;
    e->draft = NULL;
    return rc;
}

static void *teardown_task(void *arg)
{
    wl_engine *e = arg;
    if (drop_draft(e))
        snprintf(e->message, sizeof e->message, "%s", wl_error());
    if (split(e) && e->batcher && wl_batcher_unlink(e->batcher))
        snprintf(e->message, sizeof e->message, "%s", wl_error());
    wl_batcher_destroy(e->batcher);
    if (e->kv.lock_made)
        wl_kv_destroy(&e->kv);
    if (wl_model_release(e->model))
        snprintf(e->message, sizeof e->message, "%s", wl_error());
    return NULL;
}

int wl_engine_start(wl_engine *e, weft_runtime *rt, wl_model *m, int kv_pages, int max_seqs,
                    int max_tokens)
{
    return wl_engine_start_pipeline(e, rt, m, kv_pages, max_seqs, max_tokens, NULL);
}

/* The batcher's chunk of an engine for sequences of max_tokens. */
static int batcher_chunk(int max_tokens)
{
    return WL_PREFILL_CHUNK < max_tokens ? WL_PREFILL_CHUNK : max_tokens;
}

/* wl_engine_start_pipeline's and wl_engine_start_tp's, once e is zeroed
 * and its link or group set. */
static int start(wl_engine *e, weft_runtime *rt, wl_model *m, int kv_pages, int max_seqs,
                 int max_tokens)
{
    weft_task *t;
    void *failed = NULL;
    e->model = m;
    e->rt = rt;
    e->kv_pages = kv_pages;
    e->max_seqs = max_seqs;
    e->max_tokens = max_tokens;
    e->prefill_chunk = WL_PREFILL_CHUNK;
    e->batcher_chunk = batcher_chunk(max_tokens);
    if (max_seqs < 1 || max_tokens < 1 || kv_pages < 1)
        return wl_fail("engine: %d sequences of %d tokens in %d pages", max_seqs, max_tokens,
                       kv_pages);
    weft_task_opts on_first = WEFT_TASK_OPTS_INIT;
    if (e->tp)
        on_first.device = wl_tp_device(e->tp, 0); /* rank r's share is on device r */
    if (weft_spawn(rt, &t, setup_task, e, &on_first) != WEFT_OK ||
        weft_join(t, &failed) != WEFT_OK) {
        if (e->tp)
            wl_tp_break(e->tp, 0, "engine: the setup task: %s", weft_last_error());
        return wl_fail("engine: the setup task: %s", weft_last_error());
    }
    if (failed) {
        char msg[sizeof e->message];
        snprintf(msg, sizeof msg, "%s", e->message); /* the stop's own are its */
        wl_engine_stop(e);
        return wl_fail("%s", msg);
    }
    weft_task_opts opts = WEFT_TASK_OPTS_INIT;
    opts.name = "batcher";
    opts.device = e->device; /* its steps run on the weights' device */
    if (weft_spawn(rt, &e->batcher_task, wl_batcher_run, e->batcher, &opts) != WEFT_OK) {
        char msg[sizeof e->message];
        snprintf(msg, sizeof msg, "engine: the batcher's task: %s", weft_last_error());
        wl_engine_stop(e);
        return wl_fail("%s", msg);
    }
    return 0;
}

int wl_engine_start_pipeline(wl_engine *e, weft_runtime *rt, wl_model *m, int kv_pages,
                             int max_seqs, int max_tokens, wl_link *l)
{
    memset(e, 0, sizeof *e);
    if (l && wl_link_rank(l) != 0)
        return wl_fail("engine: rank %d of the pipeline follows (wl_engine_follow)",
                       wl_link_rank(l));
    e->link = l;
    return start(e, rt, m, kv_pages, max_seqs, max_tokens);
}

/* The ranks but 0 joined, the group freed. */
static void end_tp(wl_engine *e)
{
    wl_tp_join_ranks(e->tp);
    wl_tp_destroy(e->tp);
    e->tp = NULL;
}

int wl_engine_start_tp(wl_engine *e, weft_runtime *rt, wl_model *const *models, int ranks,
                       int kv_pages, int max_seqs, int max_tokens)
{
    memset(e, 0, sizeof *e);
    if (ranks < 2)
        return wl_fail("engine: tensor parallel over %d ranks; it takes 2 or more", ranks);
    if (max_seqs < 1 || max_tokens < 1 || kv_pages < 1)
        return wl_fail("engine: %d sequences of %d tokens in %d pages", max_seqs, max_tokens,
                       kv_pages);
    if (wl_tp_create(&e->tp, rt, ranks))
        return -1;
    wl_tp_start_ranks(e->tp, rt, models, kv_pages, max_seqs, max_tokens, batcher_chunk(max_tokens));
    if (start(e, rt, models[0], kv_pages, max_seqs, max_tokens)) {
        end_tp(e); /* the ranks have ended (the group is broken), if not ended already */
        return -1;
    }
    return 0;
}

typedef struct follower {
    wl_model *m;
    wl_link *l;
    int kv_pages, max_seqs, max_tokens;
    char message[512]; /* the task's error line: the joining thread's is its own */
} follower;

/* A follower's stage: its weights, cache and batch, made as rank 0's
 * engine makes its own, then the steps until rank 0 stops. */
static void *follow_task(void *arg)
{
    follower *f = arg;
    wl_kv kv = {0};
    wl_batch *b = NULL;
    int failed =
        take_stage(f->m, f->l) || wl_model_upload(f->m) ||
        wl_kv_create(&kv, f->m, f->kv_pages, WL_KV_PAGE) ||
        wl_batch_create(&b, f->m, &kv, f->max_seqs, f->max_tokens, batcher_chunk(f->max_tokens)) ||
        wl_batch_link(b, f->l) || wl_batch_follow(b);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", failed ? wl_error() : "");
    wl_batch_destroy(b);
    if (kv.lock_made)
        wl_kv_destroy(&kv);
    if (wl_model_release(f->m) && !failed)
        failed = 1, snprintf(msg, sizeof msg, "%s", wl_error());
    if (failed)
        snprintf(f->message, sizeof f->message, "%s", msg);
    return failed ? f : NULL;
}

int wl_engine_follow(weft_runtime *rt, wl_model *m, int kv_pages, int max_seqs, int max_tokens,
                     wl_link *l)
{
    follower f = {m, l, kv_pages, max_seqs, max_tokens, ""};
    weft_task *t;
    void *failed = NULL;
    if (wl_link_rank(l) == 0)
        return wl_fail("engine: rank 0 of the pipeline runs the engine");
    if (max_seqs < 1 || max_tokens < 1 || kv_pages < 1)
        return wl_fail("engine: %d sequences of %d tokens in %d pages", max_seqs, max_tokens,
                       kv_pages);
    if (weft_spawn(rt, &t, follow_task, &f, NULL) != WEFT_OK || weft_join(t, &failed) != WEFT_OK)
        return wl_fail("engine: the follower's task: %s", weft_last_error());
    return failed ? wl_fail("%s", f.message) : 0;
}

static void *draft_setup_task(void *arg)
{
    wl_engine *e = arg;
    if (wl_model_upload(e->draft) ||
        wl_kv_create(&e->draft_kv, e->draft, e->kv_pages, WL_KV_PAGE)) {
        snprintf(e->message, sizeof e->message, "the draft model: %s", wl_error());
        drop_draft(e);
        return e;
    }
    return NULL;
}

int wl_engine_set_draft(wl_engine *e, wl_model *d)
{
    weft_task *t;
    void *failed = NULL;
    if (e->draft)
        return wl_fail("the engine has a draft model already");
    if (split(e))
        return wl_fail("a split model's engine (a pipeline, tensor parallel) takes no draft "
                       "model");
    if (d == e->model)
        return wl_fail("the draft model is the target itself (open its files a second time)");
    if (d->cfg.vocab > e->model->cfg.vocab)
        return wl_fail("the draft model's vocabulary (%d tokens) is larger than the target's (%d): "
                       "a draft must share the target's tokenizer",
                       d->cfg.vocab, e->model->cfg.vocab);
    e->draft = d;
    if (weft_spawn(e->rt, &t, draft_setup_task, e, NULL) != WEFT_OK ||
        weft_join(t, &failed) != WEFT_OK) {
        e->draft = NULL; /* nothing of it was made */
        return wl_fail("engine: the draft's setup task: %s", weft_last_error());
    }
    return failed ? wl_fail("%s", e->message) : 0;
}

int wl_engine_stop(wl_engine *e)
{
    weft_task *t;
    e->message[0] = 0;
    if (e->batcher_task) {
        wl_batcher_close(e->batcher);
        weft_join(e->batcher_task, NULL);
        e->batcher_task = NULL;
    }
    if (weft_spawn(e->rt, &t, teardown_task, e, NULL) != WEFT_OK || weft_join(t, NULL) != WEFT_OK)
        snprintf(e->message, sizeof e->message, "engine: the teardown task: %s", weft_last_error());
    if (e->tp)
        end_tp(e);
    if (e->pages_back)
        weft_cond_destroy(e->pages_back);
    if (e->lock)
        weft_mutex_destroy(e->lock);
    e->pages_back = NULL;
    e->lock = NULL;
    return e->message[0] ? wl_fail("%s", e->message) : 0;
}

void wl_engine_stats(wl_engine *e, wl_engine_counts *out)
{
    memset(out, 0, sizeof *out);
    if (!e->lock)
        return;
    weft_mutex_lock(e->lock); /* from a thread too: it then blocks */
    out->running = e->running;
    out->queued = e->queued;
    out->reserved_pages = e->reserved_pages;
    out->preemptions = e->preemptions;
    out->swaps = e->swaps;
    weft_mutex_unlock(e->lock);
    out->pages = e->kv.pages;
    out->used_pages = e->kv.pages - wl_kv_free_pages(&e->kv);
    pthread_mutex_lock(&e->kv.lock);
    out->shared_tokens = e->kv.shared_tokens;
    pthread_mutex_unlock(&e->kv.lock);
    wl_batcher_stats(e->batcher, &out->steps, &out->rows);
}

/* Under the engine's lock, after a change that may admit the queue's
 * head (pages or a place given back, a new head): only the head is woken,
 * so a thousand waiters cost no more than one. */
static void wake_head(wl_engine *e)
{
    if (e->queue)
        weft_cond_signal(e->queue->turn);
}

/* Waits (suspended) until w is the queue's head and its pages and (when
 * it decodes in the batch) a place there are free, or g is cancelled;
 * a page a running batch generation is kept free besides, room for their
 * growth, so that an admission does not at once preempt another.
 * Returns 0 when admitted. */
static int admit(wl_engine *e, const wl_gen *g, wl_waiter *w)
{
    if (!w->turn && weft_cond_create(&w->turn) != WEFT_OK)
        return wl_fail("generation: %s", weft_last_error());
    if (weft_mutex_lock(e->lock) != WEFT_OK)
        return wl_fail("generation: cancelled");
    wl_waiter **at = &e->queue; /* behind every waiter of its rank or a higher one */
    while (*at && ((*at)->rank < w->rank || ((*at)->rank == w->rank && !w->front)))
        at = &(*at)->next;
    w->next = *at;
    *at = w;
    e->queued++;
    int cancelled = 0;
    while (!(e->queue == w && (!w->place || e->placed < e->max_seqs) &&
             e->reserved_pages + w->pages + e->placed <= e->kv.pages)) {
        /* a disconnected client is seen by polling: a short timed wait */
        int rc = weft_cond_wait_until(w->turn, e->lock, weft_deadline_in_ns(50 * 1000000ull));
        if (rc == WEFT_ECANCELED || (g->cancelled && g->cancelled(g->ctx))) {
            cancelled = 1;
            break;
        }
    }
    wl_waiter **p = &e->queue;
    while (*p != w)
        p = &(*p)->next;
    *p = w->next;
    e->queued--;
    if (!cancelled) {
        e->running++;
        e->placed += w->place;
        e->reserved_pages += w->pages;
        if (!w->serial)
            w->serial = ++e->admissions;
        w->preempt = 0;
        w->next = e->runners;
        e->runners = w;
    }
    wake_head(e); /* a new head, maybe */
    weft_mutex_unlock(e->lock);
    return cancelled ? -1 : 0;
}

static void release(wl_engine *e, wl_waiter *w)
{
    wl_lock_always(e->lock);
    wl_waiter **p = &e->runners;
    while (*p != w)
        p = &(*p)->next;
    *p = w->next;
    w->seq = NULL;
    e->running--;
    e->placed -= w->place;
    e->reserved_pages -= w->pages;
    weft_cond_broadcast(e->pages_back); /* the growing generations */
    wake_head(e);
    weft_mutex_unlock(e->lock);
}

static int is_eos(const wl_config *c, int id)
{
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id)
            return 1;
    return 0;
}

int wl_engine_check(const wl_engine *e, int n_prompt, int max_tokens)
{
    long total = (long)n_prompt + max_tokens;
    if (n_prompt < 1)
        return wl_fail("the prompt is empty");
    if (max_tokens < 1)
        return wl_fail("max_tokens must be at least 1");
    if (total > e->max_tokens)
        return wl_fail("this model's context is %d tokens; the prompt's %d and max_tokens %d "
                       "make %ld",
                       e->max_tokens, n_prompt, max_tokens, total);
    if (pages_for(e, (int)total) > e->kv.pages)
        return wl_fail("%ld tokens need %d KV pages; the cache has %d", total,
                       pages_for(e, (int)total), e->kv.pages);
    return 0;
}

/* Hands a generated token to on_token and says whether the generation
 * ends there (an end-of-sequence token, on_token's stop or cancel,
 * cancellation, max_tokens): the one rule of the plain and the speculative
 * loops, so the two end alike. */
static int hand_on(const wl_gen *g, const wl_config *c, int32_t id, const float *logits, int *n,
                   wl_finish *finish)
{
    int eos = !g->ignore_eos && is_eos(c, id);
    int stop = g->on_token(g->ctx, id, eos, logits);
    (*n)++;
    if (stop < 0 || (g->cancelled && g->cancelled(g->ctx))) {
        *finish = WL_FINISH_CANCELLED;
        return 1;
    }
    if (eos || stop > 0) {
        *finish = WL_FINISH_STOP;
        return 1;
    }
    if (*n == g->max_tokens) {
        *finish = WL_FINISH_LENGTH;
        return 1;
    }
    return 0;
}

/* A speculative generation's proposer: n-grams of the text so far, or
 * the draft model's own decoding in a sequence of its own, which holds a
 * prefix of the generation's text: after a round it keeps what the target
 * accepted (rewound past the rest) and catches up on the rest of the text
 * at the next round's start. */
typedef struct proposer {
    int ngram;          /* the longest n-gram looked up (n-grams) */
    wl_seq *seq;        /* the draft model's sequence; NULL: n-grams */
    wl_sampler sampler; /* the draft's draws: the generation's settings, its own generator */
    int vocab, step;    /* the draft's vocabulary, and its sequence's most tokens a call */
    wl_batch *batch;    /* the draft's one-token steps: a graph launch each on a GPU */
    /* Sampling: the distributions the draft tokens were drawn from, each
     * made once (in full), kept (its nucleus alone) and read again by the
     * acceptance; NULL when greedy, whose drafts are argmaxes. */
    wl_dist full, *q;
    int k;
} proposer;

static int proposer_open(proposer *p, wl_engine *e, const wl_gen *g)
{
    memset(p, 0, sizeof *p);
    p->ngram = g->ngram ? g->ngram : WL_NGRAM_DEFAULT;
    if (!g->use_draft)
        return 0;
    p->sampler = g->sampler;
    p->sampler.state ^= 0x9e3779b97f4a7c15ull; /* draws apart from the target's */
    p->sampler.drawn = 0;
    p->vocab = e->draft->cfg.vocab;
    /* the prompt's catch-up in chunks, then a round's 1 or 2 tokens */
    p->step = g->n_prompt + 1 < WL_PREFILL_CHUNK ? g->n_prompt + 1 : WL_PREFILL_CHUNK;
    if (p->sampler.temperature > 0) {
        p->k = g->speculate_k;
        if (!(p->q = calloc((size_t)p->k, sizeof *p->q)))
            return wl_fail("out of memory for %d draft distributions", p->k);
        if (wl_dist_alloc(&p->full, p->vocab))
            return -1;
    }
    int tokens = g->n_prompt + g->max_tokens;
    if (wl_seq_create(&p->seq, e->draft, &e->draft_kv, tokens, p->step))
        return -1;
    return wl_batch_create(&p->batch, e->draft, &e->draft_kv, 1, tokens, 0);
}

static void proposer_close(proposer *p)
{
    wl_batch_destroy(p->batch);
    wl_seq_destroy(p->seq);
    for (int i = 0; p->q && i < p->k; i++)
        wl_dist_free(&p->q[i]);
    free(p->q);
    wl_dist_free(&p->full);
}

/* Up to k draft tokens to follow toks[0, len); returns how many. The draft
 * model's sequence ends holding toks and all but the last of them. */
static int propose(proposer *p, const int32_t *toks, int len, int k, int32_t *draft)
{
    if (!p->seq)
        return wl_ngram_propose(toks, len, p->ngram, k, draft);
    if (k < 1)
        return 0;
    const float *row = NULL;
    if (wl_seq_length(p->seq) >= len) /* a round always leaves it a token to catch up on */
        return wl_fail("the draft model's sequence holds %d tokens of a text of %d",
                       wl_seq_length(p->seq), len);
    for (int at = wl_seq_length(p->seq); at < len;) { /* catch up on the text */
        int n = len - at < p->step ? len - at : p->step;
        if (wl_forward(p->seq, toks + at, n, &row))
            return -1;
        at += n;
    }
    for (int i = 0; i < k; i++) {
        if (!p->q)
            draft[i] = wl_sample(&p->sampler, row, p->vocab);
        else if (wl_sampler_dist(&p->sampler, row, p->vocab, &p->full) ||
                 wl_dist_copy(&p->q[i], &p->full))
            return -1;
        else
            draft[i] = wl_dist_draw(&p->sampler, &p->q[i]);
        if (i + 1 < k && wl_forward_batch(p->batch, &p->seq, &draft[i], 1, &row, NULL, NULL))
            return -1;
    }
    return k;
}

/* After a round that kept toks[0, len): the draft model's sequence keeps
 * no more than that. */
static int proposer_keep(proposer *p, int len)
{
    return p->seq && wl_seq_length(p->seq) > len ? wl_seq_rewind(p->seq, len) : 0;
}

/* The decoding of a speculative generation, alone (not in the batcher),
 * from its prefill's logits. Each round verifies the last token and the
 * draft in one forward pass; the sequence then keeps the last token
 * and the accepted draft tokens (rewound past the rest), and the round's
 * last token (the correction or bonus) is fed with the next round's
 * draft. The draft is cut to the tokens max_tokens still allows less one,
 * so the round's tokens never pass max_tokens and its positions stay
 * below prompt + max_tokens, within the sequence's pages. */
static int speculate(wl_engine *e, const wl_gen *g, wl_seq *s, const float *logits,
                     wl_finish *finish)
{
    const wl_config *c = &e->model->cfg;
    int V = c->vocab, n = 0, rc = -1;
    wl_sampler sampler = g->sampler;
    wl_spec_stats st = {0};
    int32_t in[WL_SPEC_MAX_K + 1], out[WL_SPEC_MAX_K + 1];
    proposer pr;
    /* the prompt and every token handed on: what the proposer reads */
    int32_t *toks = malloc(((size_t)g->n_prompt + g->max_tokens) * sizeof *toks);
    int len = g->n_prompt;
    if (!toks)
        return wl_fail("out of memory for %d tokens", g->n_prompt + g->max_tokens);
    memcpy(toks, g->prompt, (size_t)g->n_prompt * sizeof *toks);
    if (proposer_open(&pr, e, g))
        goto out;
    int32_t id = wl_sample(&sampler, logits, V);
    toks[len++] = id;
    if (hand_on(g, c, id, logits, &n, finish))
        goto done;
    for (;;) {
        const float *rows;
        int room = g->max_tokens - n - 1; /* a round hands on its draft's accepted + 1 */
        int k = g->speculate_k < room ? g->speculate_k : room;
        if (weft_cancelled()) {
            wl_fail("generation: the sequence's task was cancelled");
            goto out;
        }
        in[0] = id; /* the sequence holds everything before it (len - 1 tokens) */
        int drafted = propose(&pr, toks, len, k, in + 1);
        if (drafted < 0 || wl_forward_rows(s, in, drafted + 1, &rows))
            goto out;
        int m = wl_spec_accept(&sampler, rows, V, in + 1, drafted, pr.seq ? pr.q : NULL, out);
        st.rounds++;
        st.proposed += drafted;
        st.accepted += m - 1;
        /* keep id and the accepted draft; out[m - 1] is fed next round */
        if (wl_seq_rewind(s, len + m - 1) || proposer_keep(&pr, len + m - 1))
            goto out;
        for (int j = 0; j < m; j++) {
            id = out[j];
            toks[len++] = id;
            st.tokens++;
            if (hand_on(g, c, id, rows + (size_t)j * V, &n, finish))
                goto done;
        }
    }
done:
    rc = 0;
out:
    if (g->spec_stats)
        *g->spec_stats = st;
    proposer_close(&pr);
    free(toks);
    return rc;
}

/* grow's answer when the generation's own hook cancels it: it ends as
 * hand_on ends a cancelled one. */
#define CANCELLED 2

/* Whether w has been told to give its pages back. */
static int told_to_go(wl_engine *e, const wl_waiter *w)
{
    wl_lock_always(e->lock);
    int go = w->preempt;
    weft_mutex_unlock(e->lock);
    return go;
}

typedef struct prefilling {
    wl_engine *e;
    const wl_waiter *w;
} prefilling;

static int prefill_told_to_go(void *ctx)
{
    const prefilling *p = ctx;
    return told_to_go(p->e, p->w);
}

/* Whether the cache cannot promise w need pages (under the engine's lock). */
static int short_of(const wl_engine *e, const wl_waiter *w, int need)
{
    return e->reserved_pages - w->pages + need > e->kv.pages;
}

/* w's reservation grown to need pages. While the cache cannot promise
 * them, the newest running generation in the batch is told to give its
 * pages back (wl_batcher_evict wakes it wherever it waits on the batch) and
 * w waits for them; w itself, when it is the newest. Returns 0,
 * WL_PREEMPTED (w is to give its pages back), CANCELLED (the caller's
 * hook said so) or -1 (the task was cancelled). */
static int grow(wl_engine *e, const wl_gen *g, wl_waiter *w, int need)
{
    int rc = 0;
    wl_lock_always(e->lock);
    while (!w->preempt && short_of(e, w, need)) {
        wl_waiter *newest = NULL;
        for (wl_waiter *r = e->runners; r; r = r->next)
            if (r->place && !r->preempt && r->seq && (!newest || r->serial > newest->serial))
                newest = r;
        if (newest == w)
            break;
        if (newest) {
            newest->preempt = 1;
            e->preemptions++;
            wl_batcher_evict(e->batcher, newest->seq);
            weft_cond_broadcast(e->pages_back); /* it may be growing too */
        }
        int wr = weft_cond_wait_until(e->pages_back, e->lock, weft_deadline_in_ns(50 * 1000000ull));
        if (wr == WEFT_ECANCELED) {
            rc = wl_fail("generation: the task was cancelled while it waited for KV pages");
            break;
        }
        if (g->cancelled && g->cancelled(g->ctx)) {
            rc = CANCELLED;
            break;
        }
    }
    if (!rc && (w->preempt || short_of(e, w, need))) {
        if (!w->preempt)
            e->preemptions++; /* the newest: itself */
        rc = WL_PREEMPTED;
    } else if (!rc) {
        e->reserved_pages += need - w->pages;
        w->pages = need;
    }
    weft_mutex_unlock(e->lock);
    return rc ? rc : 0;
}

/* The cache filled with toks[0, n) in chunks, each after the batcher's next
 * step while others decode (a long prompt delays their tokens by a chunk
 * at most); *logits the last chunk's. WL_PREEMPTED when w is told to give
 * its pages back between chunks. */
static int prefill(wl_engine *e, const wl_waiter *w, wl_seq *s, const int32_t *toks, int n,
                   int chunk, const float **logits)
{
    prefilling p = {e, w};
    for (int at = wl_seq_share_prefix(s, toks, n); at < n;) {
        int len = n - at < chunk ? n - at : chunk, rc;
        if (wl_forward(s, toks + at, len, logits))
            return -1;
        at += len;
        if (at < n && (rc = wl_batcher_next_step(e->batcher, prefill_told_to_go, &p)) != 0)
            return rc;
        if (at < n && told_to_go(e, w))
            return WL_PREEMPTED;
    }
    return 0;
}

/* The cache filled with toks[0, n) through the batcher, a chunk a step
 * beside the other members' decode tokens (s has joined it); *logits the
 * last chunk's. WL_PREEMPTED when w is evicted meanwhile. */
static int prefill_in_steps(wl_engine *e, wl_seq *s, const int32_t *toks, int n, int chunk,
                            const float **logits)
{
    for (int at = wl_seq_share_prefix(s, toks, n); at < n;) {
        int len = n - at < chunk ? n - at : chunk, rc;
        rc = wl_batcher_prefill(e->batcher, s, toks + at, len, NULL, at + len == n ? logits : NULL,
                                NULL);
        if (rc)
            return rc;
        at += len;
    }
    return 0;
}

/* Host memory for bytes of a preempted generation's cache, within the
 * engine's swap budget; NULL: recompute instead. */
static void *take_swap(wl_engine *e, size_t bytes)
{
    wl_lock_always(e->lock);
    int fits = e->swap_bytes && !split(e) && e->swapped + bytes <= e->swap_bytes;
    if (fits)
        e->swapped += bytes;
    weft_mutex_unlock(e->lock);
    void *buf = fits ? malloc(bytes) : NULL;
    if (fits && !buf) {
        wl_lock_always(e->lock);
        e->swapped -= bytes;
        weft_mutex_unlock(e->lock);
    }
    return buf;
}

static void give_swap(wl_engine *e, void *buf, size_t bytes)
{
    if (!buf)
        return;
    free(buf);
    wl_lock_always(e->lock);
    e->swapped -= bytes;
    weft_mutex_unlock(e->lock);
}

/* Sets w's sequence (NULL: none), which a preemption evicts. */
static void set_seq(wl_engine *e, wl_waiter *w, const wl_seq *s)
{
    wl_lock_always(e->lock);
    w->seq = s;
    weft_mutex_unlock(e->lock);
}

int wl_engine_generate(wl_engine *e, const wl_gen *g, wl_finish *finish)
{
    const wl_config *c = &e->model->cfg;
    /* a batch generation starts with its prompt's pages and its first
     * step's; a speculative one takes all it can need */
    wl_waiter w = {.pages = pages_for(e, g->n_prompt + (g->speculate_k ? g->max_tokens : 1)),
                   .place = !g->speculate_k,
                   .rank = rank_of(g->priority)};
    wl_sampler sampler = g->sampler;
    wl_seq *s = NULL;
    void *swap = NULL; /* a preempted generation's cache, in host memory */
    size_t swap_size = 0;
    const float *logits = NULL;
    int joined = 0, admitted = 0, rc = -1, n = 0;
    char msg[512] = "";
    wl_pen_track pen = {0}; /* what the penalties count, when there are some */
    int penalised = wl_penalties_active(&g->penalties);
    float *pen_scratch = NULL; /* the prefill's penalised logits */
    int32_t *toks = NULL;      /* the prompt, then each token handed on */
    /* a speculative round's verify pass takes up to speculate_k + 1 tokens */
    int spec_step = 1 + (g->speculate_k < g->max_tokens - 1 ? g->speculate_k : g->max_tokens - 1);
    *finish = WL_FINISH_CANCELLED;
    if (g->spec_stats)
        memset(g->spec_stats, 0, sizeof *g->spec_stats);
    if (wl_engine_check(e, g->n_prompt, g->max_tokens))
        return -1;
    if (g->speculate_k < 0 || g->speculate_k > WL_SPEC_MAX_K || g->ngram < 0 ||
        g->ngram > WL_NGRAM_MAX)
        return wl_fail("speculative decoding: %d draft tokens a round (0 to %d) with n-grams up "
                       "to %d (1 to %d, or 0: %d)",
                       g->speculate_k, WL_SPEC_MAX_K, g->ngram, WL_NGRAM_MAX, WL_NGRAM_DEFAULT);
    if (g->use_draft && (!g->speculate_k || g->ngram || !e->draft))
        return wl_fail("%s", !g->speculate_k ? "a draft model proposes for speculative decoding: "
                                               "give speculate_k too"
                             : g->ngram      ? "the draft model or n-grams propose, not both"
                                             : "the engine has no draft model");
    if (g->speculate_k && split(e))
        return wl_fail("a split model's engine (a pipeline, tensor parallel) does not decode "
                       "speculatively");
    if (g->speculate_k && wl_penalties_active(&g->penalties))
        return wl_fail("speculative decoding does not take repetition, frequency or presence "
                       "penalties");
    if (g->penalties.n_bias > WL_MAX_BIAS)
        return wl_fail("%d logit biases; at most %d", g->penalties.n_bias, WL_MAX_BIAS);
    if (!(toks = malloc(((size_t)g->n_prompt + g->max_tokens) * sizeof *toks)))
        return wl_fail("out of memory for %d tokens", g->n_prompt + g->max_tokens);
    memcpy(toks, g->prompt, (size_t)g->n_prompt * sizeof *toks);
    if (penalised &&
        (wl_pen_track_init(&pen, &g->penalties, g->prompt, g->n_prompt, g->max_tokens, c->vocab) ||
         !(pen_scratch = malloc((size_t)c->vocab * sizeof *pen_scratch)))) {
        if (pen.adjust)
            wl_fail("out of memory for the penalised logits");
        free(toks);
        wl_pen_track_free(&pen);
        return -1;
    }
    int chunk =
        e->prefill_chunk > 0 && e->prefill_chunk < g->n_prompt ? e->prefill_chunk : g->n_prompt;
    /* a batch generation's prompt goes through the batcher's steps when its
     * chunks fit them; else (whole prompts, longer chunks, speculation) it
     * prefills itself and joins after */
    if (split(e) && chunk > e->batcher_chunk) /* every part runs the batcher's steps alone */
        chunk = e->batcher_chunk;
    int in_steps =
        !g->speculate_k && (e->prefill_chunk > 0 || split(e)) && chunk <= e->batcher_chunk;
    /* A life: admitted, the cache filled, then decoding; again from
     * admission after a preemption, with the tokens so far. After the
     * first token the cache holds all but the last token handed on, id,
     * which the next step feeds. */
    int32_t id = -1;
    for (;;) {
        if (admit(e, g, &w)) {
            rc = 0; /* cancelled while queued */
            goto out;
        }
        admitted = 1;
        int held = g->n_prompt + (n ? n - 1 : 0);
        if (wl_seq_create(&s, e->model, &e->kv, g->n_prompt + g->max_tokens,
                          in_steps                              ? 1
                          : g->speculate_k && spec_step > chunk ? spec_step
                                                                : chunk))
            goto out;
        set_seq(e, &w, s);
        int r = 0;
        if (swap) { /* its cache back as it was: nothing to recompute */
            r = wl_seq_swap_in(s, swap, held);
            give_swap(e, swap, swap_size);
            swap = NULL;
        } else {
            if (in_steps && !(r = wl_batcher_join(e->batcher, s)))
                joined = 1;
            if (r == 0)
                r = in_steps ? prefill_in_steps(e, s, toks, held, chunk, &logits)
                             : prefill(e, &w, s, toks, held, chunk, &logits);
        }
        if (r == 0 && !n)
            wl_seq_publish_prefix(s, g->prompt, g->n_prompt);
        if (r == 0 && g->speculate_k) { /* alone, outside the batcher */
            rc = speculate(e, g, s, logits, finish);
            goto out;
        }
        if (r == 0 && !joined && !(r = wl_batcher_join(e->batcher, s)))
            joined = 1;
        if (r == 0 && told_to_go(e, &w)) /* told before it joined, where no eviction reached */
            r = WL_PREEMPTED;
        if (r == 0 && !n) {
            /* the prefill's token, drawn here from its logits by the ops
             * the steps draw with, with the same (seed, offset) */
            const float *draw_from = logits;
            if (penalised) {
                memcpy(pen_scratch, logits, (size_t)c->vocab * sizeof *pen_scratch);
                if (weft_penalize(NULL, WEFT_DTYPE_F32, pen_scratch, 1, (size_t)c->vocab,
                                  (size_t)c->vocab, &pen.row, pen.adjust) != WEFT_OK) {
                    wl_fail("penalties: %s", weft_last_error());
                    goto out;
                }
                draw_from = pen_scratch;
            }
            id = wl_sample(&sampler, draw_from, c->vocab);
            if (penalised)
                wl_pen_track_add(&pen, id);
            toks[g->n_prompt + n] = id;
            if (hand_on(g, c, id, logits, &n, finish))
                break;
        }
        /* each step penalises and draws on the backend and copies back
         * the id alone */
        while (r == 0) {
            int need = pages_for(e, g->n_prompt + n); /* what it holds, and id */
            if (need > w.pages && (r = grow(e, g, &w, need)) != 0)
                break;
            wl_draw draw = {wl_sampler_next(&sampler), penalised ? &pen : NULL};
            int32_t picked;
            logits = NULL;
            if ((r = wl_batcher_step(e->batcher, s, id, &draw, g->wants_logits ? &logits : NULL,
                                     &picked)) != 0) {
                if (r == WL_PREEMPTED)
                    sampler.drawn--; /* the draw was not made: the next step makes it */
                break;
            }
            id = picked;
            if (penalised)
                wl_pen_track_add(&pen, id);
            toks[g->n_prompt + n] = id;
            if (hand_on(g, c, id, logits, &n, finish))
                goto done;
        }
        if (r == CANCELLED)
            goto done; /* *finish says so */
        if (r != WL_PREEMPTED)
            goto out;
        /* preempted: the pages and the place go back; admitted again, the
         * cache is refilled with what it held: from host memory when it is
         * decoding and the swap budget holds its cache, else recomputed */
        if (joined)
            wl_batcher_leave(e->batcher, s);
        joined = 0;
        int holds = g->n_prompt + (n ? n - 1 : 0);
        if (n && wl_seq_length(s) == holds) {
            swap_size = wl_seq_swap_bytes(e->model, holds);
            if ((swap = take_swap(e, swap_size)) && wl_seq_swap_out(s, swap)) {
                give_swap(e, swap, swap_size); /* recomputed instead */
                swap = NULL;
            }
            if (swap) {
                wl_lock_always(e->lock);
                e->swaps++;
                weft_mutex_unlock(e->lock);
            }
        }
        wl_seq_destroy(s);
        s = NULL;
        release(e, &w);
        admitted = 0;
        w.front = 1;
        w.pages = pages_for(e, g->n_prompt + (n ? n - 1 : 0) + 1);
    }
done:
    rc = 0;
out:
    if (rc) /* the line is the thread's, and the waits below may move the task */
        snprintf(msg, sizeof msg, "%s", wl_error());
    if (joined)
        wl_batcher_leave(e->batcher, s);
    wl_seq_destroy(s); /* its pages go back */
    give_swap(e, swap, swap_size);
    if (admitted)
        release(e, &w);
    if (w.turn) /* out of the queue: nothing signals it any more */
        weft_cond_destroy(w.turn);
    free(pen_scratch);
    free(toks);
    wl_pen_track_free(&pen);
    return rc ? wl_fail("%s", msg) : 0;
}
