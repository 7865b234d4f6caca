/*
 * json.h - a strict JSON reader for the trace tests (RFC 8259: one value,
 * no trailing commas, no comments, strings of valid UTF-8 with only the
 * escapes the grammar allows, numbers as the grammar spells them).
 *
 * json_parse returns the document as a tree, or NULL with a message saying
 * where the text stops being JSON. Objects keep their members in order.
 */
#ifndef WEFT_TEST_JSON_H
#define WEFT_TEST_JSON_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum json_type { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_type;

typedef struct json {
    json_type type;
    bool boolean;
    double number;
    char *string;        /* JSON_STRING, unescaped */
    struct json **items; /* JSON_ARRAY: elements; JSON_OBJECT: values */
    char **keys;         /* JSON_OBJECT */
    size_t n;
} json;

typedef struct json_reader {
    const char *p, *end, *start;
    char error[160];
} json_reader;

static inline void json_free(json *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        json_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->string);
    free(v);
}

static inline bool json_fail(json_reader *r, const char *what)
{
    if (!r->error[0])
        snprintf(r->error, sizeof r->error, "%s at byte %zu", what, (size_t)(r->p - r->start));
    return false;
}

static inline void json_space(json_reader *r)
{
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
        r->p++;
}

static inline int json_hex(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                                : -1;
}

/* A string at r->p (the opening quote); *out receives it unescaped. */
static inline bool json_string(json_reader *r, char **out)
{
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    r->p++;
    for (;;) {
        if (r->p >= r->end) {
            free(s);
            return json_fail(r, "unterminated string");
        }
        unsigned char c = (unsigned char)*r->p;
        unsigned code = c;
        size_t len = 1;
        if (c == '"') {
            r->p++;
            break;
        } else if (c < 0x20) {
            free(s);
            return json_fail(r, "control character in a string");
        } else if (c == '\\') {
            if (r->end - r->p < 2) {
                free(s);
                return json_fail(r, "unterminated escape");
            }
            char e = r->p[1];
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *k = strchr(from, e);
            if (e && k) {
                code = (unsigned char)to[k - from];
                len = 2;
            } else if (e == 'u' && r->end - r->p >= 6) {
                code = 0;
                for (int i = 2; i < 6; i++) {
                    int h = json_hex(r->p[i]);
                    if (h < 0) {
                        free(s);
                        return json_fail(r, "bad \\u escape");
                    }
                    code = code * 16 + (unsigned)h;
                }
                len = 6;
            } else {
                free(s);
                return json_fail(r, "bad escape");
            }
        } else if (c >= 0x80) { /* must be valid UTF-8 */
            len = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
            if (len == 0 || (size_t)(r->end - r->p) < len) {
                free(s);
                return json_fail(r, "invalid UTF-8");
            }
            for (size_t i = 1; i < len; i++)
                if (((unsigned char)r->p[i] & 0xc0) != 0x80) {
                    free(s);
                    return json_fail(r, "invalid UTF-8");
                }
            code = 0x80; /* copied below byte by byte */
        }
        if (n + 8 > cap)
            s = realloc(s, cap *= 2);
        if (c >= 0x80) {
            memcpy(s + n, r->p, len);
            n += len;
        } else if (code < 0x80) {
            s[n++] = (char)code;
        } else { /* an escaped code unit: the tests need ASCII only */
            s[n++] = '?';
        }
        r->p += len;
    }
    s[n] = '\0';
    *out = s;
    return true;
}

