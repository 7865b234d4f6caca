/*
 * tokenizer.c - Hugging Face tokenizer.json, byte-level BPE (the GPT-2,
 * Llama 3 and Qwen families): encode text to ids and decode ids to bytes.
 *
 * Encoding, as the tokenizers library does it: the text is cut at the
 * added tokens (matched literally, longest first at each place); each
 * other stretch goes through the pre-tokenizer's steps (Split by the
 * file's regex, run by PCRE2 with Unicode properties; ByteLevel's own
 * GPT-2 regex when it asks for one), each piece's bytes are mapped to the
 * printable characters of the byte-to-unicode table, and the pieces are
 * merged pairwise, always the pair of lowest merge rank first (leftmost
 * on a tie), until no pair has a rank. The post-processor's template adds
 * its special tokens (a BOS) around the sequence.
 * Decoding maps each token's characters back to the bytes they stand for;
 * added tokens decode to their text.
 * SentencePiece-style BPE (Llama 2's form: byte_fallback, no
 * pre-tokenizer) is the other mode, in tokenizer_sp.c.
 * Not handled, refused by name: other models than BPE, other
 * pre-tokenizers, normalizers and decoders. A normalizer "NFC" is
 * accepted and not applied: text must already be NFC.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <pcre2.h>

#include "tokenizer_impl.h"

static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void build_byte_table(wl_tokenizer *tk);

const char wl_llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

void wl_byte_char(unsigned char b, char out[3])
{
    static wl_tokenizer table;
    static int built;
    if (!built) { /* idempotent: racing builders write the same bytes */
        build_byte_table(&table);
        built = 1;
    }
    memcpy(out, table.byte_char[b], 3);
}

/* GPT-2's table: printable Latin-1 bytes stand for themselves, the others
 * (controls, space, a few) for code points from 256 on, in byte order. */
static void build_byte_table(wl_tokenizer *tk)
{
    int next = 256;
    for (int i = 0; i < 512; i++)
        tk->char_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : next++;
        tk->char_byte[cp] = (int16_t)b;
        if (cp < 0x80) {
            tk->byte_char[b][0] = (char)cp;
            tk->byte_char[b][1] = 0;
        } else {
            tk->byte_char[b][0] = (char)(0xc0 | cp >> 6);
            tk->byte_char[b][1] = (char)(0x80 | (cp & 0x3f));
            tk->byte_char[b][2] = 0;
        }
    }
}

static int compile(const char *path, const char *pattern, int literal, pcre2_code **re)
{
    int err;
    PCRE2_SIZE off;
    uint32_t opts = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
    *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, opts, &err, &off, NULL);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return wl_fail("%s: the pre-tokenizer's regex does not compile at offset %zu: %s", path,
                       (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* faster when available; fine without */
    return 0;
}

static int add_step(wl_tokenizer *tk, const char *path, json_t *p)
{
    const char *type = json_string_value(json_object_get(p, "type"));
    if (!type)
        return wl_fail("%s: a pre-tokenizer has no type", path);
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(p, "pretokenizers"), i, v)
        {
            if (add_step(tk, path, v))
                return -1;
        }
        return 0;
    }
    if (tk->n_steps == 8)
        return wl_fail("%s: more than 8 pre-tokenizer steps", path);
    step *s = &tk->steps[tk->n_steps];
    if (!strcmp(type, "ByteLevel")) {
        tk->add_prefix_space = json_is_true(json_object_get(p, "add_prefix_space"));
        json_t *use = json_object_get(p, "use_regex");
        if (use && !json_is_true(use))
            return 0; /* the byte mapping itself is applied to every piece */
        s->behavior = ISOLATED;
        if (compile(path, gpt2_pattern, 0, &s->re))
            return -1;
        tk->n_steps++;
        return 0;
    }
    if (strcmp(type, "Split"))
        return wl_fail("%s: pre-tokenizer \"%s\" is not supported (Split, ByteLevel, Sequence)",
                       path, type);
    json_t *pat = json_object_get(p, "pattern");
    const char *regex = json_string_value(json_object_get(pat, "Regex"));
    const char *literal = json_string_value(json_object_get(pat, "String"));
    const char *behavior = json_string_value(json_object_get(p, "behavior"));
    if (!regex && !literal)
        return wl_fail("%s: Split has no pattern", path);
    if (json_is_true(json_object_get(p, "invert")))
        return wl_fail("%s: Split with invert is not supported", path);
    if (!behavior || !strcmp(behavior, "Isolated"))
        s->behavior = ISOLATED;
    else if (!strcmp(behavior, "Removed"))
        s->behavior = REMOVED;
    else if (!strcmp(behavior, "MergedWithPrevious"))
        s->behavior = MERGED_PREV;
    else if (!strcmp(behavior, "MergedWithNext"))
        s->behavior = MERGED_NEXT;
    else
        return wl_fail("%s: Split behavior \"%s\" is not supported", path, behavior);
    if (compile(path, regex ? regex : literal, !regex, &s->re))
        return -1;
    tk->n_steps++;
    return 0;
}

