/*
 * gpu_common.cuh - what the weft GPU benchmarks (bench/gpu/) and their raw
 * CUDA peers (bench/peers/) share, so that both do exactly the same work.
 *
 *   kernels     k_mix: one pass over a 1 MiB buffer, each word put through
 *               `iters` rounds of an integer mix (iters calibrated so that
 *               one launch takes about 10 us on the device); k_empty; k_spin
 *               (one thread that spins on the GPU's global timer)
 *   host work   host_work(): a checksum over a job's buffer, `words` 64-bit
 *               words of it (calibrated in words per microsecond)
 *   checking    every pipeline job stamps its id into word 0 of its input;
 *               verify_slot() checks a slot's output against the host
 *               reference of the two k_mix launches, so a configuration that
 *               skips or reorders work cannot post a figure
 *   measuring   wall clock, process CPU (getrusage: user + sys, all
 *               threads), medians, BENCH lines, a watchdog alarm
 *
 * Every program is one translation unit that includes this file, so the
 * kernels are defined here (not static: one definition per program).
 * Numbers go to stdout as `BENCH <name> <value> <unit>` lines (and
 * `CALIB <key> <value>` for calibration); everything else goes to stderr.
 * A program that finds no GPU says so and exits with EXIT_NO_GPU (77).
 */
#ifndef WEFT_BENCH_GPU_COMMON_CUH
#define WEFT_BENCH_GPU_COMMON_CUH

#include <cuda_runtime.h>

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define EXIT_NO_GPU 77

#define BENCH_BYTES (1u << 20)             /* one job's buffer: 1 MiB */
#define BENCH_WORDS (BENCH_BYTES / 4u)     /* as uint32_t, for k_mix */
#define MIX_BLOCK 256u                     /* k_mix: one word per thread */
#define MIX_GRID (BENCH_WORDS / MIX_BLOCK) /* 1024 blocks: the whole GPU */
#define SALT1 0x9e3779b9u                  /* the first k_mix of a job */
#define SALT2 0x7f4a7c15u                  /* the second */
#define KERNEL_TARGET_US 10.0              /* one k_mix launch */
#define VERIFY_STRIDE 997u                 /* words of a slot verified */

#define MAX_LIST 16

static const char *bench_prog = "gpu-bench"; /* set by main: error prefix */

/* ---- errors ------------------------------------------------------------ */

/* A benchmark cannot go on after a failure; threads may be mid-call, so
 * leave without running exit handlers. */
__attribute__((noreturn)) static inline void bench_die(void)
{
    fflush(NULL);
    _exit(1);
}

static inline void ck_at(cudaError_t e, const char *what, const char *file, int line)
{
    if (e == cudaSuccess)
        return;
    fprintf(stderr, "%s: %s:%d: %s: %s (%s)\n", bench_prog, file, line, what, cudaGetErrorName(e),
            cudaGetErrorString(e));
    bench_die();
}

/* Every CUDA call goes through CK. */
#define CK(call) ck_at((call), #call, __FILE__, __LINE__)

/* Exit 77 unless a GPU is there. Creates no CUDA context (weft may want to
 * set CUDA_DEVICE_MAX_CONNECTIONS before one exists). */
static inline void require_gpu(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        fprintf(stderr, "%s: no GPU (%s); nothing to measure\n", bench_prog,
                e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
        exit(EXIT_NO_GPU);
    }
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    int rt = 0, drv = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    fprintf(stderr, "%s: GPU 0: %s, sm_%d%d, %d SMs; CUDA runtime %d.%d, driver %d.%d\n",
            bench_prog, p.name, p.major, p.minor, p.multiProcessorCount, rt / 1000, rt % 1000 / 10,
            drv / 1000, drv % 1000 / 10);
}

/* ---- kernels ----------------------------------------------------------- */

/* The word function of k_mix: an LCG step and an xorshift, iters times. Not
 * linear, so no compiler folds the rounds. Also the host reference. */
__host__ __device__ inline uint32_t mix_word(uint32_t x, uint32_t iters, uint32_t salt)
{
    for (uint32_t i = 0; i < iters; i++) {
        x = x * 1664525u + (1013904223u ^ salt);
        x ^= x >> 15;
    }
    return x;
}

/* One pass over data[0..n): each word through mix_word, in place. */
__global__ void k_mix(uint32_t *data, uint32_t n, uint32_t iters, uint32_t salt)
{
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        data[i] = mix_word(data[i], iters, salt);
}

__global__ void k_empty(void)
{
}

__device__ inline uint64_t global_timer_ns(void)
{
    uint64_t t = 0;
#ifdef __CUDA_ARCH__ /* the host pass never calls it */
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
#endif
    return t;
}

/* Occupy one thread for ns nanoseconds of wall time. The global timer, not
 * clock64(): its rate does not follow the SM clock, so no calibration. */
