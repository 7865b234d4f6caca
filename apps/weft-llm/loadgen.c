/*
 * loadgen.c - `weft-llm loadgen URL [options]`: load for an OpenAI-style
 * completions server on this machine (`weft-llm serve`, or any other) and
 * the measurements a serving benchmark reports. One thread drives a curl
 * multi handle through its socket interface on epoll, so each wake-up
 * costs work for the connections that have data only (not one poll per
 * transfer), and the load generator stays light next to the server it
 * measures. Requests go out at Poisson arrival times drawn from the seed
 * (or all at once), at most --concurrency in flight; a request whose time
 * has come while the cap is reached goes out as soon as one ends.
 *
 * Every draw (arrivals, lengths, each request's prompt words) comes from
 * --seed alone: the same options send the same requests.
 */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "llm.h"
#include "loadgen.h"

/* ---- the run ----------------------------------------------------------------- */

static double cpu_seconds(int user)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    struct timeval t = user ? u.ru_utime : u.ru_stime;
    return (double)t.tv_sec + 1e-6 * (double)t.tv_usec;
}

/* Enough descriptors for the connections in flight. */
static void raise_fd_limit(int in_flight)
{
    struct rlimit l;
    rlim_t want = (rlim_t)in_flight + 64;
    if (getrlimit(RLIMIT_NOFILE, &l) || l.rlim_cur >= want)
        return;
    l.rlim_cur = l.rlim_max == RLIM_INFINITY || l.rlim_max > want ? want : l.rlim_max;
    setrlimit(RLIMIT_NOFILE, &l);
    if (l.rlim_cur < want)
        fprintf(stderr,
                "weft-llm loadgen: only %llu file descriptors for %d connections; "
                "give --concurrency\n",
                (unsigned long long)l.rlim_cur, in_flight);
}

/* The event loop: curl's sockets in an epoll set, curl's one timer. */
typedef struct loop {
    wl_lg_client *g;
    CURLM *m;
    int ep;
    double deadline; /* curl's timer, on the run's clock; < 0: none */
} loop;

static int on_socket(CURL *e, curl_socket_t s, int what, void *arg, void *socketp)
{
    loop *l = arg;
    (void)e;
    (void)socketp;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(l->ep, EPOLL_CTL_DEL, s, NULL); /* fails harmlessly if closed already */
        return 0;
    }
    struct epoll_event ev = {.data.fd = s};
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    if (epoll_ctl(l->ep, EPOLL_CTL_MOD, s, &ev) && errno == ENOENT &&
        epoll_ctl(l->ep, EPOLL_CTL_ADD, s, &ev))
        return -1;
    return 0;
}

static int on_timer(CURLM *m, long ms, void *arg)
{
    loop *l = arg;
    (void)m;
    l->deadline = ms < 0 ? -1 : wl_lg_now(l->g) + 1e-3 * (double)ms;
    return 0;
}

static int socket_action(loop *l, curl_socket_t s, int flags)
{
    int running;
    if (curl_multi_socket_action(l->m, s, flags, &running) != CURLM_OK)
        return wl_fail("curl's transfer loop failed");
    return 0;
}

/* Milliseconds (rounded up: never early) until t, from 0 to 1000. */
static int ms_until(const wl_lg_client *g, double t)
{
    double wait = t - wl_lg_now(g);
    return wait > 1 ? 1000 : wait <= 0 ? 0 : (int)ceil(wait * 1000);
}

