/*
 * bpe_train.c - learning byte-level BPE merges from a text and writing
 * them as a Hugging Face tokenizer.json (the random-model writer's
 * tokenizer).
 *
 * The text is cut into pieces by Llama 3's pre-tokenizer regex; each
 * distinct piece is a word with a count. Each round merges the adjacent
 * pair of tokens that occurs most often across the words (ties go to the
 * pair of smaller ids, so a text always gives the same merges), until the
 * wanted number of merges is reached or every word is one token. The file
 * written has the 256 byte tokens as ids 0-255, the merges' tokens from 256
 * on (skipping the special tokens' ids), the Split + ByteLevel
 * pre-tokenizer, a ByteLevel decoder and a template that adds the first
 * special token as BOS.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <pcre2.h>

#include "llm.h"
#include "strmap.h"

typedef struct word {
    int *sym;
    int n, count;
} word;

typedef struct trainer {
    word *words;
    int n_words;
    char **text; /* token text by token index (bytes first, then merges) */
    int n_tokens;
} trainer;

static int add_piece(trainer *t, wl_strmap *seen, const char *s, size_t len)
{
    int idx;
    if (wl_strmap_get(seen, s, len, &idx)) {
        t->words[idx].count++;
        return 0;
    }
    word *w = &t->words[t->n_words];
    if (!(w->sym = malloc(len * sizeof *w->sym)))
        return wl_fail("out of memory");
    for (size_t i = 0; i < len; i++)
        w->sym[i] = (unsigned char)s[i];
    w->n = (int)len;
    w->count = 1;
    return wl_strmap_put(seen, s, len, t->n_words++) ? wl_fail("out of memory") : 0;
}

static int split_words(trainer *t, const char *text)
{
    int err;
    PCRE2_SIZE off, len = strlen(text);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)wl_llama3_pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    pcre2_match_data *md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    wl_strmap seen = {0};
    int rc = 0;
    if (!md || !(t->words = calloc(len + 1, sizeof *t->words))) {
        rc = wl_fail("tokenizer training: cannot set up the regex");
        goto out;
    }
    for (PCRE2_SIZE pos = 0; pos < len && !rc;) {
        if (pcre2_match(re, (PCRE2_SPTR)text, len, pos, 0, md, NULL) < 0)
            break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {
            pos = ov[1] + 1;
            continue;
        }
        rc = add_piece(t, &seen, text + ov[0], ov[1] - ov[0]);
        pos = ov[1];
    }
out:
    wl_strmap_free(&seen);
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc;
}

/* The most frequent adjacent pair; 0 when no word has two tokens left. */
static int best_pair(const trainer *t, int *a, int *b)
{
    int n = t->n_tokens, best = 0;
    int *counts = calloc((size_t)n * n, sizeof *counts);
    if (!counts)
        return wl_fail("out of memory");
    for (int w = 0; w < t->n_words; w++)
        for (int i = 0; i + 1 < t->words[w].n; i++)
            counts[t->words[w].sym[i] * n + t->words[w].sym[i + 1]] += t->words[w].count;
    for (int i = 0; i < n * n; i++)
        if (counts[i] > best) {
            best = counts[i];
            *a = i / n;
            *b = i % n;
        }
    free(counts);
    return best > 0;
}

static void apply_merge(trainer *t, int a, int b, int merged)
{
    for (int w = 0; w < t->n_words; w++) {
        word *x = &t->words[w];
        int j = 0;
        for (int i = 0; i < x->n; i++) {
            if (i + 1 < x->n && x->sym[i] == a && x->sym[i + 1] == b) {
                x->sym[j++] = merged;
                i++;
            } else {
                x->sym[j++] = x->sym[i];
            }
        }
        x->n = j;
    }
}

static json_t *pre_tokenizer(void)
{
    return json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type",
                     "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
                     wl_llama3_pattern, "behavior", "Isolated", "invert", 0, "type", "ByteLevel",
                     "add_prefix_space", 0, "trim_offsets", 1, "use_regex", 0);
}