__global__ void k_spin(uint64_t ns)
{
    uint64_t t0 = global_timer_ns();
    while (global_timer_ns() - t0 < ns) {
    }
}

/* Launch k_mix on stream st, the way the peers do: cudaLaunchKernel. */
static inline cudaError_t launch_mix(cudaStream_t st, uint32_t *d, uint32_t iters, uint32_t salt)
{
    uint32_t n = BENCH_WORDS;
    void *args[] = {&d, &n, &iters, &salt};
    return cudaLaunchKernel((const void *)k_mix, dim3(MIX_GRID), dim3(MIX_BLOCK), args, 0, st);
}

/* ---- time and CPU ------------------------------------------------------ */

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of the whole process (every thread), user + system, seconds. */
static inline double cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) {
        perror("getrusage");
        bench_die();
    }
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* A measured interval: wall and process CPU. */
struct span {
    double wall0, cpu0, wall, cpu;
};

static inline void span_begin(struct span *s)
{
    s->cpu0 = cpu_s();
    s->wall0 = now_s();
}

static inline void span_end(struct span *s)
{
    s->wall = now_s() - s->wall0;
    s->cpu = cpu_s() - s->cpu0;
}

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v; the median (the upper one for even n), min and max. */
struct stats {
    double med, min, max;
};

static inline struct stats stats_of(double *v, int n)
{
    struct stats s = {0, 0, 0};
    if (n <= 0)
        return s;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    s.med = v[n / 2];
    s.min = v[0];
    s.max = v[n - 1];
    return s;
}

/* The p-th quantile (0..1) of sorted v. */
static inline double quantile(const double *v, int n, double p)
{
    int i = (int)(p * (double)(n - 1) + 0.5);
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static inline void bench_line(const char *name, double value, const char *unit)
{
    printf("BENCH %s %.6g %s\n", name, value, unit);
    fflush(stdout);
}

/* A pipeline figure: jobs/s and cores used over n repetitions (sorted),
 * printed as median (min..max) and as BENCH lines name.jobs_per_s and
 * name.cores. */
static inline void report_jobs(const char *name, double *rate, double *cores, int n)
{
    struct stats sr = stats_of(rate, n), sc = stats_of(cores, n);
    char buf[160];
    fprintf(stderr, "%-34s %9.0f jobs/s (%.0f..%.0f)  %5.2f cores (%.2f..%.2f)\n", name, sr.med,
            sr.min, sr.max, sc.med, sc.min, sc.max);
    snprintf(buf, sizeof buf, "%s.jobs_per_s", name);
    bench_line(buf, sr.med, "jobs/s");
    snprintf(buf, sizeof buf, "%s.cores", name);
    bench_line(buf, sc.med, "cores");
}

/* ---- watchdog ---------------------------------------------------------- */

/* A hang (in weft or in CUDA) must not hang the whole run: each section
 * arms an alarm, and the handler names the section. */
static const char *volatile bench_section = "start";

static inline void on_alarm(int sig)
{
    (void)sig;
    const char *s = bench_section;
    ssize_t r = write(2, bench_prog, strlen(bench_prog));
    r = write(2, ": timed out in ", 15);
    r = write(2, s, strlen(s));
    r = write(2, "\n", 1);
    (void)r;
    _exit(3);
}

static inline void watchdog(const char *section, unsigned seconds)
{
    bench_section = section;
    signal(SIGALRM, on_alarm);
    alarm(seconds);
}

/* ---- host work --------------------------------------------------------- */

/* Checksum `words` 64-bit words of a job's 1 MiB buffer, wrapping around:
 * FNV-style multiply with an xorshift, one dependent chain (so the cost per
 * word is the same on every run and at every optimization level). */
static inline uint64_t host_work(const void *buf, uint64_t words)
{
    const uint64_t *w = (const uint64_t *)buf;
    const uint64_t mask = BENCH_BYTES / 8u - 1u;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < words; i++) {
        h ^= w[i & mask];
        h *= 0x100000001b3ull;
        h ^= h >> 29;
    }
    return h;
}

static volatile uint64_t host_sink;

/* Words of host_work per microsecond on this CPU (fastest of several). */
static inline double calibrate_host(const void *buf)
{
    const uint64_t words = 1u << 18;
    double best = 1e30;
    host_sink = host_work(buf, words); /* warm the caches */
    for (int i = 0; i < 9; i++) {
        double t0 = now_s();
        host_sink = host_work(buf, words);
        double t = now_s() - t0;
        if (t < best)
            best = t;
    }
    return (double)words / (best * 1e6);
}

/* ---- kernel calibration ------------------------------------------------ */

/* Device time of one k_mix launch with `iters` rounds, in microseconds: a
 * batch of back-to-back launches between two events, divided. */
