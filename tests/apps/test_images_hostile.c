/*
 * test_images_hostile.c - weft-images on folders made to break it: FIFOs,
 * names that are not UTF-8, an output inside the input, the same files
 * twice, signals mid-run, images that declare huge sizes, bad truth files,
 * deep and unreadable folders, a JPEG that stb_image decodes from
 * uninitialised memory, and the messages for each. Each run is bounded in
 * time, so a hang fails the test instead of stalling the suite.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include "images_test.h"

enum { LIMIT_S = 60 };

/* As run_program, but killed after limit_s seconds (status -1); sig, if
 * not 0, is sent once the file watch (if not NULL) is not empty. */
static ran run_bounded(const char *dir, char *const argv[], int limit_s, const char *watch, int sig)
{
    ran r = {-1, NULL, NULL};
    char *out = join(dir, ".stdout"), *err = join(dir, ".stderr");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid;
    int ws;
    assert_int_equal(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    bool sent = false;
    for (long ms = 0;; ms++) {
        pid_t got = waitpid(pid, &ws, WNOHANG);
        if (got == pid) {
            if (WIFEXITED(ws))
                r.status = WEXITSTATUS(ws);
            break;
        }
        if (ms > limit_s * 1000L) {
            kill(pid, SIGKILL);
            waitpid(pid, &ws, 0);
            break;
        }
        if (sig && !sent && watch && file_size(watch) > 0) {
            kill(pid, sig);
            sent = true;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    r.out = slurp(out);
    r.err = slurp(err);
    if (!r.out)
        r.out = strdup("");
    if (!r.err)
        r.err = strdup("");
    free(out);
    free(err);
    return r;
}

static void expect_in(const char *text, const char *needle)
{
    if (!strstr(text, needle))
        fail_msg("'%s' missing from:\n%s", needle, text);
}

static void write_png(const char *path, int w, int h, uint8_t shade)
{
    uint8_t *rgb = malloc((size_t)w * h * 3);
    assert_non_null(rgb);
    for (int i = 0; i < w * h; i++) /* a diagonal ramp: not flat */
        memset(rgb + 3 * i, (uint8_t)(shade + (i % w + i / w)), 3);
    assert_true(stbi_write_png(path, w, h, 3, rgb, w * 3));
    free(rgb);
}

static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Is every byte of text valid UTF-8, with no raw control byte but '\n'? */
static bool clean_utf8(const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        unsigned c = *s, n = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        if (n == 0 || c > 0xf4 || (c < 0x20 && c != '\n') || c == 0x7f)
            return false;
        for (unsigned i = 1; i < n; i++)
            if ((s[i] & 0xc0) != 0x80)
                return false;
        s += n;
    }
    return true;
}

/* The bytes of the JSON string starting at q (its opening quote), with
 * \udcXX read back as the byte XX, as the README says. */
static char *json_path_bytes(const char *q)
{
    char *out = malloc(strlen(q) + 1), *o = out;
    assert_true(*q++ == '"');
    while (*q && *q != '"') {
        if (*q != '\\') {
            *o++ = *q++;
            continue;
        }
        q++;
        if (*q == 'u') {
            unsigned v;
            assert_int_equal(sscanf(q + 1, "%4x", &v), 1);
            *o++ = (char)(v >= 0xdc80 && v <= 0xdcff ? v - 0xdc00 : v); /* ASCII or a raw byte */
            q += 5;
        } else {
            *o++ = *q++;
        }
    }
    *o = '\0';
    return out;
}

/* ---- 8: FIFOs ---------------------------------------------------------------- */

static void test_fifos_are_skipped_reported_and_counted(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *fifo = join(dir, "x.png"), *link = join(dir, "y.png"),
         *good = join(dir, "good.png");
    assert_int_equal(mkfifo(fifo, 0666), 0);
    assert_int_equal(symlink(fifo, link), 0);
    write_png(good, 16, 16, 0);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(count_lines_with(r.out, "\"path\""), 1);
    expect_in(r.out, "good.png");
    expect_in(r.err, "x.png: a FIFO, not a regular file, skipped");
    expect_in(r.err, "y.png: a FIFO, not a regular file, skipped");
    expect_in(r.err, "1 files: 1 images, 0 not readable images, 2 skipped");
    ran_free(&r);

    /* A FIFO named on the command line, too. */
    char *argv2[] = {WI_BIN, "-q", "--backend", "host", fifo, good, NULL};
    r = run_bounded(dir, argv2, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    expect_in(r.err, "1 files: 1 images, 0 not readable images, 1 skipped");
    ran_free(&r);
    remove_tree(dir);
    free(dir);
    free(fifo);
    free(link);
    free(good);
}

/* ---- 9: names that are not UTF-8 ------------------------------------------------ */

static void test_names_that_are_not_utf8_give_valid_json(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    const char *odd = "\xff\x01"
                      "bad\xe9\"q\\.png",
               *evil = "\x1b[31mevil.png";
    char *path = join(dir, odd), *broken = join(dir, evil);
    write_png(path, 16, 16, 9);
    write_bytes(broken, "", 0);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", "-t", "64", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    if (!clean_utf8(r.out))
        fail_msg("stdout is not clean UTF-8:\n%s", r.out);
    if (!clean_utf8(r.err))
        fail_msg("stderr is not clean UTF-8:\n%s", r.err);
    expect_in(r.out, "\\udcff\\u0001bad\\udce9\\\"q\\\\.png\"");
    /* The exact bytes come back from the line. */
    const char *q = strstr(r.out, "{\"path\":");
    assert_non_null(q);
    char *back = json_path_bytes(q + 8);
    assert_string_equal(back, path);
    free(back);
    expect_in(r.err, "\\x1b[31mevil.png: empty file");
    ran_free(&r);
    remove_tree(dir);
    free(dir);
    free(path);
    free(broken);
}

/* ---- 10: -o one of the inputs ---------------------------------------------------- */

static void expect_refused(const char *dir, const char *out, const char *input, const char *watch)
{
    long before = file_size(watch);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", "-o", (char *)out, (char *)input, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 2);
    expect_in(r.err, "refusing to overwrite it");
    assert_int_equal(file_size(watch), before); /* not a byte changed */
    ran_free(&r);
}

static void test_an_output_that_is_an_input_is_refused(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *sub = join(dir, "in"), *img = join(dir, "in/a.png"),
         *spelt = join(dir, "in/./a.png"), *other = join(dir, "other.jsonl");
    assert_int_equal(mkdir(sub, 0777), 0);
    write_png(img, 16, 16, 3);
    expect_refused(dir, img, sub, img);
    expect_refused(dir, spelt, sub, img);
    expect_refused(dir, img, img, img); /* the input named as a file */
    assert_int_equal(link(img, other), 0);
    expect_refused(dir, other, sub, img); /* a hard link outside the folder */
    remove_tree(dir);
    free(dir);
    free(sub);
    free(img);
    free(spelt);
    free(other);
}

/* ---- 11: the same files twice ------------------------------------------------------ */

static void test_the_same_files_twice_are_looked_at_once(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *img = join(dir, "a.png"), *spelt = join(dir, "."),
         *linked = join(dir, "b.png");
    write_png(img, 16, 16, 5);
    assert_int_equal(link(img, linked), 0);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", "-t", "0", dir, spelt, img, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(count_lines_with(r.out, "\"path\""), 1); /* five names, one file */
    assert_int_equal(count_lines_with(r.out, "\"group\""), 0);
    expect_in(r.err, "looked at once");
    expect_in(r.err, "1 files: 1 images, 0 not readable images, 4 second names");
    ran_free(&r);
    remove_tree(dir);
    free(dir);
    free(img);
    free(spelt);
    free(linked);
}

/* ---- 12: signals --------------------------------------------------------------------- */

enum { MANY = 1500 };

static void stop_with(int sig, int want)
{
    char *dir = tmp_dir(), *in = join(dir, "in"), *out = join(dir, "out.jsonl");
    assert_int_equal(mkdir(in, 0777), 0);
    char *first = join(in, "0000.png");
    write_png(first, 128, 128, 1);
    char *bytes = slurp(first);
    long n = file_size(first);
    for (int i = 1; i < MANY; i++) { /* copies: files of their own */
        char name[32];
        snprintf(name, sizeof name, "%04d.png", i);
        char *p = join(in, name);
        write_bytes(p, bytes, (size_t)n);
        free(p);
    }
    char *argv[] = {WI_BIN, "-q", "--backend", "host", "-j", "1", "-o", out, in, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, out, sig); /* the signal once lines come out */
    assert_int_equal(r.status, want);
    char *text = slurp(out);
    assert_non_null(text);
    size_t len = strlen(text), lines = count_lines_with(text, "\"path\"");
    assert_true(len > 0 && text[len - 1] == '\n'); /* whole lines only */
    for (const char *l = text; *l; l = strchr(l, '\n') + 1) {
        assert_true(l[0] == '{');
        assert_true(strchr(l, '\n')[-1] == '}');
    }
    assert_true(lines > 0 && lines < MANY);
    char said[96];
    snprintf(said, sizeof said, "stopped by %s: %zu of %d files looked at",
             sig == SIGINT ? "SIGINT" : "SIGTERM", lines, MANY);
    expect_in(r.err, said); /* every image finished has its line */
    ran_free(&r);
    free(text);
    free(bytes);
    free(first);
    remove_tree(dir);
    free(dir);
    free(in);
    free(out);
}

static void test_a_signal_stops_the_run_cleanly(void **state)
{
    (void)state;
    stop_with(SIGINT, 130);
    stop_with(SIGTERM, 143);
}

/* ---- 13: memory ---------------------------------------------------------------------- */

/* A PNG signature and IHDR declaring w x h RGB, and nothing else. */
static void write_png_header(const char *path, uint32_t w, uint32_t h)
{
    uint8_t p[33] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13, 'I', 'H', 'D', 'R'};
    for (int i = 0; i < 4; i++) {
        p[16 + i] = (uint8_t)(w >> (24 - 8 * i));
        p[20 + i] = (uint8_t)(h >> (24 - 8 * i));
    }
    p[24] = 8; /* depth */
    p[25] = 2; /* RGB */
    write_bytes(path, p, sizeof p);
}

