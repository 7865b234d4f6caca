/*
 * sample.c - the next token from the logits: greedy, or a draw at a
 * temperature from the top-k tokens and the top-p mass of those, with the
 * sampler's own seeded generator (so a seed gives the same text).
 */
#include <math.h>
#include <stdlib.h>

#include "llm.h"

typedef struct cand {
    float logit;
    int id;
} cand;

static int by_logit(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return x->id - y->id; /* equal logits: smaller id first, so the order is total */
}

static int argmax(const float *logits, int vocab)
{
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

int wl_sample(wl_sampler *s, const float *logits, int vocab)
{
    if (!(s->temperature > 0))
        return argmax(logits, vocab);
    cand *c = malloc((size_t)vocab * sizeof *c);
    if (!c)
        return argmax(logits, vocab);
    for (int i = 0; i < vocab; i++)
        c[i] = (cand){logits[i] / s->temperature, i};
    qsort(c, (size_t)vocab, sizeof *c, by_logit);
    int n = s->top_k > 0 && s->top_k < vocab ? s->top_k : vocab;
    double sum = 0, *p = malloc((size_t)n * sizeof *p);
    if (!p) {
        int id = c[0].id;
        free(c);
        return id;
    }
    for (int i = 0; i < n; i++)
        sum += p[i] = exp((double)c[i].logit - c[0].logit);
    if (s->top_p > 0 && s->top_p < 1) { /* the fewest tokens whose mass reaches top_p */
        double acc = 0;
        for (int i = 0; i < n; i++) {
            acc += p[i] / sum;
            if (acc >= s->top_p) {
                n = i + 1;
                break;
            }
        }
        sum = 0;
        for (int i = 0; i < n; i++)
            sum += p[i];
    }
    double u = wl_rand_uniform(&s->state) * sum;
    int id = c[n - 1].id;
    for (int i = 0; i < n; i++) {
        if (u < p[i]) {
            id = c[i].id;
            break;
        }
        u -= p[i];
    }
    free(p);
    free(c);
    return id;
}
