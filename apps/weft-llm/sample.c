/*
 * sample.c - the next token from the logits: greedy, or a draw at a
 * temperature from the top-k tokens and the top-p mass of those, with the
 * sampler's own seeded generator (so a seed gives the same text).
 *
 * A draw is weft_sample's, whether the decode step made it on the backend
 * or wl_sample makes it here from logits on the host (penalised ones, or a
 * prefill's): the same op with the same (seed, offset), so the path taken
 * does not change the text. Speculative decoding's acceptance of a draft
 * token (wl_sample_draft) needs the probabilities themselves, the
 * target's and the draft model's: it reads wl_sampler_dist's, the same
 * distribution in double.
 */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "llm.h"

typedef struct cand {
    float logit;
    int id;
} cand;

/* The order tokens are taken in: larger logit first, equal logits by
 * smaller id, so the order is total. */
static int before(cand x, cand y)
{
    return x.logit != y.logit ? x.logit > y.logit : x.id < y.id;
}

/* Restore the heap (its first token the one taken first) below i. */
static void sift_down(cand *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, best = i;
        if (l < n && before(h[l], h[best]))
            best = l;
        if (l + 1 < n && before(h[l + 1], h[best]))
            best = l + 1;
        if (best == i)
            return;
        cand t = h[i];
        h[i] = h[best];
        h[best] = t;
        i = best;
    }
}

/* The heap's first token, taken out. */
static cand pop(cand *h, int *n)
{
    cand top = h[0];
    h[0] = h[--*n];
    sift_down(h, *n, 0);
    return top;
}

static int argmax(const float *logits, int vocab)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int wl_dist_alloc(wl_dist *d, int vocab)
{
    d->n = 0;
    d->cap = vocab > 0 ? vocab : 1;
    d->sum = 0;
    d->id = malloc((size_t)(vocab > 0 ? vocab : 1) * sizeof *d->id);
    d->w = malloc((size_t)(vocab > 0 ? vocab : 1) * sizeof *d->w);
    if (!d->id || !d->w) {
        wl_dist_free(d);
        return wl_fail("out of memory for a distribution over %d tokens", vocab);
    }
    return 0;
}

void wl_dist_free(wl_dist *d)
{
    free(d->id);
    free(d->w);
    d->id = NULL;
    d->w = NULL;
    d->n = d->cap = 0;
}

int wl_dist_copy(wl_dist *dst, const wl_dist *src)
{
    if (dst->cap < src->n) {
        int32_t *id = realloc(dst->id, (size_t)src->n * sizeof *id);
        if (id)
            dst->id = id;
        double *w = id ? realloc(dst->w, (size_t)src->n * sizeof *w) : NULL;
        if (!w)
            return wl_fail("out of memory for a distribution of %d tokens", src->n);
        dst->w = w;
        dst->cap = src->n;
    }
    memcpy(dst->id, src->id, (size_t)src->n * sizeof *dst->id);
    memcpy(dst->w, src->w, (size_t)src->n * sizeof *dst->w);
    dst->n = src->n;
    dst->sum = src->sum;
    return 0;
}

/* Tokens are taken from a heap in order, as far as the distribution
 * reaches (top_k tokens; or the fewest whose mass reaches top_p, against
 * the whole vocabulary's mass summed first): a real model's nucleus is a
 * few tokens of a vocabulary of 10^5, which a full sort would order a
 * draft token at a time. */
int wl_sampler_dist(const wl_sampler *s, const float *logits, int vocab, wl_dist *d)
{
    if (!(s->temperature > 0)) {
        d->n = 1;
        d->id[0] = argmax(logits, vocab);
        d->w[0] = d->sum = 1;
        return 0;
    }
    cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c)
        return wl_fail("out of memory for sampling over %d tokens", vocab);
    int top = 0;
    for (int i = 0; i < vocab; i++) {
        c[i] = (cand){logits[i] / s->temperature, i};
        if (before(c[i], c[top]))
            top = i;
    }
    double first = c[top].logit;
    int n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab, left = vocab;
    bool nucleus = s->top_p > 0 && s->top_p < 1;
    /* top_p alone stops the heap at its share of the whole mass; after a
     * top_k it is a share of the k taken, cut once they are */
    bool p_of_all = nucleus && n == vocab, p_of_top_k = nucleus && n < vocab;
    double total = 0; /* the mass top_p is a share of */
    if (p_of_all)
        for (int i = 0; i < vocab; i++)
            total += exp((double)c[i].logit - first);
    for (int i = vocab / 2 - 1; i >= 0; i--)
        sift_down(c, vocab, i);
    double sum = 0, *p = d->w;
    int taken = 0;
    while (taken < n) {
        cand t = pop(c, &left);
        d->id[taken] = t.id;
        sum += p[taken] = exp((double)t.logit - first);
        taken++;
        if (p_of_all && sum >= s->top_p * total)
            break;
    }
    if (p_of_top_k) {
        double acc = 0;
        for (int i = 0; i < taken; i++) {
            acc += p[i] / sum;
            if (acc >= s->top_p) {
                taken = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < taken; i++)
            sum += p[i];
    }
    d->n = taken;
    d->sum = sum;
    free(c);
    return 0;
}

