/*
 * pipeline_no_mpi.c - built in place of pipeline.c where MPI is not found:
 * no pipeline can be opened, and the build says why.
 */
#include <stdio.h>

#include "llm.h"

int wl_link_job(const char *cmd, int (*run)(void *), void *arg)
{
    (void)run, (void)arg;
    fprintf(stderr, "%s: --pipeline: weft-llm was built without MPI (libopenmpi-dev)\n", cmd);
    return 1;
}

int wl_link_open(wl_link **out, weft_runtime *rt)
{
    (void)rt;
    *out = NULL;
    return wl_fail("pipeline: weft-llm was built without MPI (libopenmpi-dev)");
}

void wl_link_close(wl_link *l)
{
    (void)l;
}

int wl_link_rank(const wl_link *l)
{
    (void)l;
    return 0;
}

int wl_link_ranks(const wl_link *l)
{
    (void)l;
    return 1;
}

int wl_link_stage(const wl_link *l, int layers, int *first, int *end)
{
    (void)l;
    *first = 0;
    *end = layers;
    return 0;
}

int wl_link_gather(wl_link *l, const int32_t *mine, int n, int32_t *all)
{
    (void)l, (void)mine, (void)n, (void)all;
    return wl_fail("pipeline: weft-llm was built without MPI (libopenmpi-dev)");
}

int wl_link_move(wl_link *l, int peer, int sending, const wl_part *parts, int n)
{
    (void)l, (void)peer, (void)sending, (void)parts, (void)n;
    return wl_fail("pipeline: weft-llm was built without MPI (libopenmpi-dev)");
}
