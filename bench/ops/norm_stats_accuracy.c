/*
 * norm_stats_accuracy.c - how far LayerNorm's variance strays, in fp32, under
 * the ways a held row could take its statistics; a simulation on the CPU of
 * the held kernels' arithmetic, not a timing.
 *
 *   cc -O2 -ffp-contract=off bench/ops/norm_stats_accuracy.c -lm && ./a.out
 *
 * A row of 65536 bf16 values, held 64 a thread by 1024 threads, each thread
 * summing its values in order and the threads' results combined by a
 * pairwise tree (as the butterflies and the cluster's exchange do):
 *  - moments: each thread's count, mean and squared deviations from it
 *    (two passes over its values), merged pairwise (Chan, Golub and
 *    LeVeque): the library's held kernels before;
 *  - moments again, but each warp's from two plain sums over its threads
 *    (of s, giving the warp's mean; then of each thread's m2 plus its count
 *    times its mean's squared distance from the warp's), the warps' merged
 *    pairwise: two sums in place of five merges a warp;
 *  - moments of each warp in two passes over its values (the sum of its
 *    threads' sums giving its mean, then the sum of their squared
 *    deviations from it), the warps' merged pairwise: the library's held
 *    kernels since;
 *  - moments, each warp's and each block's of 8 warps from two sums over
 *    its parts, about the first part's mean m0 (of each part's count
 *    times its mean's distance from m0, giving the group's mean M; then of
 *    each part's m2 plus its count times its mean's squared distance from
 *    M), the 4 blocks merged pairwise: tried in the packed kernels of
 *    half types, level to 2.6% slower (bench/RESULTS.md, 2026-12-03);
 *  - shifted about one value for the whole row, a warp's 32 threads, or
 *    each thread: sums of d and d^2 with d = s - shift in one pass, the
 *    groups' sums added, then merged as moments (bench/ops/'s former
 *    shifted_* variants shifted by the thread).
 * It prints the worst relative error of the variance over 20 rows of each
 * kind, against double precision. fp32 results are held to 1e-5.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 65536, VPT = 64, THREADS = N / VPT, WARP = 32, TRIALS = 20 };

static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

static double gauss(void)
{
    double u = (rand() + 1.0) / (RAND_MAX + 2.0), v = (rand() + 1.0) / (RAND_MAX + 2.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

typedef struct moments {
    float n, mean, m2;
} moments;

/* the kernels' merge: the midpoint when the counts are equal */
static moments merge(moments a, moments b)
{
    float d = b.mean - a.mean, n = a.n + b.n;
    if (a.n == b.n)
        return (moments){n, (a.mean + b.mean) * 0.5f, a.m2 + b.m2 + d * d * (a.n * 0.5f)};
    return (moments){n, a.mean + d * b.n / n, a.m2 + b.m2 + d * d * a.n * b.n / n};
}

static float merged_variance(moments *m, int count)
{
    for (int width = count; width > 1; width /= 2)
        for (int t = 0; t < width / 2; t++)
            m[t] = merge(m[t], m[t + width / 2]);
    return m[0].m2 / N;
}

/* each thread's moments: its mean, then its squared deviations from it */
static void thread_moments(const float *x, moments *m)
{
    for (int t = 0; t < THREADS; t++) {
        const float *v = x + t * VPT;
        float sum = 0.0f, m2 = 0.0f;
        for (int k = 0; k < VPT; k++)
            sum += v[k];
        float mean = sum / VPT;
        for (int k = 0; k < VPT; k++)
            m2 += (v[k] - mean) * (v[k] - mean);
        m[t] = (moments){VPT, mean, m2};
    }
}

static float variance_by_moments(const float *x)
{
    static moments m[THREADS];
    thread_moments(x, m);
    return merged_variance(m, THREADS);
}

