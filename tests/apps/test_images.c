/*
 * test_images.c - weft-images on the host backend, run as a user would.
 *
 * Exact JSON for fixtures whose hashes and histograms are known from first
 * principles (images_test.h), the groups they form, the second signal (a
 * faint wallpaper kept from a picture its hash matches, a grey-scale copy
 * still found, both scores printed), a generated sample set
 * with broken files mixed in (each reported, counted, the run going on,
 * the groups matching the planted truth), and the command-line errors.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "images_test.h"

/* ---- fixtures: exact lines and groups --------------------------------------- */

typedef struct fixtures {
    char *dir;
    char *flat, *gray, *quad_png, *quad_bmp, *inverse;
} fixtures;

static void make_fixtures(fixtures *fx)
{
    uint8_t rgb[64 * 48 * 3];
    assert_non_null(fx->dir = tmp_dir());
    fx->flat = join(fx->dir, "flat.png");
    fx->gray = join(fx->dir, "gray.pgm");
    fx->quad_png = join(fx->dir, "quadrants.png");
    fx->quad_bmp = join(fx->dir, "quadrants.bmp");
    fx->inverse = join(fx->dir, "sub/inverse.ppm");
    char *sub = join(fx->dir, "sub");
    assert_int_equal(mkdir(sub, 0777), 0);
    free(sub);

    fill_flat(rgb, 64, 48, 200, 40, 90);
    assert_true(stbi_write_png(fx->flat, 64, 48, 3, rgb, 64 * 3));
    fill_flat(rgb, 20, 10, 128, 128, 128);
    assert_true(write_pnm(fx->gray, rgb, 20, 10, true));
    fill_quadrants(rgb, false);
    assert_true(stbi_write_png(fx->quad_png, QUAD, QUAD, 3, rgb, QUAD * 3));
    assert_true(stbi_write_bmp(fx->quad_bmp, QUAD, QUAD, 3, rgb));
    fill_quadrants(rgb, true);
    assert_true(write_pnm(fx->inverse, rgb, QUAD, QUAD, false));
}

static void free_fixtures(fixtures *fx)
{
    remove_tree(fx->dir);
    free(fx->dir);
    free(fx->flat);
    free(fx->gray);
    free(fx->quad_png);
    free(fx->quad_bmp);
    free(fx->inverse);
}

static void assert_has_line(const char *out, const char *line)
{
    if (!line_with(out, line))
        fail_msg("missing line:\n%s\nin output:\n%s", line, out);
}