static int set_id(wl_tokenizer *tk, const char *path, const char *text, size_t len, json_int_t id)
{
    if (id < 0 || id >= (1 << 24))
        return wl_fail("%s: token id %lld is out of range", path, (long long)id);
    if ((size_t)id >= tk->n_ids) {
        size_t n = (size_t)id + 1 > 2 * tk->n_ids ? (size_t)id + 1 : 2 * tk->n_ids;
        char **b = realloc(tk->by_id, n * sizeof *b);
        unsigned char *sp = b ? realloc(tk->is_special, n) : NULL;
        if (!b || !sp) {
            if (b)
                tk->by_id = b;
            return wl_fail("out of memory");
        }
        memset(b + tk->n_ids, 0, (n - tk->n_ids) * sizeof *b);
        memset(sp + tk->n_ids, 0, n - tk->n_ids);
        tk->by_id = b;
        tk->is_special = sp;
        tk->n_ids = n;
    }
    if ((size_t)id >= tk->size)
        tk->size = (size_t)id + 1;
    free(tk->by_id[id]);
    if (!(tk->by_id[id] = strndup(text, len)))
        return wl_fail("out of memory");
    return 0;
}

static int load_model(wl_tokenizer *tk, const char *path, json_t *model)
{
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE"))
        return wl_fail(
            "%s: model type \"%s\" is not supported (BPE only, byte-level or SentencePiece-style)",
            path, type ? type : "?");
    tk->sp = json_is_true(json_object_get(model, "byte_fallback"));
    tk->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    tk->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return wl_fail("%s: model.vocab or model.merges is missing", path);
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v)
    {
        if (!json_is_integer(v))
            return wl_fail("%s: vocab entry \"%s\" is not an integer", path, key);
        if (wl_strmap_put(&tk->vocab, key, strlen(key), (int)json_integer_value(v)) ||
            set_id(tk, path, key, strlen(key), json_integer_value(v)))
            return wl_fail("%s: %s", path, wl_error());
    }
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    tk->unk_id = -1;
    if (unk)
        wl_strmap_get(&tk->vocab, unk, strlen(unk), &tk->unk_id);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        tk->byte_ids[b] = -1;
        wl_strmap_get(&tk->vocab, name, strlen(name), &tk->byte_ids[b]);
    }
    size_t i;
    json_array_foreach(merges, i, v)
    {
        char buf[512];
        int n;
        if (json_is_string(v))
            n = snprintf(buf, sizeof buf, "%s", json_string_value(v));
        else if (json_is_array(v) && json_array_size(v) == 2 &&
                 json_is_string(json_array_get(v, 0)) && json_is_string(json_array_get(v, 1)))
            n = snprintf(buf, sizeof buf, "%s %s", json_string_value(json_array_get(v, 0)),
                         json_string_value(json_array_get(v, 1)));
        else
            return wl_fail("%s: merge %zu is not \"a b\" or [a, b]", path, i);
        if (n < 0 || (size_t)n >= sizeof buf || !strchr(buf, ' '))
            return wl_fail("%s: merge %zu is malformed", path, i);
        if (wl_strmap_put(&tk->merges, buf, (size_t)n, (int)i))
            return wl_fail("out of memory");
    }
    return 0;
}

