/*
 * timed.c - the guide's timed waits (docs/guide.md, "Timed waits"): one
 * deadline bounds a whole exchange of a send and a receive. A server task
 * answers ANSWERED requests and ends; the client's next exchange finds the
 * request channel with room, so the send succeeds, but no reply ever comes,
 * so the receive times out at the shared deadline. Either backend, no GPU
 * calls.
 */
#include <stdint.h>
#include <stdio.h>

#include <weft.h>

enum { ANSWERED = 5 };

static weft_chan *requests, *replies;

static void *server(void *arg)
{
    (void)arg;
    for (int i = 0; i < ANSWERED; i++) {
        int req, reply;
        if (weft_chan_recv(requests, &req) || (reply = req * req, weft_chan_send(replies, &reply)))
            return (void *)1;
    }
    return NULL;
}

/* One exchange: WEFT_OK with the reply, or the failure of the call that
 * failed (WEFT_ETIMEDOUT once 50 ms have passed). */
static int exchange(int req, int *reply_out)
{
    int reply = 0;
    uint64_t deadline = weft_deadline_in_ns(50 * 1000000ull); /* 50 ms */
    int rc = weft_chan_send_until(requests, &req, deadline);
    if (rc == WEFT_OK)
        rc = weft_chan_recv_until(replies, &reply, deadline);
    if (rc == WEFT_ETIMEDOUT)
        return rc; /* nothing was half done: retry, or give up */
    *reply_out = reply;
    return rc;
}

static void *client(void *arg)
{
    int *answered = arg, reply;
    for (int i = 0; i < ANSWERED; i++) {
        if (exchange(i, &reply) || reply != i * i)
            return (void *)1;
        (*answered)++;
    }
    uint64_t start = weft_now_ns();
    if (exchange(ANSWERED, &reply) != WEFT_ETIMEDOUT)
        return (void *)1;
    return weft_now_ns() - start >= 50 * 1000000ull ? NULL : (void *)1; /* never early */
}

int main(void)
{
    weft_runtime *rt;
    weft_task *s, *c;
    void *server_failed = (void *)1, *client_failed = (void *)1;
    int answered = 0;
    if (weft_runtime_create(&rt, NULL) || weft_chan_create(&requests, sizeof(int), 1) ||
        weft_chan_create(&replies, sizeof(int), 1) || weft_spawn(rt, &s, server, NULL, NULL) ||
        weft_spawn(rt, &c, client, &answered, NULL)) {
        fprintf(stderr, "timed: %s\n", weft_last_error());
        return 1;
    }
    weft_join(s, &server_failed);
    weft_join(c, &client_failed);
    printf("timed: %d exchanges answered, then one timed out after 50 ms with no server: %s\n",
           answered, server_failed || client_failed ? "WRONG" : "as expected");
    weft_chan_destroy(requests);
    weft_chan_destroy(replies);
    return weft_runtime_destroy(rt) || server_failed || client_failed;
}