static int run(wl_lg_client *g, wl_lg_run *out)
{
    int n = g->o.requests, cap = g->o.concurrency ? g->o.concurrency : n;
    int next = 0, in_flight = 0, finished = 0, rc = -1;
    uint64_t st = g->o.seed;
    double *arrive = malloc((size_t)n * sizeof *arrive);
    loop l = {.g = g, .m = curl_multi_init(), .ep = epoll_create1(EPOLL_CLOEXEC), .deadline = -1};
    if (!arrive || !l.m || l.ep < 0) {
        wl_fail("out of memory or descriptors");
        goto out;
    }
    curl_multi_setopt(l.m, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(l.m, CURLMOPT_SOCKETDATA, &l);
    curl_multi_setopt(l.m, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(l.m, CURLMOPT_TIMERDATA, &l);
    wl_lg_arrivals(arrive, n, g->o.rate, &st);
    for (int i = 0; i < n; i++)
        g->res[i].scheduled = arrive[i];
    raise_fd_limit(cap);
    double user0 = cpu_seconds(1), sys0 = cpu_seconds(0);
    clock_gettime(CLOCK_MONOTONIC, &g->t0);
    while (finished < n) {
        while (next < n && in_flight < cap && arrive[next] <= wl_lg_now(g)) {
            if (wl_lg_start(g, l.m, next++))
                finished++;
            else
                in_flight++; /* curl's timer, set to 0, sends it below */
        }
        int ms = l.deadline < 0 ? 1000 : ms_until(g, l.deadline);
        if (next < n && in_flight < cap) {
            int to_next = ms_until(g, arrive[next]);
            ms = to_next < ms ? to_next : ms;
        }
        struct epoll_event ev[64];
        int k = epoll_wait(l.ep, ev, 64, ms);
        if (k < 0 && errno != EINTR) {
            wl_fail("epoll_wait: %s", strerror(errno));
            goto out;
        }
        for (int i = 0; i < k; i++) {
            int flags = (ev[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                        (ev[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                        (ev[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
            if (socket_action(&l, ev[i].data.fd, flags))
                goto out;
        }
        if (l.deadline >= 0 && l.deadline <= wl_lg_now(g)) {
            l.deadline = -1; /* curl sets the next one in the call */
            if (socket_action(&l, CURL_SOCKET_TIMEOUT, 0))
                goto out;
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(l.m, &left)))
            if (msg->msg == CURLMSG_DONE) {
                CURL *e = msg->easy_handle;
                wl_lg_finish(l.m, e, msg->data.result); /* msg is gone after */
                in_flight--;
                finished++;
            }
    }
    out->wall = wl_lg_now(g) - (n ? g->res[0].sent : 0);
    out->cpu_user = cpu_seconds(1) - user0;
    out->cpu_sys = cpu_seconds(0) - sys0;
    rc = 0;
out:
    /* after a failure (not seen in practice) the transfers in flight are dropped */
    curl_multi_cleanup(l.m);
    if (l.ep >= 0)
        close(l.ep);
    free(arrive);
    return rc;
}

/* ---- the command line ---------------------------------------------------------- */

static void help(FILE *f)
{
    fprintf(f,
            "usage: weft-llm loadgen URL [options]\n"
            "Sends completions requests to an OpenAI-compatible server on this machine\n"
            "(URL's host: 127.0.0.1, [::1] or localhost; e.g. http://127.0.0.1:8000) and\n"
            "reports latencies and throughput.\n"
            "  --requests N          requests in all (default 100)\n"
            "  --rate R|inf          Poisson arrivals, R requests/s; inf: all at once (default)\n"
            "  --concurrency C       at most C requests in flight (default: no cap)\n"
            "  --prompt-tokens A[-B] prompt length, uniform in A..B per request (default 128);\n"
            "                        the prompt is that many common English words, one word\n"
            "                        being about one token for Llama 3, Qwen and GPT-2\n"
            "  --output-tokens A[-B] max_tokens, uniform in A..B (default 128), sent with\n"
            "                        \"ignore_eos\": true so outputs have that length\n"
            "  --stream | --no-stream  server-sent events (default) or one JSON response\n"
            "  --endpoint completions|chat  /v1/completions (default) or /v1/chat/completions\n"
            "  --model NAME          default: the first id of GET /v1/models\n"
            "  --temperature T       default 0\n"
            "  --timeout S           per request, seconds (default 300)\n"
            "  --seed N              arrivals, lengths and prompts (default 0)\n"
            "  --json PATH           the full report, every request too, as JSON\n"
            "Exit status: 0 every request succeeded, 1 some failed or the run could not\n"
            "start, 2 bad usage or a URL off this machine.\n");
}

static int parse_range(const char *s, int *lo, int *hi)
{
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10), b = a;
    if (end != s && *end == '-')
        b = strtol(end + 1, &end, 10);
    if (end == s || *end || errno || a < 1 || b < a || b > (1 << 20))
        return -1;
    *lo = (int)a;
    *hi = (int)b;
    return 0;
}

static int parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return !*s || *end || errno || !(*out >= lo && *out <= hi) ? -1 : 0;
}

static int parse_args(int argc, char **argv, wl_lg_opts *o)
{
    double v;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--stream") || !strcmp(a, "--no-stream")) {
            o->stream = !strcmp(a, "--stream");
            continue;
        }
        if (strncmp(a, "--", 2)) {
            if (o->url) {
                fprintf(stderr, "weft-llm loadgen: one URL only (%s, then %s)\n", o->url, a);
                return -1;
            }
            o->url = a;
            continue;
        }
        if (!val) {
            fprintf(stderr, "weft-llm loadgen: %s needs a value (or is unknown)\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--rate")) {
            if (!strcasecmp(val, "inf"))
                o->rate = INFINITY;
            else if (parse_num(val, 1e-6, 1e9, &o->rate))
                goto bad;
        } else if (!strcmp(a, "--requests")) {
            if (parse_num(val, 1, 1e7, &v))
                goto bad;
            o->requests = (int)v;
        } else if (!strcmp(a, "--concurrency")) {
            if (parse_num(val, 1, 1e6, &v))
                goto bad;
            o->concurrency = (int)v;
        } else if (!strcmp(a, "--prompt-tokens")) {
            if (parse_range(val, &o->prompt_lo, &o->prompt_hi))
                goto bad;
        } else if (!strcmp(a, "--output-tokens")) {
            if (parse_range(val, &o->output_lo, &o->output_hi))
                goto bad;
        } else if (!strcmp(a, "--endpoint")) {
            if (strcmp(val, "completions") && strcmp(val, "chat"))
                goto bad;
            o->endpoint = val;
        } else if (!strcmp(a, "--model")) {
            json_t *t = json_string(val); /* NULL: not UTF-8 */
            json_decref(t);
            if (!*val || !t)
                goto bad;
            o->model = val;
        } else if (!strcmp(a, "--json")) {
            if (!*val)
                goto bad;
            o->json_path = val;
        } else if (!strcmp(a, "--timeout")) {
            if (parse_num(val, 0.001, 1e6, &o->timeout))
                goto bad;
        } else if (!strcmp(a, "--temperature")) {
            if (parse_num(val, 0, 100, &o->temperature))
                goto bad;
        } else if (!strcmp(a, "--seed")) {
            if (parse_num(val, 0, 1.8e19, &v))
                goto bad;
            o->seed = (uint64_t)v;
        } else {
            fprintf(stderr, "weft-llm loadgen: unknown option %s (see --help)\n", a);
            return -1;
        }
        continue;
    bad:
        fprintf(stderr, "weft-llm loadgen: bad value for %s: %s\n", a, val);
        return -1;
    }
    if (!o->url) {
        fprintf(stderr, "weft-llm loadgen: give the server's URL (see --help)\n");
        return -1;
    }
    return 0;
}

int wl_loadgen_main(int argc, char **argv)
{
    wl_lg_client g = {.o = {.endpoint = "completions",
                            .rate = INFINITY,
                            .requests = 100,
                            .prompt_lo = 128,
                            .prompt_hi = 128,
                            .output_lo = 128,
                            .output_hi = 128,
                            .stream = 1,
                            .timeout = 300}};
    char *asked_model = NULL;
    wl_lg_run run_stats = {0};
    int rc = 1, failed = 0;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            help(stdout);
            return 0;
        }
    if (parse_args(argc, argv, &g.o))
        return 2;
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) { /* before any other curl call */
        fprintf(stderr, "weft-llm loadgen: curl would not start\n");
        return 1;
    }
    if (wl_lg_loopback_url(g.o.url, g.base, sizeof g.base)) {
        rc = 2;
        goto out;
    }
    g.o.base = g.base;
    g.chat = !strcmp(g.o.endpoint, "chat");
    snprintf(g.url, sizeof g.url, "%s/v1/%s", g.base, g.chat ? "chat/completions" : "completions");
    if (!g.o.model) {
        if (wl_lg_ask_model(&g, &asked_model))
            goto out;
        g.o.model = asked_model;
    }
    g.headers = curl_slist_append(NULL, "Content-Type: application/json");
    g.headers = g.headers ? curl_slist_append(g.headers, "Expect:") : NULL; /* no 100-continue */
    g.res = calloc((size_t)g.o.requests, sizeof *g.res);
    if (!g.headers || !g.res) {
        wl_fail("out of memory");
        goto out;
    }
    uint64_t lengths = g.o.seed ^ 0x6c656e67746873ull; /* apart from the arrivals' draws */
    for (int i = 0; i < g.o.requests; i++) {
        wl_lg_result *r = &g.res[i];
        r->prompt_words = wl_lg_uniform_int(&lengths, g.o.prompt_lo, g.o.prompt_hi);
        r->max_tokens = wl_lg_uniform_int(&lengths, g.o.output_lo, g.o.output_hi);
        r->ttft = NAN;
        r->completion_tokens = r->prompt_tokens = -1;
    }
    if (run(&g, &run_stats) || wl_lg_report(&g.o, g.res, g.o.requests, &run_stats, stdout))
        goto out;
    for (int i = 0; i < g.o.requests; i++)
        failed += g.res[i].reason != WL_LG_OK;
    rc = failed ? 1 : 0;
    goto done;
out:
    fprintf(stderr, "weft-llm loadgen: %s\n", wl_error());
done:
    for (int i = 0; g.res && i < g.o.requests; i++) {
        free(g.res[i].error);
        free(g.res[i].itl);
    }
    free(g.res);
    curl_slist_free_all(g.headers);
    free(asked_model);
    curl_global_cleanup();
    return rc;
}
