/*
 * tokenizer_sp.c - SentencePiece-style BPE in tokenizer.json (the Llama 2
 * family: byte_fallback, no pre-tokenizer).
 *
 * The normalizer prepends U+2581 to each stretch of text between added
 * tokens and turns its spaces into U+2581; the merges run on the
 * characters, by rank; a piece the vocabulary lacks falls back to its
 * bytes' <0xXX> tokens (or the unknown token, consecutive ones fused).
 * Decoding turns U+2581 back into spaces and <0xXX> into its byte, and
 * drops the text's first leading space (the decoder's Strip, which runs
 * after Fuse has joined the tokens, so only at the start).
 */
#include <string.h>

#include "tokenizer_impl.h"

int wl_tk_load_normalizer(wl_tokenizer *tk, const char *path, json_t *n)
{
    if (!n || json_is_null(n))
        return 0;
    const char *type = json_string_value(json_object_get(n, "type"));
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(n, "normalizers"), i, v)
        {
            if (wl_tk_load_normalizer(tk, path, v))
                return -1;
        }
        return 0;
    }
    if (type && !strcmp(type, "NFC"))
        return 0;
    if (type && !strcmp(type, "Prepend")) {
        const char *p = json_string_value(json_object_get(n, "prepend"));
        if (!p || strlen(p) >= sizeof tk->prepend)
            return wl_fail("%s: normalizer Prepend needs a short string", path);
        strcpy(tk->prepend, p);
        return 0;
    }
    if (type && !strcmp(type, "Replace")) {
        const char *from =
            json_string_value(json_object_get(json_object_get(n, "pattern"), "String"));
        const char *to = json_string_value(json_object_get(n, "content"));
        if (from && to && !strcmp(from, " ") && !strcmp(to, "\u2581")) {
            tk->replace_space = 1;
            return 0;
        }
        return wl_fail("%s: normalizer Replace is supported only from \" \" to \"\u2581\"", path);
    }
    return wl_fail("%s: normalizer \"%s\" is not supported", path, type ? type : "?");
}

/* The decoders: ByteLevel, or SentencePiece's Replace, ByteFallback, Fuse and
 * Strip (whose start count is kept; the rest is what sp mode does). */
int wl_tk_load_decoder(wl_tokenizer *tk, const char *path, json_t *d)
{
    if (!d || json_is_null(d))
        return 0;
    const char *type = json_string_value(json_object_get(d, "type"));
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(d, "decoders"), i, v)
        {
            if (wl_tk_load_decoder(tk, path, v))
                return -1;
        }
        return 0;
    }
    if (type && !strcmp(type, "Strip")) {
        tk->strip_start = (int)json_integer_value(json_object_get(d, "start"));
        return 0;
    }
    if (type && (!strcmp(type, "ByteLevel") || !strcmp(type, "Replace") ||
                 !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")))
        return 0;
    return wl_fail("%s: decoder \"%s\" is not supported", path, type ? type : "?");
}

/* SentencePiece-style BPE of one normalized segment: the symbols start as
 * its UTF-8 characters; what the merges leave outside the vocabulary falls
 * back to byte tokens, or to the unknown token (consecutive ones fused). */
static int bpe_chars(const wl_tokenizer *tk, const char *text, size_t tl, ids_buf *out)
{
    size_t *sym = malloc(2 * (tl + 1) * sizeof *sym), n = 0;
    char *key = malloc(2 * tl + 2);
    int rc = -1, id, last_unk = 0;
    if (!sym || !key) {
        wl_fail("out of memory");
        goto out;
    }
    for (size_t i = 0; i < tl;) {
        size_t l = 1;
        while (i + l < tl && ((unsigned char)text[i + l] & 0xc0) == 0x80)
            l++;
        sym[2 * n] = i;
        sym[2 * n + 1] = l;
        n++;
        i += l;
    }
    for (;;) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            size_t al = sym[2 * i + 1], bl = sym[2 * i + 3];
            int rank;
            memcpy(key, text + sym[2 * i], al);
            key[al] = ' ';
            memcpy(key + al + 1, text + sym[2 * i + 2], bl);
            if (wl_strmap_get(&tk->merges, key, al + 1 + bl, &rank) && (best < 0 || rank < best)) {
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
        const char *p = text + sym[2 * i];
        size_t l = sym[2 * i + 1];
        if (wl_strmap_get(&tk->vocab, p, l, &id)) {
            last_unk = 0;
            if (push(out, id))
                goto out;
            continue;
        }
        for (size_t b = 0; b < l; b++) {
            int bid = tk->byte_ids[(unsigned char)p[b]];
            if (bid < 0 && tk->unk_id < 0) {
                wl_fail("tokenizer: \"%.*s\" has no token, no byte token and no unknown token",
                        (int)l, p);
                goto out;
            }
            if (bid < 0 && tk->fuse_unk && last_unk)
                continue;
            last_unk = bid < 0;
            if (push(out, bid >= 0 ? bid : tk->unk_id))
                goto out;
        }
    }
    rc = 0;
out:
    free(sym);
    free(key);
    return rc;
}

/* The normalizer of sp mode over a segment, then bpe_chars. */
int wl_tk_encode_sp(const wl_tokenizer *tk, const char *s, size_t len, ids_buf *out)
{
    size_t pl = strlen(tk->prepend);
    char *t = malloc(pl + 3 * len + 1);
    size_t n = 0;
    if (!t)
        return wl_fail("out of memory");
    memcpy(t, tk->prepend, pl);
    n = pl;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ' && tk->replace_space) {
            memcpy(t + n, "\u2581", 3);
            n += 3;
        } else {
            t[n++] = s[i];
        }
    }
    int rc = bpe_chars(tk, t, n, out);
    free(t);
    return rc;
}

/* A SentencePiece token: <0xXX> is its byte, U+2581 a space; at the start
 * of the text the decoder's Strip drops leading spaces. */
int wl_tk_decode_sp(const wl_tokenizer *tk, const char *t, int at_start, char *buf, size_t cap)
{
    unsigned b;
    size_t n = 0, l = strlen(t);
    if (l == 6 && sscanf(t, "<0x%2X>", &b) == 1) {
        if (!cap)
            return wl_fail("token does not fit the buffer");
        buf[0] = (char)b;
        return 1;
    }
    int strip = at_start ? tk->strip_start : 0;
    for (size_t i = 0; i < l;) {
        int space = !strncmp(t + i, "\u2581", 3);
        i += space ? 3 : 1;
        if (space && strip > 0 && n == 0) {
            strip--;
            continue;
        }
        if (n == cap)
            return wl_fail("token does not fit the buffer");
        buf[n++] = space ? ' ' : t[i - 1];
    }
    return (int)n;
}
