/*
 * tokenizer_impl.h - the tokenizer's insides, shared by tokenizer.c (the
 * byte-level BPE of GPT-2, Llama 3 and Qwen, and everything common) and
 * tokenizer_sp.c (the SentencePiece-style BPE of the Llama 2 family).
 */
#ifndef WL_TOKENIZER_IMPL_H
#define WL_TOKENIZER_IMPL_H

#include <stdlib.h>

#include <jansson.h>
#include <pcre2.h>

#include "llm.h"
#include "strmap.h"

typedef enum split_behavior { ISOLATED, REMOVED, MERGED_PREV, MERGED_NEXT } split_behavior;

typedef struct step {
    pcre2_code *re;
    split_behavior behavior;
} step;

typedef struct added {
    char *content;
    size_t len;
    int id, special;
} added;

struct wl_tokenizer {
    wl_strmap vocab, merges;
    char **by_id; /* token text by id (NULL: no such id) */
    unsigned char *is_special;
    size_t n_ids, size; /* size: one more than the largest id */
    added *added;
    size_t n_added;
    step steps[8];
    int n_steps;
    int ignore_merges, add_prefix_space;
    /* SentencePiece mode */
    int sp, fuse_unk, unk_id, strip_start;
    char prepend[8];   /* the normalizer's Prepend ("" when none) */
    int replace_space; /* the normalizer turns ' ' into U+2581 */
    int byte_ids[256];
    int32_t prefix[4], suffix[4];
    int n_prefix, n_suffix;
    char byte_char[256][3]; /* byte -> its character, UTF-8 */
    int16_t char_byte[512]; /* code point -> byte, -1 where none */
};

typedef struct ids_buf {
    int32_t *v;
    size_t n, cap;
} ids_buf;

static inline int push(ids_buf *b, int32_t id)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        int32_t *v = realloc(b->v, cap * sizeof *v);
        if (!v)
            return wl_fail("out of memory");
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = id;
    return 0;
}

/* SentencePiece mode (tokenizer_sp.c). */
int wl_tk_load_normalizer(wl_tokenizer *tk, const char *path, json_t *n);
int wl_tk_load_decoder(wl_tokenizer *tk, const char *path, json_t *d);
int wl_tk_encode_sp(const wl_tokenizer *tk, const char *s, size_t len, ids_buf *out);
int wl_tk_decode_sp(const wl_tokenizer *tk, const char *t, int at_start, char *buf, size_t cap);

#endif