static int load_added(wl_tokenizer *tk, const char *path, json_t *list)
{
    size_t i;
    json_t *v;
    if (!list || json_is_null(list))
        return 0;
    if (!(tk->added = calloc(json_array_size(list) + 1, sizeof *tk->added)))
        return wl_fail("out of memory");
    json_array_foreach(list, i, v)
    {
        const char *content = json_string_value(json_object_get(v, "content"));
        json_t *id = json_object_get(v, "id");
        if (!content || !*content || !json_is_integer(id))
            return wl_fail("%s: added token %zu needs content and id", path, i);
        added *a = &tk->added[tk->n_added++];
        a->content = strdup(content);
        a->len = strlen(content);
        a->id = (int)json_integer_value(id);
        a->special = json_is_true(json_object_get(v, "special"));
        if (!a->content || set_id(tk, path, content, a->len, json_integer_value(id)))
            return -1;
        tk->is_special[a->id] = (unsigned char)(a->special ? 2 : 1);
    }
    return 0;
}

/* The ids of a special token the template names. */
static int template_ids(wl_tokenizer *tk, const char *path, json_t *specials, const char *name,
                        int32_t *out, int *n)
{
    json_t *ids = json_object_get(json_object_get(specials, name), "ids");
    size_t i;
    json_t *v;
    if (!json_is_array(ids))
        return wl_fail("%s: post_processor names special token %s without ids", path, name);
    json_array_foreach(ids, i, v)
    {
        if (*n == 4 || !json_is_integer(v) || json_integer_value(v) < 0 ||
            (size_t)json_integer_value(v) >= tk->n_ids)
            return wl_fail("%s: post_processor: bad ids for %s", path, name);
        out[(*n)++] = (int32_t)json_integer_value(v);
    }
    return 0;
}

static int load_post(wl_tokenizer *tk, const char *path, json_t *p)
{
    if (!p || json_is_null(p))
        return 0;
    const char *type = json_string_value(json_object_get(p, "type"));
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(p, "processors"), i, v)
        {
            if (load_post(tk, path, v))
                return -1;
        }
        return 0;
    }
    if (type && !strcmp(type, "ByteLevel"))
        return 0; /* offsets only */
    if (!type || strcmp(type, "TemplateProcessing"))
        return wl_fail("%s: post_processor \"%s\" is not supported", path, type ? type : "?");
    size_t i;
    json_t *item, *specials = json_object_get(p, "special_tokens");
    int seen_a = 0;
    json_array_foreach(json_object_get(p, "single"), i, item)
    {
        json_t *sp = json_object_get(item, "SpecialToken");
        if (json_object_get(item, "Sequence")) {
            seen_a = 1;
            continue;
        }
        const char *name = json_string_value(json_object_get(sp, "id"));
        if (!name)
            return wl_fail("%s: post_processor template item %zu is not understood", path, i);
        if (seen_a ? template_ids(tk, path, specials, name, tk->suffix, &tk->n_suffix)
                   : template_ids(tk, path, specials, name, tk->prefix, &tk->n_prefix))
            return -1;
    }
    return 0;
}

int wl_tokenizer_load(wl_tokenizer **out, const char *path)
{
    json_error_t jerr;
    *out = NULL;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root)
        return wl_fail("%s: %s (line %d)", path, jerr.text, jerr.line);
    wl_tokenizer *tk = calloc(1, sizeof *tk);
    if (!tk) {
        json_decref(root);
        return wl_fail("out of memory");
    }
    build_byte_table(tk);
    json_t *pre = json_object_get(root, "pre_tokenizer");
    int rc = -1;
    if (wl_tk_load_normalizer(tk, path, json_object_get(root, "normalizer")) ||
        wl_tk_load_decoder(tk, path, json_object_get(root, "decoder")) ||
        load_model(tk, path, json_object_get(root, "model")) ||
        load_added(tk, path, json_object_get(root, "added_tokens")) ||
        (pre && !json_is_null(pre) && add_step(tk, path, pre)) ||
        load_post(tk, path, json_object_get(root, "post_processor")))
        goto out;
    rc = 0;
out:
    json_decref(root);
    if (rc)
        wl_tokenizer_free(tk);
    else
        *out = tk;
    return rc;
}

void wl_tokenizer_free(wl_tokenizer *tk)
{
    if (!tk)
        return;
    wl_strmap_free(&tk->vocab);
    wl_strmap_free(&tk->merges);
    for (size_t i = 0; i < tk->n_ids; i++)
        free(tk->by_id[i]);
    for (size_t i = 0; i < tk->n_added; i++)
        free(tk->added[i].content);
    for (int i = 0; i < tk->n_steps; i++)
        pcre2_code_free(tk->steps[i].re);
    free(tk->by_id);
    free(tk->is_special);
    free(tk->added);
    free(tk);
}

size_t wl_tokenizer_size(const wl_tokenizer *tk)
{
    return tk->size;
}

