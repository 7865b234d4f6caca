/*
 * loadgen_parse.c - the load generator's pure parts: the server-sent
 * events parser, the loopback check of the target URL, the seeded draws
 * and the statistics (see loadgen.h).
 *
 * The parser keeps no state but the unfinished line and the unfinished
 * event, so a stream may arrive cut anywhere (inside a line, between a CR
 * and its LF) and parses as if it came whole. The URL is read by curl's
 * own URL parser, the one that picks the host curl connects to, so the
 * check and the connection cannot disagree about which host a URL names.
 */
#include <curl/curl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "llm.h"
#include "loadgen.h"

/* ---- server-sent events ---------------------------------------------------- */

void wl_sse_init(wl_sse *p, wl_sse_event_fn on_event, void *ctx)
{
    memset(p, 0, sizeof *p);
    p->on_event = on_event;
    p->ctx = ctx;
}

void wl_sse_free(wl_sse *p)
{
    free(p->line);
    free(p->data);
    p->line = p->data = NULL;
    p->line_len = p->line_cap = p->data_len = p->data_cap = 0;
}

/* Room for n more bytes and a NUL in *buf. */
static int reserve(char **buf, size_t *cap, size_t len, size_t n)
{
    if (len + n > WL_SSE_MAX_LINE)
        return wl_fail("malformed SSE: a line or event longer than %zu bytes", WL_SSE_MAX_LINE);
    if (len + n + 1 <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < len + n + 1)
        c *= 2;
    char *b = realloc(*buf, c);
    if (!b)
        return wl_fail("out of memory");
    *buf = b;
    *cap = c;
    return 0;
}

static int dispatch(wl_sse *p)
{
    if (!p->has_data)
        return 0; /* an event of comments or other fields only */
    if (reserve(&p->data, &p->data_cap, p->data_len, 0))
        return -1;
    p->data[p->data_len] = 0;
    size_t len = p->data_len;
    p->data_len = 0;
    p->has_data = 0;
    return p->on_event(p->ctx, p->data, len);
}

/* One whole line, its line end removed. */
static int take_line(wl_sse *p)
{
    const char *l = p->line;
    size_t n = p->line_len;
    p->line_len = 0;
    if (!n)
        return dispatch(p);
    if (l[0] == ':')
        return 0; /* a comment (a keep-alive) */
    const char *colon = memchr(l, ':', n);
    size_t name = colon ? (size_t)(colon - l) : n;
    if (name != 4 || memcmp(l, "data", 4))
        return 0; /* event, id, retry and unknown fields: not used here */
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ')
        v++;
    size_t vn = (size_t)(l + n - v);
    if (reserve(&p->data, &p->data_cap, p->data_len, vn + 1))
        return -1;
    if (p->has_data)
        p->data[p->data_len++] = '\n';
    memcpy(p->data + p->data_len, v, vn);
    p->data_len += vn;
    p->has_data = 1;
    return 0;
}

int wl_sse_feed(wl_sse *p, const char *buf, size_t n)
{
    size_t i = 0;
    if (n && p->after_cr && buf[0] == '\n')
        i = 1; /* the LF of a CRLF cut between two pieces */
    p->after_cr = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && buf[j] != '\n' && buf[j] != '\r')
            j++;
        if (reserve(&p->line, &p->line_cap, p->line_len, j - i))
            return -1;
        memcpy(p->line + p->line_len, buf + i, j - i);
        p->line_len += j - i;
        if (j == n)
            break;
        if (buf[j] == '\r') {
            if (j + 1 < n && buf[j + 1] == '\n')
                j++;
            else if (j + 1 == n)
                p->after_cr = 1;
        }
        if (take_line(p))
            return -1;
        i = j + 1;
    }
    return 0;
}

int wl_sse_end(wl_sse *p)
{
    p->after_cr = 0;
    if (p->line_len && take_line(p))
        return -1;
    return dispatch(p);
}

/* ---- the target ------------------------------------------------------------- */

static int is_loopback(const char *host)
{
    return !strcmp(host, "127.0.0.1") || !strcmp(host, "[::1]") || !strcasecmp(host, "localhost");
}