static void test_fixtures_give_exact_json_and_groups(void **state)
{
    fixtures fx = {0};
    (void)state;
    make_fixtures(&fx);
    char *out_path = join(fx.dir, ".out.jsonl"); /* hidden: not scanned */
    char *argv[] = {WI_BIN, "--backend", "host", "-q", "-t", "4", "-o", out_path, fx.dir, NULL};
    ran r = run_program(fx.dir, argv);
    assert_int_equal(r.status, 0);
    char *out = slurp(out_path);
    assert_non_null(out);

    int flat_bin[] = {3 << 4 | 0 << 2 | 1}, flat_count[] = {64 * 48};
    int gray_bin[] = {2 << 4 | 2 << 2 | 2}, gray_count[] = {20 * 10};
    int quad_bins[] = {0, 63}, quad_counts[] = {QUAD * QUAD / 2, QUAD * QUAD / 2};
    double quad_detail, inverse_detail;
    uint64_t quad = quadrants_hash(false, &quad_detail);
    uint64_t inverse = quadrants_hash(true, &inverse_detail);
    assert_int_equal(__builtin_popcountll(quad), 8); /* half the odd-odd coefficients */
    assert_int_equal(quad & inverse, 0);

    /* The detail of each quadrants picture as derived, to the basis's
     * rounding; the rest of each line exactly. */
    char details[3][32];
    const char *quads[3] = {fx.quad_png, fx.quad_bmp, fx.inverse};
    for (int i = 0; i < 3; i++) {
        assert_non_null(image_field(out, quads[i], "detail", details[i], sizeof details[i]));
        double got = strtod(details[i], NULL), want = i < 2 ? quad_detail : inverse_detail;
        if (fabs(got - want) > 1e-3 * want)
            fail_msg("%s: detail %s, derived %.4f", quads[i], details[i], want);
    }
    char *want[] = {
        expected_line(fx.flat, 64, 48, 0, "0.000", 1, flat_bin, flat_count),
        expected_line(fx.gray, 20, 10, 0, "0.000", 1, gray_bin, gray_count),
        expected_line(fx.quad_png, QUAD, QUAD, quad, details[0], 2, quad_bins, quad_counts),
        expected_line(fx.quad_bmp, QUAD, QUAD, quad, details[1], 2, quad_bins, quad_counts),
        expected_line(fx.inverse, QUAD, QUAD, inverse, details[2], 2, quad_bins, quad_counts),
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        assert_non_null(want[i]);
        assert_has_line(out, want[i]);
        free(want[i]);
    }

    /* Threshold 4: the flat pair (distance 0) and the quadrants pair (0);
     * the inverse is 16 bits from the quadrants and 8 from the flat ones.
     * Groups are numbered in path order, members listed in path order. */
    char *g1, *g2;
    assert_true(asprintf(&g1, "{\"group\":1,\"images\":[\"%s\",\"%s\"]}", fx.flat, fx.gray) > 0);
    assert_true(
        asprintf(&g2, "{\"group\":2,\"images\":[\"%s\",\"%s\"]}", fx.quad_bmp, fx.quad_png) > 0);
    assert_has_line(out, g1);
    assert_has_line(out, g2);
    assert_int_equal(count_lines_with(out, "\"group\""), 2);
    assert_int_equal(count_lines_with(out, "\"path\""), 5);
    assert_non_null(strstr(r.err, "backend host"));
    assert_non_null(strstr(r.err, "2 near-duplicate groups holding 4 images (threshold 4 bits, "
                                  "details within 3x)"));
    assert_non_null(strstr(r.err, "0 pairs within the threshold kept apart by their detail"));
    assert_int_equal(count_lines_with(out, "\"unconfirmed\""), 0);
    ran_free(&r);

    /* Threshold 8 makes the hash link the flat pictures to all three
     * quadrant pictures: on the hash alone, one group of all five, since
     * linking is transitive. */
    char *hash8[] = {WI_BIN,        "--backend", "host",   "-q",   "-t", "8",
                     "--hash-only", "-o",        out_path, fx.dir, NULL};
    r = run_program(fx.dir, hash8);
    assert_int_equal(r.status, 0);
    free(out);
    out = slurp(out_path);
    assert_int_equal(count_lines_with(out, "\"group\""), 1);
    assert_int_equal(count_lines_with(out, "\"unconfirmed\""), 0);
    assert_non_null(strstr(r.err, "1 near-duplicate groups holding 5 images (threshold 8 bits, "
                                  "hash alone)"));
    ran_free(&r);

    /* But a flat picture has no detail and a quadrants picture much: the
     * confirmation keeps the two pairs apart, and says so for each of the
     * six flat-quadrants pairs, the hash distance and both details given. */
    char *argv8[] = {WI_BIN, "--backend", "host", "-q", "-t", "8", "-o", out_path, fx.dir, NULL};
    r = run_program(fx.dir, argv8);
    assert_int_equal(r.status, 0);
    free(out);
    out = slurp(out_path);
    assert_has_line(out, g1);
    assert_has_line(out, g2);
    assert_int_equal(count_lines_with(out, "\"group\""), 2);
    assert_int_equal(count_lines_with(out, "\"unconfirmed\""), 6);
    char *refused;
    assert_true(asprintf(&refused,
                         "{\"unconfirmed\":[\"%s\",\"%s\"],\"bits\":8,\"detail\":[0.000,%s]}",
                         fx.flat, fx.quad_bmp, details[1]) > 0);
    assert_has_line(out, refused);
    assert_non_null(strstr(r.err, "6 pairs within the threshold kept apart by their detail"));
    free(refused);
    free(g1);
    free(g2);
    ran_free(&r);
    free(out);
    free(out_path);
    free_fixtures(&fx);
}

/* ---- the second signal: a wallpaper is not a picture ----------------------- */

enum { PW = 160, PH = 120 };

/* A blurred photograph's light and dark: a few soft patches, each a
 * smooth bump, on a slope (luminance about 30-230). */