static inline bool json_number(json_reader *r, double *out)
{
    const char *q = r->p;
    if (q < r->end && *q == '-')
        q++;
    if (q >= r->end)
        return json_fail(r, "bad number");
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    else
        return json_fail(r, "bad number");
    if (q < r->end && *q == '.') {
        q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return json_fail(r, "bad fraction");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < r->end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < r->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= r->end || *q < '0' || *q > '9')
            return json_fail(r, "bad exponent");
        while (q < r->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t n = (size_t)(q - r->p);
    if (n >= sizeof buf)
        return json_fail(r, "number too long");
    memcpy(buf, r->p, n);
    buf[n] = '\0';
    *out = strtod(buf, NULL);
    r->p = q;
    return true;
}

static inline json *json_value(json_reader *r, int depth);

static inline bool json_push(json *v, json *item, char *key)
{
    if ((v->n & (v->n - 1)) == 0) { /* 0, 1, 2, 4, ...: double the room */
        size_t cap = v->n ? 2 * v->n : 1;
        v->items = realloc(v->items, cap * sizeof *v->items);
        if (v->type == JSON_OBJECT)
            v->keys = realloc(v->keys, cap * sizeof *v->keys);
    }
    v->items[v->n] = item;
    if (v->keys)
        v->keys[v->n] = key;
    v->n++;
    return true;
}

static inline json *json_container(json_reader *r, int depth, json *v)
{
    char close = v->type == JSON_ARRAY ? ']' : '}';
    r->p++;
    json_space(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        return v;
    }
    for (;;) {
        char *key = NULL;
        json_space(r);
        if (v->type == JSON_OBJECT) {
            if (r->p >= r->end || *r->p != '"' || !json_string(r, &key))
                goto bad;
            json_space(r);
            if (r->p >= r->end || *r->p != ':') {
                free(key);
                json_fail(r, "expected ':'");
                goto bad;
            }
            r->p++;
        }
        json *item = json_value(r, depth + 1);
        if (!item) {
            free(key);
            goto bad;
        }
        json_push(v, item, key);
        json_space(r);
        if (r->p < r->end && *r->p == ',') {
            r->p++;
            continue;
        }
        if (r->p < r->end && *r->p == close) {
            r->p++;
            return v;
        }
        json_fail(r, "expected ',' or the end of a container");
        goto bad;
    }
bad:
    json_fail(r, "bad container");
    json_free(v);
    return NULL;
}

static inline json *json_value(json_reader *r, int depth)
{
    json_space(r);
    if (depth > 64 || r->p >= r->end) {
        json_fail(r, depth > 64 ? "too deep" : "unexpected end");
        return NULL;
    }
    json *v = calloc(1, sizeof *v);
    char c = *r->p;
    if (c == '{' || c == '[') {
        v->type = c == '{' ? JSON_OBJECT : JSON_ARRAY;
        return json_container(r, depth, v);
    }
    if (c == '"') {
        v->type = JSON_STRING;
        if (json_string(r, &v->string))
            return v;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        v->type = JSON_NUMBER;
        if (json_number(r, &v->number))
            return v;
    } else {
        static const struct {
            const char *word;
            json_type type;
            bool value;
        } words[] = {{"true", JSON_BOOL, true}, {"false", JSON_BOOL, false}, {"null", JSON_NULL, 0}};
        for (size_t i = 0; i < 3; i++) {
            size_t n = strlen(words[i].word);
            if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[i].word, n)) {
                v->type = words[i].type;
                v->boolean = words[i].value;
                r->p += n;
                return v;
            }
        }
        json_fail(r, "unexpected character");
    }
    free(v);
    return NULL;
}

/* Parse text[0..n); NULL with *error set when it is not exactly one JSON
 * value (surrounded by white space). */
static inline json *json_parse(const char *text, size_t n, char *error, size_t error_size)
{
    json_reader r = {.p = text, .end = text + n, .start = text};
    json *v = json_value(&r, 0);
    if (v) {
        json_space(&r);
        if (r.p != r.end) {
            json_fail(&r, "text after the value");
            json_free(v);
            v = NULL;
        }
    }
    if (!v)
        snprintf(error, error_size, "%s", r.error);
    return v;
}

/* The member key of object v, or NULL. */
static inline json *json_get(const json *v, const char *key)
{
    if (!v || v->type != JSON_OBJECT)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (!strcmp(v->keys[i], key))
            return v->items[i];
    return NULL;
}

static inline const char *json_str(const json *v, const char *key)
{
    json *m = json_get(v, key);
    return m && m->type == JSON_STRING ? m->string : NULL;
}

static inline bool json_num(const json *v, const char *key, double *out)
{
    json *m = json_get(v, key);
    if (!m || m->type != JSON_NUMBER)
        return false;
    *out = m->number;
    return true;
}

#endif