/* ---- encoding ------------------------------------------------------------- */

/* One piece (raw bytes) through the byte map and the merges. */
static int bpe(const wl_tokenizer *tk, const char *bytes, size_t len, ids_buf *out)
{
    /* The mapped text: at most 2 UTF-8 bytes per byte. sym[i] = (start,
     * length) of symbol i in it; merging joins neighbours in place. */
    char stack_text[512];
    size_t stack_sym[2 * 256];
    char *text = len <= 256 ? stack_text : malloc(2 * len + 1);
    size_t *sym = len <= 256 ? stack_sym : malloc(2 * len * sizeof *sym);
    size_t n = 0, tl = 0;
    int rc = -1, id;
    if (!text || !sym) {
        wl_fail("out of memory");
        goto out;
    }
    for (size_t i = 0; i < len; i++) {
        const char *c = tk->byte_char[(unsigned char)bytes[i]];
        size_t cl = strlen(c);
        sym[2 * n] = tl;
        sym[2 * n + 1] = cl;
        n++;
        memcpy(text + tl, c, cl);
        tl += cl;
    }
    if (!(tk->ignore_merges && wl_strmap_get(&tk->vocab, text, tl, &id))) {
        char key[1024];
        for (;;) {
            int best = -1;
            size_t at = 0;
            for (size_t i = 0; i + 1 < n; i++) {
                size_t al = sym[2 * i + 1], bl = sym[2 * i + 3], kl = al + 1 + bl;
                int rank;
                if (kl > sizeof key)
                    continue;
                memcpy(key, text + sym[2 * i], al);
                key[al] = ' ';
                memcpy(key + al + 1, text + sym[2 * i + 2], bl);
                if (wl_strmap_get(&tk->merges, key, kl, &rank) && (best < 0 || rank < best)) {
                    best = rank;
                    at = i;
                }
            }
            if (best < 0)
                break;
            sym[2 * at + 1] += sym[2 * at + 3];
            memmove(sym + 2 * at + 2, sym + 2 * at + 4, (n - at - 2) * 2 * sizeof *sym);
            n--;
        }
        for (size_t i = 0; i < n; i++) {
            if (!wl_strmap_get(&tk->vocab, text + sym[2 * i], sym[2 * i + 1], &id)) {
                wl_fail("tokenizer: piece \"%.*s\" is not in the vocabulary", (int)sym[2 * i + 1],
                        text + sym[2 * i]);
                goto out;
            }
            if (push(out, id))
                goto out;
        }
    } else if (push(out, id)) {
        goto out;
    }
    rc = 0;
out:
    if (text != stack_text)
        free(text);
    if (sym != stack_sym)
        free(sym);
    return rc;
}

/* Pre-tokenizer step k over [s, s + len), then the steps after it. */
static int pre_tokenize(const wl_tokenizer *tk, int k, const char *s, size_t len, ids_buf *out)
{
    if (k == tk->n_steps)
        return len ? bpe(tk, s, len, out) : 0;
    const step *st = &tk->steps[k];
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->re, NULL);
    if (!md)
        return wl_fail("out of memory");
    size_t pos = 0, piece = 0; /* piece: start of the text not yet emitted */
    int rc = 0;
    while (pos <= len && !rc) {
        int r = pcre2_match(st->re, (PCRE2_SPTR)s, len, pos, 0, md, NULL);
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(r, msg, sizeof msg);
            rc = wl_fail("tokenizer: regex match failed: %s", (char *)msg);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* an empty match splits nothing: step over one character */
            pos = b + 1;
            while (pos < len && ((unsigned char)s[pos] & 0xc0) == 0x80)
                pos++;
            continue;
        }
        switch (st->behavior) {
        case ISOLATED:
            rc = pre_tokenize(tk, k + 1, s + piece, b - piece, out);
            if (!rc)
                rc = pre_tokenize(tk, k + 1, s + b, e - b, out);
            piece = e;
            break;
        case REMOVED:
            rc = pre_tokenize(tk, k + 1, s + piece, b - piece, out);
            piece = e;
            break;
        case MERGED_PREV:
            rc = pre_tokenize(tk, k + 1, s + piece, e - piece, out);
            piece = e;
            break;
        case MERGED_NEXT:
            rc = pre_tokenize(tk, k + 1, s + piece, b - piece, out);
            piece = b;
            break;
        }
        pos = e;
    }
    if (!rc)
        rc = pre_tokenize(tk, k + 1, s + piece, len - piece, out);
    pcre2_match_data_free(md);
    return rc;
}