static json_t *post_processor(const char *bos, int bos_id)
{
    return json_pack("{s:s, s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:[{s:{s:s, s:i}}, {s:{s:s, s:i}}, "
                     "{s:{s:s, s:i}}, {s:{s:s, s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                     "type", "TemplateProcessing", "single", "SpecialToken", "id", bos, "type_id",
                     0, "Sequence", "id", "A", "type_id", 0, "pair", "SpecialToken", "id", bos,
                     "type_id", 0, "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", bos,
                     "type_id", 1, "Sequence", "id", "B", "type_id", 1, "special_tokens", bos, "id",
                     bos, "ids", bos_id, "tokens", bos);
}

static int is_special_id(const int *ids, int n, int id)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == id)
            return 1;
    return 0;
}

int wl_tokenizer_train_write(const char *path, const char *text, int merges,
                             const char *const *special, const int *special_ids, int n_special)
{
    trainer t = {0};
    int rc = -1, max = 256 + (merges > 0 ? merges : 0);
    json_t *vocab = json_object(), *mlist = json_array(), *added = json_array();
    int *ids = calloc((size_t)max, sizeof *ids);
    if (!(t.text = calloc((size_t)max, sizeof *t.text)) || !ids) {
        wl_fail("out of memory");
        goto out;
    }
    for (int b = 0; b < 256; b++) {
        char c[3];
        wl_byte_char((unsigned char)b, c);
        t.text[b] = strdup(c);
        ids[b] = b;
    }
    t.n_tokens = 256;
    if (split_words(&t, text))
        goto out;
    int next_id = 256;
    while (t.n_tokens < max) {
        int a = 0, b = 0, r = best_pair(&t, &a, &b);
        if (r < 0)
            goto out;
        if (!r)
            break;
        size_t la = strlen(t.text[a]), lb = strlen(t.text[b]);
        char *m = malloc(la + lb + 1), *pair = malloc(la + lb + 2);
        if (!m || !pair) {
            free(m);
            free(pair);
            wl_fail("out of memory");
            goto out;
        }
        memcpy(m, t.text[a], la);
        memcpy(m + la, t.text[b], lb + 1);
        snprintf(pair, la + lb + 2, "%s %s", t.text[a], t.text[b]);
        json_array_append_new(mlist, json_string(pair));
        free(pair);
        while (is_special_id(special_ids, n_special, next_id))
            next_id++;
        ids[t.n_tokens] = next_id++;
        t.text[t.n_tokens] = m;
        apply_merge(&t, a, b, t.n_tokens++);
    }
    for (int i = 0; i < t.n_tokens; i++)
        json_object_set_new(vocab, t.text[i], json_integer(ids[i]));
    for (int i = 0; i < n_special; i++)
        json_array_append_new(added,
                              json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", special_ids[i],
                                        "content", special[i], "single_word", 0, "lstrip", 0,
                                        "rstrip", 0, "normalized", 0, "special", 1));
    json_t *root = json_pack(
        "{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:n, s:n, s:n, s:n, "
        "s:b, s:b, s:b, s:o, s:o}}",
        "version", "1.0", "truncation", "padding", "added_tokens", json_incref(added), "normalizer",
        "pre_tokenizer", pre_tokenizer(), "post_processor",
        n_special ? post_processor(special[0], special_ids[0]) : json_null(), "decoder", "type",
        "ByteLevel", "add_prefix_space", 1, "trim_offsets", 1, "use_regex", 1, "model", "type",
        "BPE", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
        "fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0, "vocab", json_incref(vocab),
        "merges", json_incref(mlist));
    if (!root) {
        wl_fail("%s: cannot build the JSON", path);
        goto out;
    }
    rc = json_dump_file(root, path, JSON_INDENT(1)) ? wl_fail("%s: cannot write", path) : 0;
    json_decref(root);
out:
    json_decref(vocab);
    json_decref(mlist);
    json_decref(added);
    for (int i = 0; i < t.n_tokens; i++)
        free(t.text[i]);
    for (int w = 0; w < t.n_words; w++)
        free(t.words[w].sym);
    free(t.words);
    free(t.text);
    free(ids);
    return rc;
}
