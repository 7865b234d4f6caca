/*
 * test_images_gpu.c - weft-images gives the same results on the GPU as on
 * the host backend: every JSON line (hash, histogram, size) bit for bit,
 * on fixtures and on a generated sample set with broken files, and so the
 * same groups. Exits 77 (skipped) without a GPU.
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

    char *host = run_backend(dir, images, "host"), *cuda = run_backend(dir, images, "cuda");
    size_t nh, nc;
    char **lh = sorted_lines(host, &nh), **lc = sorted_lines(cuda, &nc);
    assert_int_equal(nh, nc);
    assert_true(nh > 400); /* images and groups */
    for (size_t i = 0; i < nh; i++)
        if (strcmp(lh[i], lc[i]))
            fail_msg("host and GPU differ:\n  host %s\n  cuda %s", lh[i], lc[i]);
    free(lh);
    free(lc);
    free(host);
    free(cuda);
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