static double soft_patches(int x, int y, double phase)
{
    static const double bumps[4][4] = {{0.25, 0.30, 0.12, 70},
                                       {0.70, 0.35, 0.15, -60},
                                       {0.45, 0.75, 0.18, 55},
                                       {0.85, 0.80, 0.10, -45}};
    double u = (x + 0.5) / PW, v = (y + 0.5) / PH, l = 130 + 40 * (u - v) * cos(phase);
    for (int i = 0; i < 4; i++) {
        double du = u - bumps[i][0] - 0.1 * sin(phase + i), dv = v - bumps[i][1];
        l += bumps[i][3] * exp(-(du * du + dv * dv) / (2 * bumps[i][2] * bumps[i][2]));
    }
    return l;
}

static uint8_t to8(double v)
{
    return v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)(v + 0.5);
}

/* The hash distance between two images of the output, from their lines. */
static int bits_apart(const char *out, const char *a, const char *b)
{
    char ha[32], hb[32];
    assert_non_null(image_field(out, a, "hash", ha, sizeof ha));
    assert_non_null(image_field(out, b, "hash", hb, sizeof hb));
    return __builtin_popcountll(strtoull(ha, NULL, 16) ^ strtoull(hb, NULL, 16));
}

static void read_score(const char *err, const char *how, double *precision, double *recall)
{
    char *key;
    assert_true(asprintf(&key, "against the truth, %s", how) > 0);
    const char *line = line_with(err, key);
    if (!line)
        fail_msg("no '%s' line in:\n%s", key, err);
    assert_int_equal(
        sscanf(strstr(line, "precision"), "precision %lf, recall %lf", precision, recall), 2);
    free(key);
}