/* each thread's moments; each warp's from two sums over its threads */
static float variance_by_warp_sums(const float *x)
{
    static moments m[THREADS / WARP];
    static float sum[WARP], mean[WARP], m2[WARP];
    for (int w = 0; w < THREADS / WARP; w++) {
        for (int t = 0; t < WARP; t++) {
            const float *v = x + (w * WARP + t) * VPT;
            float s = 0.0f, q = 0.0f;
            for (int k = 0; k < VPT; k++)
                s += v[k];
            mean[t] = s / VPT, sum[t] = s;
            for (int k = 0; k < VPT; k++)
                q += (v[k] - mean[t]) * (v[k] - mean[t]);
            m2[t] = q;
        }
        for (int width = WARP; width > 1; width /= 2)
            for (int t = 0; t < width / 2; t++)
                sum[t] += sum[t + width / 2];
        const float n = (float)(WARP * VPT), warp_mean = sum[0] / n;
        for (int t = 0; t < WARP; t++)
            m2[t] = fmaf(VPT * (mean[t] - warp_mean), mean[t] - warp_mean, m2[t]);
        for (int width = WARP; width > 1; width /= 2)
            for (int t = 0; t < width / 2; t++)
                m2[t] += m2[t + width / 2];
        m[w] = (moments){n, warp_mean, m2[0]};
    }
    return merged_variance(m, THREADS / WARP);
}

/* groups of parts by two sums about the first part's mean, as a
 * butterfly would take them (sums in its pairwise order) */
static moments group_by_sums(moments *m, int count)
{
    static float d[THREADS], n[THREADS];
    const float m0 = m[0].mean;
    for (int t = 0; t < count; t++)
        n[t] = m[t].n, d[t] = m[t].n * (m[t].mean - m0);
    for (int width = count; width > 1; width /= 2)
        for (int t = 0; t < width / 2; t++)
            n[t] += n[t + width / 2], d[t] += d[t + width / 2];
    const float mean = m0 + d[0] / n[0], count_all = n[0];
    for (int t = 0; t < count; t++)
        d[t] = fmaf(m[t].n * (m[t].mean - mean), m[t].mean - mean, m[t].m2);
    for (int width = count; width > 1; width /= 2)
        for (int t = 0; t < width / 2; t++)
            d[t] += d[t + width / 2];
    return (moments){count_all, mean, d[0]};
}

/* each thread's moments; each warp's and each block's of 8 warps by
 * group_by_sums, the blocks merged pairwise */
static float variance_by_group_sums(const float *x)
{
    enum { BLOCK_WARPS = 8, WARPS = THREADS / WARP };
    static moments m[THREADS], warps[WARPS], blocks[WARPS / BLOCK_WARPS];
    thread_moments(x, m);
    for (int w = 0; w < WARPS; w++)
        warps[w] = group_by_sums(m + w * WARP, WARP);
    for (int b = 0; b < WARPS / BLOCK_WARPS; b++)
        blocks[b] = group_by_sums(warps + b * BLOCK_WARPS, BLOCK_WARPS);
    return merged_variance(blocks, WARPS / BLOCK_WARPS);
}

/* each warp's moments in two passes over its values: the sum of its
 * threads' sums gives the warp's mean, then its threads' squared
 * deviations from that mean are summed; the warps' merged pairwise */
static float variance_by_warp_passes(const float *x)
{
    static moments m[THREADS / WARP];
    static float sum[WARP], m2[WARP];
    for (int w = 0; w < THREADS / WARP; w++) {
        const float *v = x + w * WARP * VPT;
        for (int t = 0; t < WARP; t++) {
            sum[t] = 0.0f;
            for (int k = 0; k < VPT; k++)
                sum[t] += v[t * VPT + k];
        }
        for (int width = WARP; width > 1; width /= 2)
            for (int t = 0; t < width / 2; t++)
                sum[t] += sum[t + width / 2];
        const float n = (float)(WARP * VPT), warp_mean = sum[0] / n;
        for (int t = 0; t < WARP; t++) {
            m2[t] = 0.0f;
            for (int k = 0; k < VPT; k++)
                m2[t] += (v[t * VPT + k] - warp_mean) * (v[t * VPT + k] - warp_mean);
        }
        for (int width = WARP; width > 1; width /= 2)
            for (int t = 0; t < width / 2; t++)
                m2[t] += m2[t + width / 2];
        m[w] = (moments){n, warp_mean, m2[0]};
    }
    return merged_variance(m, THREADS / WARP);
}

