/*
 * test_images_gpu.c - weft-images gives the same results on the GPU as on
 * the host backend: every JSON line (hash, histogram, size) bit for bit,
 * on fixtures and on a generated sample set with broken files, and so the
 * same groups. The set includes a picture large enough for the kernels'
 * grid-stride loops and one smaller than the 32x32 shrink. The benchmark's
 * thread-pool peer must write the same image lines too. Exits 77 (skipped)
 * without a GPU.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "images_test.h"
#include "weft.h"

static int by_text(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The output's lines, sorted (the program writes them as images finish). */
static char **sorted_lines(char *text, size_t *n)
{
    size_t cap = 1;
    for (const char *c = text; *c; c++)
        cap += *c == '\n';
    char **lines = calloc(cap, sizeof *lines), *save;
    *n = 0;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        lines[(*n)++] = l;
    qsort(lines, *n, sizeof *lines, by_text);
    return lines;
}

static char *run_backend(const char *dir, const char *images, const char *backend)
{
    char *out_path, *kernels_note = NULL;
    assert_true(asprintf(&out_path, "%s/%s.jsonl", dir, backend) > 0);
    char *argv[] = {WI_BIN, "-q",     "--backend",    (char *)backend,
                    "-o",   out_path, (char *)images, NULL};
    ran r = run_program(dir, argv);
    if (r.status != 0)
        fail_msg("weft-images --backend %s exited %d:\n%s", backend, r.status, r.err);
    kernels_note = strstr(r.err, !strcmp(backend, "cuda") ? "CUDA kernels" : "host versions");
    assert_non_null(kernels_note);
    ran_free(&r);
    char *out = slurp(out_path);
    assert_non_null(out);
    free(out_path);
    return out;
}

static void test_gpu_and_host_give_identical_lines(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    assert_non_null(dir);
    char *images = join(dir, "images"), *truth = join(dir, "truth.txt");
    char *gen[] = {WI_SAMPLE_BIN, "-n", "400", "--broken", "7", "-s",
                   "5",           "-t", truth, images,     NULL};
    ran r = run_program(dir, gen);
    assert_int_equal(r.status, 0);
    ran_free(&r);

    /* Fixtures beside the samples, including sizes that are not a multiple
     * of any block size, and one smaller than the 32x32 shrink. */
    uint8_t rgb[QUAD * QUAD * 3];
    char *quad = join(images, "quadrants.png"), *tiny = join(images, "tiny.ppm");
    fill_quadrants(rgb, false);
    assert_true(stbi_write_png(quad, QUAD, QUAD, 3, rgb, QUAD * 3));
    for (int i = 0; i < 7 * 5 * 3; i++)
        rgb[i] = (uint8_t)(i * 37);
    assert_true(write_pnm(tiny, rgb, 7, 5, false));
    enum { LW = 1999, LH = 1501 }; /* 3 Mpixels: beyond one grid of the histogram kernel */
    uint8_t *large_rgb = malloc((size_t)LW * LH * 3);
    char *large = join(images, "large.png");
    assert_non_null(large_rgb);
    for (int y = 0; y < LH; y++)
        for (int x = 0; x < LW; x++) {
            uint8_t *px = large_rgb + 3 * ((size_t)y * LW + x);
            int dx = x - 700, dy = y - 900;
            px[0] = (uint8_t)(x * 255 / LW);
            px[1] = dx * dx + dy * dy < 400 * 400 ? 230 : (uint8_t)(y * 255 / LH);
            px[2] = (uint8_t)((x ^ y) & 255);
        }
    assert_true(stbi_write_png(large, LW, LH, 3, large_rgb, LW * 3));
    free(large_rgb);

    char *host = run_backend(dir, images, "host"), *cuda = run_backend(dir, images, "cuda");
    size_t nh, nc;
    char **lh = sorted_lines(host, &nh), **lc = sorted_lines(cuda, &nc);
    assert_int_equal(nh, nc);
    assert_true(nh > 400); /* images and groups */
    for (size_t i = 0; i < nh; i++)
        if (strcmp(lh[i], lc[i]))
            fail_msg("host and GPU differ:\n  host %s\n  cuda %s", lh[i], lc[i]);
    bool large_seen = false; /* the text is cut into lines now: look line by line */
    for (size_t i = 0; i < nc; i++)
        large_seen |= strstr(lc[i], "large.png\",\"width\":1999,\"height\":1501") != NULL;
    assert_true(large_seen);

#ifdef WI_THREADS_BIN
    /* The peer writes image lines only: they must be the same ones. */
    char *peer_path = join(dir, "threads.jsonl");
    char *argv[] = {WI_THREADS_BIN, "-j", "4", "-o", peer_path, images, NULL};
    r = run_program(dir, argv);
    assert_int_equal(r.status, 0);
    ran_free(&r);
    char *peer = slurp(peer_path);
    assert_non_null(peer);
    size_t np, images_lines = 0;
    char **lp = sorted_lines(peer, &np);
    for (size_t i = 0, j = 0; i < nc; i++) {
        if (!strstr(lc[i], "\"path\""))
            continue;
        images_lines++;
        assert_true(j < np);
        if (strcmp(lc[i], lp[j]))
            fail_msg("weft-images and its peer differ:\n  weft %s\n  peer %s", lc[i], lp[j]);
        j++;
    }
    assert_int_equal(np, images_lines);
    free(lp);
    free(peer);
    free(peer_path);
#endif
    free(lh);
    free(lc);
    free(host);
    free(cuda);
    free(large);
    free(quad);
    free(tiny);
    free(images);
    free(truth);
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    weft_runtime *rt = NULL;
    weft_config cfg = {.workers = 1};
    bool gpu = weft_runtime_create(&rt, &cfg) == WEFT_OK && !strcmp(weft_backend_name(rt), "cuda");
    if (rt)
        weft_runtime_destroy(rt);
    if (!gpu) {
        printf("SKIPPED: no GPU\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_and_host_give_identical_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