static void test_detail_keeps_a_wallpaper_from_a_blurred_grey_picture(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    assert_non_null(dir);
    char *photo = join(dir, "photo-grey.png"), *paper = join(dir, "wallpaper.png"),
         *colour = join(dir, "scene.png"), *grey = join(dir, "scene-grey.pgm"),
         *truth = join(dir, ".truth"), *out_path = join(dir, ".out.jsonl");
    uint8_t *rgb = malloc(PW * PH * 3);
    assert_non_null(rgb);

    /* The pair: a blurred grey photograph, and a smooth purple
     * field shaded by a faint copy (a sixth) of its light and dark. */
    for (int y = 0; y < PH; y++)
        for (int x = 0; x < PW; x++)
            memset(rgb + 3 * (y * PW + x), to8(soft_patches(x, y, 0.3)), 3);
    assert_true(stbi_write_png(photo, PW, PH, 3, rgb, PW * 3));
    for (int y = 0; y < PH; y++)
        for (int x = 0; x < PW; x++) {
            double shade = (soft_patches(x, y, 0.3) - 130) / 6;
            uint8_t *px = rgb + 3 * (y * PW + x);
            px[0] = to8(150 + shade), px[1] = to8(70 + shade), px[2] = to8(170 + shade);
        }
    assert_true(stbi_write_png(paper, PW, PH, 3, rgb, PW * 3));

    /* A colour picture of other patches, and its grey copy (Rec. 709, as an
     * editor makes it, not the hash's weights). */
    for (int y = 0; y < PH; y++)
        for (int x = 0; x < PW; x++) {
            double l = soft_patches(PW - 1 - x, y, 2.1), tint = 40 * sin(6.0 * x / PW);
            uint8_t *px = rgb + 3 * (y * PW + x);
            px[0] = to8(l + tint), px[1] = to8(l - 0.5 * tint), px[2] = to8(l - tint);
        }
    assert_true(stbi_write_png(colour, PW, PH, 3, rgb, PW * 3));
    for (int i = 0; i < PW * PH; i++) {
        uint8_t *px = rgb + 3 * i;
        px[0] = to8(0.2126 * px[0] + 0.7152 * px[1] + 0.0722 * px[2]);
    }
    assert_true(write_pnm(grey, rgb, PW, PH, true));
    FILE *t = fopen(truth, "w");
    assert_non_null(t);
    fprintf(t, "scene.png\tscene-grey.pgm\n");
    assert_int_equal(fclose(t), 0);

    /* On the hash alone, both pairs are near-duplicates: the wallpaper's
     * hash is within the default 10 bits of the photograph's. */
    char *hash_only[] = {WI_BIN, "--backend", "host",   "-q", "--hash-only", "--truth",
                         truth,  "-o",        out_path, dir,  NULL};
    ran r = run_program(dir, hash_only);
    assert_int_equal(r.status, 0);
    char *out = slurp(out_path);
    assert_non_null(out);
    int wall_bits = bits_apart(out, photo, paper), copy_bits = bits_apart(out, colour, grey);
    if (wall_bits > 10 || copy_bits > 10)
        fail_msg("the fixture needs both pairs within 10 bits: wallpaper %d, grey copy %d",
                 wall_bits, copy_bits);
    assert_true(bits_apart(out, photo, colour) > 10); /* the pairs are apart */
    assert_true(bits_apart(out, paper, colour) > 10);
    assert_int_equal(count_lines_with(out, "\"group\""), 2);
    assert_int_equal(count_lines_with(out, "\"unconfirmed\""), 0);
    ran_free(&r);
    free(out);

    /* Confirmed by detail: the wallpaper and the photograph are apart, and
     * the output says why; the grey copy is still found. */
    char *argv[] = {WI_BIN, "--backend", "host", "-q", "--truth", truth, "-o", out_path, dir, NULL};
    r = run_program(dir, argv);
    assert_int_equal(r.status, 0);
    out = slurp(out_path);
    assert_non_null(out);
    char *copies, *refused, photo_detail[32], paper_detail[32];
    assert_true(asprintf(&copies, "{\"group\":1,\"images\":[\"%s\",\"%s\"]}", grey, colour) > 0);
    assert_has_line(out, copies);
    assert_int_equal(count_lines_with(out, "\"group\""), 1);
    assert_non_null(image_field(out, photo, "detail", photo_detail, sizeof photo_detail));
    assert_non_null(image_field(out, paper, "detail", paper_detail, sizeof paper_detail));
    assert_true(strtod(photo_detail, NULL) > 3 * strtod(paper_detail, NULL));
    assert_true(asprintf(&refused,
                         "{\"unconfirmed\":[\"%s\",\"%s\"],\"bits\":%d,\"detail\":[%s,%s]}", photo,
                         paper, wall_bits, photo_detail, paper_detail) > 0);
    assert_has_line(out, refused);
    assert_int_equal(count_lines_with(out, "\"unconfirmed\""), 1);
    assert_non_null(strstr(r.err, "1 pairs within the threshold kept apart by their detail"));

    /* --truth scores both ways, the one written first: the hash alone finds
     * the copy and the false pair (precision 1/2), the detail the copy. */
    double p, rc;
    read_score(r.err, "hash and detail: ", &p, &rc);
    assert_true(p == 1.0 && rc == 1.0);
    read_score(r.err, "hash alone:      ", &p, &rc);
    assert_true(p == 0.5 && rc == 1.0);
    assert_true(strstr(r.err, "hash and detail:") < strstr(r.err, "hash alone:"));
    ran_free(&r);
    free(out);
    free(copies);
    free(refused);
    free(rgb);
    free(photo);
    free(paper);
    free(colour);
    free(grey);
    free(truth);
    free(out_path);
    remove_tree(dir);
    free(dir);
}

/* ---- a generated set with broken files -------------------------------------- */

enum { IMAGES = 120, BROKEN = 8 };