static void test_memory_is_bounded_before_decoding(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *huge = join(dir, "huge.png"), *sparse = join(dir, "sparse.png"),
         *small = join(dir, "small.png");
    write_png_header(huge, 16384, 16384);
    write_png(small, 100, 100, 7);
    int fd = open(sparse, O_WRONLY | O_CREAT, 0644);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)3 << 30), 0); /* 3 GiB, no blocks */
    close(fd);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    expect_in(r.err, "huge.png: 16384 x 16384 pixels (268.4 Mpixels) is more than the limit of "
                     "67108864 pixels (--max-pixels raises it");
    expect_in(r.err, "sparse.png: 3221225472 bytes: larger than the 2147483647 bytes stb_image "
                     "reads");
    expect_in(r.out, "small.png");
    ran_free(&r);

    /* The limit is the option's. */
    char *lower[] = {WI_BIN, "-q", "--backend", "host", "--max-pixels", "9999", small, NULL};
    r = run_bounded(dir, lower, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    expect_in(r.err, "small.png: 100 x 100 pixels (0.0 Mpixels) is more than the limit of 9999");
    ran_free(&r);

    /* A budget smaller than any one image: each still runs, alone. */
    char *names[6];
    for (int i = 0; i < 6; i++) {
        char name[16];
        snprintf(name, sizeof name, "m%d.png", i);
        names[i] = join(dir, name);
        write_png(names[i], 300, 300, (uint8_t)(40 * i));
    }
    char *tight[] = {WI_BIN,   "-q",     "--backend", "host",   "-j",     "2",      "--memory", "1",
                     names[0], names[1], names[2],    names[3], names[4], names[5], NULL};
    r = run_bounded(dir, tight, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    assert_int_equal(count_lines_with(r.out, "\"path\""), 6);
    ran_free(&r);
    for (int i = 0; i < 6; i++)
        free(names[i]);
    remove_tree(dir);
    free(dir);
    free(huge);
    free(sparse);
    free(small);
}

/* ---- 14: the truth file --------------------------------------------------------------- */

static void test_a_bad_truth_file_is_refused_before_the_run(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *img = join(dir, "a.png"), *missing = join(dir, "no-truth.txt"),
         *binary = join(dir, "truth.bin");
    write_png(img, 16, 16, 0);
    write_bytes(binary, "a.png\0b.png\n", 12);
    struct {
        const char *truth, *says;
    } cases[] = {
        {dir, "a folder, not a regular file"},
        {missing, "no-truth.txt: cannot open: No such file or directory"},
        {binary, "not text (a NUL byte at offset 5)"},
        {"/dev/zero", "/dev/zero: a device, FIFO or socket, not a regular file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[] = {WI_BIN, "-q", "--backend", "host", "--truth", (char *)cases[i].truth,
                        img,    NULL};
        ran r = run_bounded(dir, argv, 20, NULL, 0);
        assert_int_equal(r.status, 2);
        expect_in(r.err, cases[i].says);
        assert_null(strstr(r.err, "files:")); /* before the run: no summary */
        assert_int_equal(strlen(r.out), 0);
        ran_free(&r);
    }
    remove_tree(dir);
    free(dir);
    free(img);
    free(missing);
    free(binary);
}

/* ---- 15: folders -------------------------------------------------------------------- */

enum { DEEP = 1500 };

static void test_deep_long_and_unreadable_folders_are_walked(void **state)
{
    (void)state;
    char *dir = tmp_dir();
    size_t cap = strlen(dir) + 2 * DEEP + 32;
    char *path = malloc(cap);
    snprintf(path, cap, "%s", dir);
    for (int i = 0; i < DEEP; i++) {
        strcat(path, "/d");
        assert_int_equal(mkdir(path, 0777), 0);
    }
    strcat(path, "/x.png");
    write_png(path, 16, 16, 2);

    /* Past PATH_MAX: names made relative to an open folder. */
    char name[201];
    memset(name, 'n', 200);
    name[200] = '\0';
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    for (int i = 0; i < 22 && fd >= 0; i++) {
        assert_int_equal(mkdirat(fd, name, 0777), 0);
        int next = openat(fd, name, O_RDONLY | O_DIRECTORY);
        close(fd);
        fd = next;
    }
    assert_true(fd >= 0);
    int img = openat(fd, "far.png", O_WRONLY | O_CREAT, 0644);
    assert_true(img >= 0);
    assert_int_equal(write(img, "x", 1), 1);
    close(img);
    close(fd);

    bool root = geteuid() == 0; /* root reads any folder: that case needs another user */
    char *locked = join(dir, "locked");
    assert_int_equal(mkdir(locked, 0), 0);

    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = (struct rlimit){old.rlim_cur < 1024 ? old.rlim_cur : 1024, old.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0); /* the child inherits it */
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    if (r.status != 0)
        fail_msg("exit %d:\n%s\n%s", r.status, r.err, r.out);
    assert_int_equal(count_lines_with(r.out, "\"path\""), 1);
    expect_in(r.out, "/d/d/x.png");
    expect_in(r.err, "nnn...: path longer than PATH_MAX, skipped"); /* its folder, cut */
    if (!root) {
        expect_in(r.err, "locked: cannot open folder: Permission denied, skipped");
        expect_in(r.err, "1 files: 1 images, 0 not readable images, 2 skipped");
    } else {
        expect_in(r.err, "1 files: 1 images, 0 not readable images, 1 skipped");
    }
    ran_free(&r);
    chmod(locked, 0777);
    free(locked);
    remove_tree(dir);
    free(dir);
    free(path);
}

/* ---- 16: a JPEG stb_image decodes from uninitialised memory --------------------------- */

static void test_a_jpeg_without_its_pixels_is_rejected(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *whole = join(dir, "whole.jpg"), *cut = join(dir, "noscan.jpg");
    uint8_t rgb[64 * 64 * 3];
    for (int i = 0; i < 64 * 64 * 3; i++)
        rgb[i] = (uint8_t)(i * 7);
    assert_true(stbi_write_jpg(whole, 64, 64, 3, rgb, 90));
    char *bytes = slurp(whole);
    long n = file_size(whole), sos = -1;
    for (long i = 2; i + 1 < n && sos < 0; i++)
        if ((uint8_t)bytes[i] == 0xff && (uint8_t)bytes[i + 1] == 0xda)
            sos = i;
    assert_true(sos > 0);
    bytes[sos + 1] = (char)0xd9; /* EOI where the scan began: a frame, no pixels */
    write_bytes(cut, bytes, (size_t)sos + 2);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    expect_in(r.err, "noscan.jpg: corrupt or truncated JPEG: no image data");
    assert_int_equal(count_lines_with(r.out, "noscan"), 0);
    assert_int_equal(count_lines_with(r.out, "whole.jpg"), 1);
    ran_free(&r);
    free(bytes);
    remove_tree(dir);
    free(dir);
    free(whole);
    free(cut);
}

/* ---- 17: messages --------------------------------------------------------------------- */

static void test_messages_say_what_happened(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *zero = join(dir, "zero.gif"), *bare = join(dir, "bare.gif"),
         *vast = join(dir, "vast.png");
    write_bytes(zero, "GIF89a\0\0\0\0\0\0\0;", 14);
    write_bytes(bare, "GIF89a\1\0\1\0\0\0\0;", 14);
    write_png_header(vast, 100000, 100000);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", dir, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    expect_in(r.err, "zero.gif: 0 x 0 pixels: an image with no pixels");
    expect_in(r.err, "bare.gif: corrupt GIF: no image in it, only a header");
    expect_in(r.err, "vast.png: 100000 x 100000 pixels (10000.0 Mpixels) is more than the limit");
    assert_null(strstr(r.err, "(stb_image: )"));
    ran_free(&r);

    /* A write that fails says why, and exits 1. */
    char *full[] = {WI_BIN, "-q", "--backend", "host", "-o", "/dev/full", dir, NULL};
    write_png(vast, 16, 16, 1); /* an image, so there is a line to write */
    r = run_bounded(dir, full, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 1);
    expect_in(r.err, "writing /dev/full failed: No space left on device");
    ran_free(&r);

    /* An -o that cannot be opened: 2, as the README says. */
    char *bad = join(dir, "no/such/out.jsonl");
    char *cannot[] = {WI_BIN, "-q", "--backend", "host", "-o", bad, dir, NULL};
    r = run_bounded(dir, cannot, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 2);
    expect_in(r.err, "out.jsonl: cannot open for writing: No such file or directory");
    ran_free(&r);
    free(bad);
    remove_tree(dir);
    free(dir);
    free(zero);
    free(bare);
    free(vast);
}

/* ---- task names (the trace) ------------------------------------------------------------ */

static void test_tasks_are_named_in_the_trace(void **state)
{
    (void)state;
    char *dir = tmp_dir(), *img = join(dir, "a.png"), *trace = join(dir, ".trace.json");
    write_png(img, 16, 16, 0);
    char *argv[] = {WI_BIN, "-q", "--backend", "host", "--trace", trace, img, NULL};
    ran r = run_bounded(dir, argv, LIMIT_S, NULL, 0);
    assert_int_equal(r.status, 0);
    char *text = slurp(trace);
    assert_non_null(text);
    expect_in(text, "\"cat\":\"task\",\"name\":\"image\"");
    assert_null(strstr(text, "\"cat\":\"task\",\"name\":\"task\""));
    free(text);
    ran_free(&r);
    remove_tree(dir);
    free(dir);
    free(img);
    free(trace);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifos_are_skipped_reported_and_counted),
        cmocka_unit_test(test_names_that_are_not_utf8_give_valid_json),
        cmocka_unit_test(test_an_output_that_is_an_input_is_refused),
        cmocka_unit_test(test_the_same_files_twice_are_looked_at_once),
        cmocka_unit_test(test_a_signal_stops_the_run_cleanly),
        cmocka_unit_test(test_memory_is_bounded_before_decoding),
        cmocka_unit_test(test_a_bad_truth_file_is_refused_before_the_run),
        cmocka_unit_test(test_deep_long_and_unreadable_folders_are_walked),
        cmocka_unit_test(test_a_jpeg_without_its_pixels_is_rejected),
        cmocka_unit_test(test_messages_say_what_happened),
        cmocka_unit_test(test_tasks_are_named_in_the_trace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