/* shifted by the first value of each group of `group` threads */
static float variance_shifted(const float *x, int group)
{
    static moments m[THREADS];
    static float s1[THREADS], s2[THREADS];
    const int groups = THREADS / group;
    for (int g = 0; g < groups; g++) {
        const float *v = x + g * group * VPT, shift = v[0];
        for (int t = 0; t < group; t++) {
            float a = 0.0f, b = 0.0f;
            for (int k = 0; k < VPT; k++) {
                float d = v[t * VPT + k] - shift;
                a += d;
                b = fmaf(d, d, b);
            }
            s1[t] = a, s2[t] = b;
        }
        for (int width = group; width > 1; width /= 2)
            for (int t = 0; t < width / 2; t++)
                s1[t] += s1[t + width / 2], s2[t] += s2[t + width / 2];
        float n = (float)(group * VPT), q = s1[0] / n;
        m[g] = (moments){n, shift + q, fmaxf(fmaf(-s1[0], q, s2[0]), 0.0f)};
    }
    return merged_variance(m, groups);
}

static double variance_exact(const float *x)
{
    double sum = 0.0, m2 = 0.0;
    for (int i = 0; i < N; i++)
        sum += x[i];
    double mean = sum / N;
    for (int i = 0; i < N; i++)
        m2 += (x[i] - mean) * (x[i] - mean);
    return m2 / N;
}

/* row kind k: standard normal values, moved and marked as named */
static const char *const KINDS[] = {
    "N(0,1)",
    "N(100,1)",
    "N(0,1), s[0] = 1000",
    "N(0,1), s[777] = 1000",
    "N(1000,1), s[0] = 0",
    "halves at +30 and -30",
};
enum { NKINDS = sizeof KINDS / sizeof *KINDS };

static void fill_row(float *x, int kind)
{
    for (int i = 0; i < N; i++) {
        double v = gauss();
        v += kind == 1 ? 100.0 : kind == 4 ? 1000.0 : kind == 5 ? (i < N / 2 ? 30.0 : -30.0) : 0.0;
        x[i] = round_bf16((float)v);
    }
    if (kind == 2)
        x[0] = 1000.0f;
    if (kind == 3)
        x[777] = 1000.0f;
    if (kind == 4)
        x[0] = 0.0f;
}

/* the schemes, in the columns' order */
static const char *const SCHEMES[] = {"moments",   "warp sums",  "warp passes", "group sums",
                                      "row shift", "warp shift", "thread shift"};
enum { NSCHEMES = sizeof SCHEMES / sizeof SCHEMES[0] };

int main(void)
{
    static float x[N];
    printf("%-24s", "row");
    for (int s = 0; s < NSCHEMES; s++)
        printf(" %12s", SCHEMES[s]);
    printf("\n");
    for (int kind = 0; kind < NKINDS; kind++) {
        double worst[NSCHEMES] = {0};
        for (int trial = 0; trial < TRIALS; trial++) {
            fill_row(x, kind);
            const double exact = variance_exact(x);
            const float got[NSCHEMES] = {variance_by_moments(x),       variance_by_warp_sums(x),
                                         variance_by_warp_passes(x),   variance_by_group_sums(x),
                                         variance_shifted(x, THREADS), variance_shifted(x, WARP),
                                         variance_shifted(x, 1)};
            for (int s = 0; s < NSCHEMES; s++)
                worst[s] = fmax(worst[s], fabs(got[s] - exact) / exact);
        }
        printf("%-24s", KINDS[kind]);
        for (int s = 0; s < NSCHEMES; s++)
            printf(" %12.2e", worst[s]);
        printf("\n");
    }
    return 0;
}