static void test_sample_set_with_broken_files_runs_to_the_end(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    assert_non_null(dir);
    char *images = join(dir, "images"), *truth = join(dir, "truth.txt"),
         *out_path = join(dir, "out.jsonl");
    char count[16], broken[16];
    snprintf(count, sizeof count, "%d", IMAGES);
    snprintf(broken, sizeof broken, "%d", BROKEN);
    char *gen[] = {WI_SAMPLE_BIN, "-n", count, "--broken", broken, "-s", "11",
                   "-j",          "2",  "-t",  truth,      images, NULL};
    ran r = run_program(dir, gen);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.err, "1 decoy pairs"));
    ran_free(&r);

    char *argv[] = {WI_BIN, "--backend", "host",   "-j",   "2", "--truth",
                    truth,  "-o",        out_path, images, NULL};
    r = run_program(dir, argv);
    assert_int_equal(r.status, 0);
    char *out = slurp(out_path);
    assert_non_null(out);

    /* Every picture has its line; every broken file its message, and none
     * of them a line. */
    assert_int_equal(count_lines_with(out, "\"path\""), IMAGES);
    assert_int_equal(count_lines_with(out, "broken-"), 0);
    assert_int_equal(count_lines_with(r.err, "broken-"), BROKEN);
    assert_non_null(line_with(r.err, "broken-01-empty.png: empty file"));
    assert_non_null(line_with(r.err, "broken-02-truncated.png: corrupt or truncated PNG"));
    assert_non_null(line_with(r.err, "broken-03-truncated.jpg: corrupt or truncated JPEG"));
    assert_non_null(line_with(r.err, "broken-04-noise.jpg: not an image"));
    assert_non_null(line_with(r.err, "broken-05-notes.txt: not an image"));
    assert_non_null(line_with(r.err, "broken-06-truncated.bmp: truncated BMP"));
    assert_non_null(line_with(r.err, "broken-07-truncated.gif: truncated GIF"));
    assert_non_null(line_with(r.err, "broken-08-truncated.ppm: truncated PNM"));
    char summary[128];
    snprintf(summary, sizeof summary, "%d files: %d images, %d not readable images",
             IMAGES + BROKEN, IMAGES, BROKEN);
    assert_non_null(strstr(r.err, summary));

    /* The groups found match the planted ones. The set has a decoy pair
     * (a wallpaper and a blurred grey picture) that only the hash joins:
     * the detail gains precision, and loses no recall. */
    double precision, recall, hash_precision, hash_recall;
    read_score(r.err, "hash and detail: ", &precision, &recall);
    read_score(r.err, "hash alone:      ", &hash_precision, &hash_recall);
    assert_true(precision >= 0.95);
    assert_true(recall >= 0.95);
    assert_true(precision > hash_precision);
    assert_true(recall == hash_recall);
    ran_free(&r);
    free(out);
    free(images);
    free(truth);
    free(out_path);
    remove_tree(dir);
    free(dir);
}

/* ---- the progress bar ------------------------------------------------------- */

/* Run weft-images with stderr on a pseudo-terminal; return what it showed. */
static char *run_on_terminal(char *const argv[], int *status)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    assert_true(master >= 0);
    assert_int_equal(grantpt(master), 0);
    assert_int_equal(unlockpt(master), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 2, ptsname(master), O_RDWR | O_NOCTTY, 0);
    pid_t pid = 0;
    assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    for (;;) { /* read as it comes, so the child never blocks on a full terminal */
        ssize_t k = read(master, text + len, cap - 1 - len);
        if (k <= 0)
            break; /* EIO once the child has closed its side */
        len += (size_t)k;
        if (len == cap - 1)
            break;
    }
    text[len] = '\0';
    int ws;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    close(master);
    return text;
}

static void test_progress_bar_only_on_a_terminal(void **state)
{
    fixtures fx = {0};
    (void)state;
    make_fixtures(&fx);
    char *out_path = join(fx.dir, ".out.jsonl");
    char *argv[] = {WI_BIN, "--backend", "host", "-o", out_path, fx.dir, NULL};
    int status;
    char *shown = run_on_terminal(argv, &status);
    assert_int_equal(status, 0);
    /* The last drawing shows every file done, and is erased for the summary. */
    if (!strstr(shown, "[##############################] 5/5 100%"))
        fail_msg("no finished bar on the terminal:\n%s", shown);
    assert_non_null(strstr(shown, "images/s\033[K"));
    assert_non_null(strstr(shown, "\r\033[K"));
    free(shown);

    /* -q, or stderr not a terminal: no bar. */
    char *quiet[] = {WI_BIN, "-q", "--backend", "host", "-o", out_path, fx.dir, NULL};
    shown = run_on_terminal(quiet, &status);
    assert_int_equal(status, 0);
    assert_null(strchr(shown, '['));
    free(shown);
    ran r = run_program(fx.dir, argv);
    assert_int_equal(r.status, 0);
    assert_null(strchr(r.err, '\r'));
    assert_null(strchr(r.err, '['));
    ran_free(&r);
    free(out_path);
    free_fixtures(&fx);
}