/* A draw from d's tokens of nonzero weight, whose weights total sum. */
static int draw(wl_sampler *s, const wl_dist *d, double sum)
{
    double u = wl_rand_uniform(&s->state) * sum;
    int id = -1;
    for (int i = 0; i < d->n; i++) {
        if (d->w[i] <= 0)
            continue;
        id = d->id[i]; /* the last one kept, should rounding leave u past them all */
        if (u < d->w[i])
            break;
        u -= d->w[i];
    }
    return id;
}

int32_t wl_dist_draw(wl_sampler *s, const wl_dist *d)
{
    return draw(s, d, d->sum);
}

weft_sampling wl_sampler_next(wl_sampler *s)
{
    weft_sampling p = {.temperature = s->temperature > 0 ? s->temperature : 0,
                       .top_p = s->top_p,
                       .top_k = s->top_k,
                       .seed = s->state,
                       .offset = s->drawn++};
    return p;
}

int wl_sample(wl_sampler *s, const float *logits, int vocab)
{
    weft_sampling p = wl_sampler_next(s);
    int32_t id;
    if (!(s->temperature > 0) ||
        weft_sample(NULL, WEFT_DTYPE_F32, &id, logits, 1, (size_t)vocab, (size_t)vocab, &p))
        return argmax(logits, vocab); /* or out of memory: the likeliest token */
    return id;
}

int wl_sample_draft(wl_sampler *s, const float *logits, int vocab, int32_t draft, const wl_dist *dq,
                    int *accepted)
{
    if (!(s->temperature > 0)) {
        int id = argmax(logits, vocab);
        *accepted = id == draft;
        return id;
    }
    wl_dist d = {0};
    double *q = NULL; /* the draft model's probabilities by id */
    int id = -1;
    *accepted = 0;
    if (wl_dist_alloc(&d, vocab) || wl_sampler_dist(s, logits, vocab, &d))
        goto out;
    if (dq) {
        if (!(q = calloc((size_t)vocab, sizeof *q)))
            goto out;
        for (int i = 0; i < dq->n; i++)
            if (dq->id[i] >= 0 && dq->id[i] < vocab)
                q[dq->id[i]] = dq->w[i] / dq->sum;
    }
    double px = 0, qx = q ? q[draft] : 1;
    for (int i = 0; i < d.n; i++)
        if (d.id[i] == draft)
            px = d.w[i] / d.sum;
    /* accepted with probability min(1, p(x) / q(x)) */
    if (wl_rand_uniform(&s->state) * qx < px) {
        *accepted = 1;
        id = draft;
        goto out;
    }
    /* rejected: drawn from the residual max(0, p - q), renormalised (with
     * q one-hot at x, p without x); its total summed afresh, not as
     * 1 - p(x), which cancels */
    double rest = 0;
    for (int i = 0; i < d.n; i++) {
        double qi = q ? q[d.id[i]] : d.id[i] == draft;
        d.w[i] = fmax(0, d.w[i] / d.sum - qi);
        rest += d.w[i];
    }
    if (rest > 0) {
        id = draw(s, &d, rest);
    } else { /* p is within q: u < p(x) / q(x) = 1 in exact arithmetic */
        *accepted = 1;
        id = draft;
    }
out:
    if (id < 0) { /* out of memory: the likeliest token */
        id = argmax(logits, vocab);
        *accepted = id == draft;
    }
    wl_dist_free(&d);
    free(q);
    return id;
}

/* token's adjustment, made on its first mention (room for each token of
 * the prompt, the output and the biases was taken at the start) */
static weft_logit_adjust *adjustment(wl_pen_track *t, int32_t token)
{
    if (t->at[token] < 0) {
        t->at[token] = (int32_t)t->row.count++;
        t->adjust[t->at[token]] = (weft_logit_adjust){.token = token};
    }
    return &t->adjust[t->at[token]];
}

int wl_penalties_active(const wl_penalties *p)
{
    return (p->repetition != 0 && p->repetition != 1) || p->frequency != 0 || p->presence != 0 ||
           p->n_bias > 0;
}

int wl_pen_track_init(wl_pen_track *t, const wl_penalties *p, const int32_t *prompt, int n_prompt,
                      int max_tokens, int vocab)
{
    memset(t, 0, sizeof *t);
    t->row = (weft_penalties){
        .repetition = p->repetition, .frequency = p->frequency, .presence = p->presence};
    t->cap = n_prompt + max_tokens + p->n_bias;
    t->vocab = vocab;
    t->adjust = malloc((size_t)(t->cap > 0 ? t->cap : 1) * sizeof *t->adjust);
    t->at = malloc((size_t)vocab * sizeof *t->at);
    if (!t->adjust || !t->at) {
        wl_pen_track_free(t);
        return wl_fail("out of memory for the penalties' counts");
    }
    for (int i = 0; i < vocab; i++)
        t->at[i] = -1;
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] >= 0 && prompt[i] < vocab) /* others: wl_forward refuses */
            adjustment(t, prompt[i])->seen = 1;
    for (int i = 0; i < p->n_bias; i++)
        if (p->bias_ids[i] >= 0 && p->bias_ids[i] < vocab)
            adjustment(t, p->bias_ids[i])->bias += p->bias[i];
    return 0;
}

void wl_pen_track_add(wl_pen_track *t, int32_t token)
{
    if (token < 0 || token >= t->vocab)
        return;
    weft_logit_adjust *a = adjustment(t, token);
    a->seen = 1;
    a->count++;
}

void wl_pen_track_free(wl_pen_track *t)
{
    free(t->adjust);
    free(t->at);
    t->adjust = NULL;
    t->at = NULL;
}