int wl_lg_loopback_url(const char *url, char *base, size_t cap)
{
    char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *user = NULL, *pass = NULL;
    CURLU *u = curl_url();
    int rc = -1;
    if (!u)
        return wl_fail("out of memory");
    if (!strstr(url, "://")) {
        wl_fail("%s: give the server's URL with its scheme, like http://127.0.0.1:8000", url);
        goto out;
    }
    CURLUcode uc = curl_url_set(u, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME);
    if (uc) {
        wl_fail("%s: not a URL (%s)", url, curl_url_strerror(uc));
        goto out;
    }
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) || strcasecmp(scheme, "http")) {
        wl_fail("%s: only http:// is supported (a server on this machine)", url);
        goto out;
    }
    if (!curl_url_get(u, CURLUPART_USER, &user, 0) ||
        !curl_url_get(u, CURLUPART_PASSWORD, &pass, 0)) {
        wl_fail("%s: a user name or password in the URL is not accepted", url);
        goto out;
    }
    if (curl_url_get(u, CURLUPART_HOST, &host, 0) || !is_loopback(host)) {
        wl_fail("%s: the host is %s; loadgen sends load only to this machine's loopback "
                "(127.0.0.1, [::1] or localhost)",
                url, host ? host : "missing");
        goto out;
    }
    if (curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) ||
        curl_url_get(u, CURLUPART_PATH, &path, 0)) {
        wl_fail("%s: no port or path", url);
        goto out;
    }
    size_t len = strlen(path);
    while (len && path[len - 1] == '/')
        len--;
    if (len >= 3 && !memcmp(path + len - 3, "/v1", 3))
        len -= 3; /* the OpenAI clients' base URL names /v1; the paths below add it */
    while (len && path[len - 1] == '/')
        len--;
    int w = snprintf(base, cap, "http://%s:%s%.*s", host, port, (int)len, path);
    if (w < 0 || (size_t)w >= cap) {
        wl_fail("%s: the URL is too long", url);
        goto out;
    }
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_free(user);
    curl_free(pass);
    curl_url_cleanup(u);
    return rc;
}

/* ---- seeded draws --------------------------------------------------------- */

void wl_lg_arrivals(double *t, int n, double rate, uint64_t *state)
{
    for (int i = 0; i < n; i++) {
        double gap = isinf(rate) ? 0 : -log1p(-wl_rand_uniform(state)) / rate;
        t[i] = i ? t[i - 1] + gap : 0;
    }
}

int wl_lg_uniform_int(uint64_t *state, int lo, int hi)
{
    int v = lo + (int)(wl_rand_uniform(state) * ((double)hi - lo + 1));
    return v > hi ? hi : v; /* a uniform draw of exactly 1 - 2^-53 rounding up */
}

/* Common words, each one token after a space in the byte-level BPE
 * vocabularies named in loadgen.h. */
static const char *const words[] = {
    "the",   "of",    "and",   "to",    "in",    "is",     "that",   "for",    "it",    "as",
    "was",   "with",  "be",    "by",    "on",    "not",    "he",     "this",   "are",   "or",
    "his",   "from",  "at",    "which", "but",   "have",   "an",     "had",    "they",  "you",
    "were",  "their", "one",   "all",   "we",    "can",    "her",    "has",    "there", "been",
    "if",    "more",  "when",  "will",  "would", "who",    "so",     "no",     "time",  "people",
    "year",  "way",   "day",   "man",   "world", "life",   "hand",   "part",   "child", "eye",
    "woman", "place", "work",  "week",  "case",  "point",  "number", "group",  "water", "house",
    "city",  "river", "light", "music", "table", "door",   "road",   "garden", "night", "green",
    "small", "large", "old",   "new",   "good",  "great",  "long",   "little", "right", "early",
    "young", "open",  "paper", "stone", "bread", "summer", "winter", "king",   "ship",  "morning"};

char *wl_lg_prompt(uint64_t *state, int n)
{
    enum { COUNT = sizeof words / sizeof words[0] };
    size_t cap = (size_t)(n < 1 ? 1 : n) * 9 + 1, len = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (int i = 0; i < (n < 1 ? 1 : n); i++) {
        const char *w = words[wl_rand_next(state) % COUNT];
        size_t wn = strlen(w);
        if (i)
            s[len++] = ' ';
        memcpy(s + len, w, wn);
        len += wn;
    }
    s[len] = 0;
    return s;
}

/* ---- statistics ------------------------------------------------------------ */

double wl_lg_quantile(const double *v, size_t n, double q)
{
    if (!n)
        return NAN;
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n)
        return v[n - 1];
    return v[i] + (pos - (double)i) * (v[i + 1] - v[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void wl_lg_summarize(double *v, size_t n, wl_lg_dist *d)
{
    double sum = 0;
    qsort(v, n, sizeof *v, cmp_double);
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    d->n = n;
    d->mean = n ? sum / (double)n : NAN;
    d->p50 = wl_lg_quantile(v, n, 0.5);
    d->p90 = wl_lg_quantile(v, n, 0.9);
    d->p99 = wl_lg_quantile(v, n, 0.99);
    d->max = n ? v[n - 1] : NAN;
}

const char *wl_lg_reason_name(wl_lg_reason r)
{
    static const char *const names[WL_LG_REASONS] = {"ok",        "connect", "http",     "timeout",
                                                     "malformed", "server",  "transport"};
    return r < WL_LG_REASONS ? names[r] : "?";
}