static inline double time_mix_us(cudaStream_t st, uint32_t *d, uint32_t iters)
{
    const int batch = 50;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < 3; i++)
        CK(launch_mix(st, d, iters, SALT1));
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        CK(cudaEventRecord(e0, st));
        for (int i = 0; i < batch; i++)
            CK(launch_mix(st, d, iters, SALT1));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = (double)ms * 1000.0 / batch;
        if (us < best)
            best = us;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return best;
}

/* Rounds of k_mix for one launch to take about KERNEL_TARGET_US, found by
 * fitting time = fixed + per_round * iters and refining twice. d: a 1 MiB
 * device buffer. */
static inline uint32_t calibrate_kernel(cudaStream_t st, uint32_t *d)
{
    double t0 = time_mix_us(st, d, 0);
    uint32_t iters = 256;
    double t = time_mix_us(st, d, iters);
    for (int round = 0; round < 3; round++) {
        double per = (t - t0) / iters;
        if (per <= 0)
            per = 1e-3;
        double want = (KERNEL_TARGET_US - t0) / per;
        uint32_t next = want < 1 ? 1 : want > 1e7 ? 10000000u : (uint32_t)(want + 0.5);
        if (next == iters)
            break;
        iters = next;
        t = time_mix_us(st, d, iters);
    }
    fprintf(stderr, "%s: k_mix: %u rounds take %.2f us (empty pass %.2f us)\n", bench_prog, iters,
            t, t0);
    return iters;
}

/* ---- the pipeline's jobs ----------------------------------------------- */

/* One job's buffers. A slot is used by one job at a time. */
struct slot {
    uint32_t *in;  /* pinned, BENCH_BYTES: word 0 is the job id */
    uint32_t *out; /* pinned, BENCH_BYTES */
    uint32_t *dev; /* device, BENCH_BYTES */
    uint64_t sum_in, sum_out;
    long last_job; /* the last job that ran in this slot, -1: none */
};

/* Fill a slot's input with a pattern of its own (word 0 is overwritten by
 * each job's id). */
static inline void slot_fill(struct slot *s, unsigned index)
{
    for (uint32_t i = 0; i < BENCH_WORDS; i++)
        s->in[i] = mix_word(i ^ (index << 20), 1, SALT2);
    memset(s->out, 0, BENCH_BYTES);
    s->last_job = -1;
}

/* The host work before a job's GPU work: stamp the id, checksum the input. */
static inline void job_pre(struct slot *s, long job, uint64_t words)
{
    s->in[0] = (uint32_t)job;
    s->sum_in = host_work(s->in, words);
}

/* The host work after it: checksum the output. */
static inline void job_post(struct slot *s, long job, uint64_t words)
{
    s->sum_out = host_work(s->out, words);
    s->last_job = job;
}

/* After a run: does the slot's output hold its last job's result? Checks
 * every VERIFY_STRIDE-th word against the host reference; with stamped
 * (jobs with host work), also that word 0 is the last job's id. Prints the
 * first mismatch. */
static inline int verify_slot(const struct slot *s, unsigned index, uint32_t iters, int stamped)
{
    if (stamped && (s->last_job < 0 || s->in[0] != (uint32_t)s->last_job)) {
        fprintf(stderr, "%s: slot %u: input stamp %u, last job %ld\n", bench_prog, index, s->in[0],
                s->last_job);
        return 0;
    }
    for (uint32_t i = 0; i < BENCH_WORDS; i += VERIFY_STRIDE) {
        uint32_t want = mix_word(mix_word(s->in[i], iters, SALT1), iters, SALT2);
        if (s->out[i] != want) {
            fprintf(stderr, "%s: slot %u word %u: got %08x, want %08x\n", bench_prog, index, i,
                    s->out[i], want);
            return 0;
        }
    }
    return 1;
}

/* ---- command lines ----------------------------------------------------- */

/* Parse "5,20,100" into v (at most MAX_LIST). Returns the count, 0 on bad
 * input. */
static inline int parse_list(const char *s, unsigned *v)
{
    int n = 0;
    while (*s) {
        char *end;
        unsigned long x = strtoul(s, &end, 10);
        if (end == s || n == MAX_LIST || x == 0 || x > 1000000)
            return 0;
        v[n++] = (unsigned)x;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return 0;
    }
    return n;
}

static inline unsigned long parse_num(const char *opt, const char *s)
{
    char *end;
    unsigned long x = s ? strtoul(s, &end, 10) : 0;
    if (!s || end == s || *end || x == 0) {
        fprintf(stderr, "%s: %s wants a positive number\n", bench_prog, opt);
        exit(2);
    }
    return x;
}

static inline double parse_real(const char *opt, const char *s)
{
    char *end;
    double x = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || !(x > 0)) {
        fprintf(stderr, "%s: %s wants a positive number\n", bench_prog, opt);
        exit(2);
    }
    return x;
}

#endif