/* ---- the command line ------------------------------------------------------- */

static void expect_usage_error(const char *dir, char *const argv[], const char *message)
{
    ran r = run_program(dir, argv);
    assert_int_equal(r.status, 2);
    if (!strstr(r.err, message))
        fail_msg("stderr lacks '%s':\n%s", message, r.err);
    ran_free(&r);
}

static void test_bad_command_lines_exit_2_with_a_message(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    assert_non_null(dir);
    char *missing = join(dir, "no-such-folder"), *bad_out = join(dir, "no/such/out.jsonl");

    expect_usage_error(dir, (char *[]){WI_BIN, missing, NULL}, "No such file or directory");
    expect_usage_error(dir, (char *[]){WI_BIN, NULL}, "no folder given");
    expect_usage_error(dir, (char *[]){WI_BIN, "--frobnicate", dir, NULL},
                       "unknown option '--frobnicate'");
    expect_usage_error(dir, (char *[]){WI_BIN, "-t", "65", dir, NULL},
                       "--threshold must be a whole number from 0 to 64, not '65'");
    expect_usage_error(dir, (char *[]){WI_BIN, "-t", "ten", dir, NULL}, "not 'ten'");
    expect_usage_error(dir, (char *[]){WI_BIN, "-j", "0", dir, NULL}, "--workers");
    expect_usage_error(dir, (char *[]){WI_BIN, "--backend", "gpu", dir, NULL},
                       "--backend must be auto, cuda or host, not 'gpu'");
    expect_usage_error(dir, (char *[]){WI_BIN, dir, "-o", NULL}, "-o needs a value");
    expect_usage_error(dir, (char *[]){WI_BIN, "-o", bad_out, dir, NULL},
                       "No such file or directory");
    expect_usage_error(dir, (char *[]){WI_BIN, "--bench", "x", dir, NULL}, "--bench needs -o");
    expect_usage_error(dir,
                       (char *[]){WI_BIN, "-q", "--backend", "host", "--truth", missing, dir, NULL},
                       "--truth");

    /* An empty folder is not an error: nothing to do. */
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_program(dir, argv);
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.err, "0 files: 0 images, 0 not readable images"));
    ran_free(&r);
    free(missing);
    free(bad_out);
    remove_tree(dir);
    free(dir);
}

/* ---- --stats ------------------------------------------------------------------ */

/* One image at a time on one worker: every image's device work waits for
 * the one before, and --stats says so, with the figure; the default run
 * overlaps its images and --stats finds nothing to report. */
static void test_stats_names_work_that_never_overlapped(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    assert_non_null(dir);
    char *images = join(dir, "images"), *truth = join(dir, "truth.txt"),
         *out_path = join(dir, "out.jsonl");
    char *gen[] = {WI_SAMPLE_BIN, "-n", "40", "--broken", "0", "-t", truth, images, NULL};
    ran r = run_program(dir, gen);
    assert_int_equal(r.status, 0);
    ran_free(&r);

    char *serial[] = {WI_BIN,       "--backend", "host", "-q",     "--stats", "-j", "1",
                      "--inflight", "1",         "-o",   out_path, images,    NULL};
    r = run_program(dir, serial);
    assert_int_equal(r.status, 0);
    assert_non_null(line_with(r.err, "never overlapped"));
    assert_non_null(strstr(r.err, "at most 1 stream in use at once over "));
    ran_free(&r);

    char *overlapped[] = {WI_BIN, "--backend", "host",   "-q",   "--stats", "-j",
                          "2",    "-o",        out_path, images, NULL};
    r = run_program(dir, overlapped);
    assert_int_equal(r.status, 0);
    assert_null(line_with(r.err, "never overlapped"));
    ran_free(&r);
    free(images);
    free(truth);
    free(out_path);
    remove_tree(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures_give_exact_json_and_groups),
        cmocka_unit_test(test_detail_keeps_a_wallpaper_from_a_blurred_grey_picture),
        cmocka_unit_test(test_sample_set_with_broken_files_runs_to_the_end),
        cmocka_unit_test(test_progress_bar_only_on_a_terminal),
        cmocka_unit_test(test_bad_command_lines_exit_2_with_a_message),
        cmocka_unit_test(test_stats_names_work_that_never_overlapped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
