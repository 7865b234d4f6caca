/*
 * spec.c - speculative decoding's pure parts: the n-gram (prompt-lookup)
 * proposer and the acceptance of one verify round's draft. The engine
 * (engine.c) runs the rounds: it proposes (by n-grams, or by a draft
 * model's own decoding), verifies the draft in one wl_forward_rows and
 * rewinds the sequence past what was rejected.
 *
 * The n-gram proposer guesses that text repeats itself: the most recent
 * earlier occurrence of the last n tokens is likely followed by what
 * follows them now. It costs no model, and a draft it gets wrong costs
 * only the verify pass's extra rows (its logits are computed anyway),
 * never a wrong token: acceptance (wl_spec_accept) keeps the output
 * distributed as the target model's alone, token for token under greedy
 * decoding, whichever proposer drafted.
 */
#include "llm.h"

/* Whether toks[a, a + n) equals toks[b, b + n). */
static int same(const int32_t *toks, int a, int b, int n)
{
    for (int i = 0; i < n; i++)
        if (toks[a + i] != toks[b + i])
            return 0;
    return 1;
}

int wl_ngram_propose(const int32_t *toks, int n, int max_ngram, int k, int32_t *draft)
{
    if (k < 1 || n < 2)
        return 0;
    for (int len = max_ngram < n - 1 ? max_ngram : n - 1; len >= 1; len--) {
        int suffix = n - len;
        /* the most recent earlier start: it may overlap the suffix itself */
        for (int at = suffix - 1; at >= 0; at--) {
            if (!same(toks, at, suffix, len))
                continue;
            /* what followed it, read on into the draft past the end: the
             * source at + len + i is before n + i, so it is always written */
            int from = at + len;
            for (int i = 0; i < k; i++)
                draft[i] = from + i < n ? toks[from + i] : draft[from + i - n];
            return k;
        }
    }
    return 0;
}

int wl_spec_accept(wl_sampler *s, const float *rows, int vocab, const int32_t *draft, int n_draft,
                   const wl_dist *q, int32_t *out)
{
    for (int i = 0; i < n_draft; i++) {
        int accepted;
        out[i] = wl_sample_draft(s, rows + (size_t)i * vocab, vocab, draft[i], q ? &q[i] : NULL,
                                 &accepted);
        if (!accepted)
            return i + 1; /* the correction ends the round */
    }
    out[n_draft] = wl_sample(s, rows + (size_t)n_draft * vocab, vocab); /* the bonus */
    return n_draft + 1;
}