static int encode_plain(const wl_tokenizer *tk, const char *s, size_t len, int first, ids_buf *out)
{
    if (!len)
        return 0;
    if (tk->sp)
        return wl_tk_encode_sp(tk, s, len, out);
    if (tk->add_prefix_space && first && s[0] != ' ') {
        char *t = malloc(len + 1);
        if (!t)
            return wl_fail("out of memory");
        t[0] = ' ';
        memcpy(t + 1, s, len);
        int rc = pre_tokenize(tk, 0, t, len + 1, out);
        free(t);
        return rc;
    }
    return pre_tokenize(tk, 0, s, len, out);
}

int wl_encode(const wl_tokenizer *tk, const char *text, size_t len, int add_special, int32_t **ids,
              size_t *n)
{
    ids_buf out = {0};
    int rc = 0;
    for (int i = 0; add_special && !rc && i < tk->n_prefix; i++)
        rc = push(&out, tk->prefix[i]);
    size_t start = 0, i = 0;
    while (!rc && i < len) {
        const added *best = NULL;
        for (size_t a = 0; a < tk->n_added; a++) {
            const added *t = &tk->added[a];
            if (t->len <= len - i && !memcmp(text + i, t->content, t->len) &&
                (!best || t->len > best->len))
                best = t;
        }
        if (!best) {
            i++;
            continue;
        }
        rc = encode_plain(tk, text + start, i - start, start == 0, &out);
        if (!rc)
            rc = push(&out, best->id);
        i += best->len;
        start = i;
    }
    if (!rc)
        rc = encode_plain(tk, text + start, len - start, start == 0, &out);
    for (int k = 0; add_special && !rc && k < tk->n_suffix; k++)
        rc = push(&out, tk->suffix[k]);
    if (rc) {
        free(out.v);
        return -1;
    }
    *ids = out.v ? out.v : malloc(sizeof **ids);
    *n = out.n;
    return 0;
}

/* ---- decoding ------------------------------------------------------------- */

int wl_decode_token(const wl_tokenizer *tk, int32_t id, int keep_special, int at_start, char *buf,
                    size_t cap)
{
    if (id < 0 || (size_t)id >= tk->n_ids || !tk->by_id[id])
        return wl_fail("token id %d is not in the vocabulary", id);
    const char *t = tk->by_id[id];
    size_t n = 0;
    if (tk->is_special[id]) {
        if (tk->is_special[id] == 2 && !keep_special)
            return 0;
        size_t l = strlen(t);
        if (l > cap)
            return wl_fail("token %d does not fit the buffer", id);
        memcpy(buf, t, l);
        return (int)l;
    }
    if (tk->sp)
        return wl_tk_decode_sp(tk, t, at_start, buf, cap);
    for (const unsigned char *p = (const unsigned char *)t; *p;) {
        int cp, l;
        if (*p < 0x80) {
            cp = *p;
            l = 1;
        } else if ((*p & 0xe0) == 0xc0 && p[1]) {
            cp = (*p & 0x1f) << 6 | (p[1] & 0x3f);
            l = 2;
        } else {
            cp = -1;
            l = 1;
        }
        if (n == cap)
            return wl_fail("token %d does not fit the buffer", id);
        if (cp >= 0 && cp < 512 && tk->char_byte[cp] >= 0) {
            buf[n++] = (char)tk->char_byte[cp];
            p += l;
        } else { /* not a byte-level character: keep it as written */
            buf[n++] = (char)*p++;
        }
    }
    return (int)n;
}

int wl_tokenizers_agree(const wl_tokenizer *a, const wl_tokenizer *b)
{
    if (a->size != b->size)
        return wl_fail("their vocabularies differ: %zu and %zu tokens", a->size, b->size);
    if (a->sp != b->sp)
        return wl_fail("one is SentencePiece-style BPE, the other byte-level BPE");
    for (size_t i = 0; i < a->size; i++) {
        const char *x = a->by_id[i] ? a->by_id[i] : "", *y = b->by_id[i] ? b->by_id[i] : "";
        if (strcmp(x, y) || a->is_special[i] != b->is_special[i])
            return wl_fail("token %zu differs (\"%s\" and \"%s\")", i, x, y);
    }
    return 0;
}
