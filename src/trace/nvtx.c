/*
 * nvtx.c - NVTX 3 ranges in weft's own domain (see nvtx.h).
 */
#include <stdlib.h>

#include "trace/nvtx.h"

#ifdef WEFT_HAVE_CUDA

#include <pthread.h>

#include <nvtx3/nvToolsExt.h>

static nvtxDomainHandle_t domain;
static pthread_once_t domain_once = PTHREAD_ONCE_INIT;

static void domain_create(void)
{
    domain = nvtxDomainCreateA("weft");
}

static nvtxEventAttributes_t named(const char *name)
{
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name ? name : "task";
    pthread_once(&domain_once, domain_create);
    return a;
}

bool weft__nvtx_attached(void)
{
    /* how NVTX itself finds a tool to load */
    return getenv("NVTX_INJECTION64_PATH") || getenv("NVTX_INJECTION32_PATH");
}

void weft__nvtx_push(const char *name)
{
    nvtxEventAttributes_t a = named(name);
    nvtxDomainRangePushEx(domain, &a);
}

void weft__nvtx_pop(void)
{
    nvtxDomainRangePop(domain);
}

uint64_t weft__nvtx_start(const char *name)
{
    nvtxEventAttributes_t a = named(name);
    return nvtxDomainRangeStartEx(domain, &a);
}

void weft__nvtx_end(uint64_t range)
{
    nvtxDomainRangeEnd(domain, range);
}

#else

bool weft__nvtx_attached(void)
{
    return false;
}

void weft__nvtx_push(const char *name)
{
    (void)name;
}

void weft__nvtx_pop(void)
{
}

uint64_t weft__nvtx_start(const char *name)
{
    (void)name;
    return 0;
}

void weft__nvtx_end(uint64_t range)
{
    (void)range;
}

#endif
