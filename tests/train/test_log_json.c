/*
 * The --log-json lines: their exact text, and a write that fails (a full
 * disk: /dev/full) reported with its errno at the line that hits it, so the
 * trainer can stop with "--log-json FILE: write failed: No space left on
 * device" instead of exiting 0 with a cut file.
 *
 *   test_log_json unit
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "train/metrics.h"

static char path[256];

static const char *contents(void)
{
    static char buf[2048];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
    return buf;
}

static void test_text(void)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        CHECK(0, "cannot create %s", path);
        return;
    }
    dt_step_stats s = {.step = 4, .steps = 10, .loss = 2.5, .grad_norm = 0.75, .lr = 1e-3,
                       .ms = 12.5, .tokens_per_s = 2048, .mfu = 0.25, .ranks = 1};
    CHECK(dt_log_json_step(f, &s) == 0, "step line");
    /* Written out at once: a reader (or a crash) sees the whole line. */
    CHECK(strcmp(contents(), "{\"step\":4,\"loss\":2.5,\"lr\":0.001,\"ms\":12.5,"
                             "\"tokens_per_s\":2048,\"grad_norm\":0.75,\"mfu\":0.25}\n") == 0,
          "line: %s", contents());
    s = (dt_step_stats){.step = 5, .loss = NAN, .grad_norm = INFINITY, .lr = 0.5, .ms = 1,
                        .tokens_per_s = 3, .mfu = -1, .ranks = 2, .comm_ms = 0.5,
                        .bytes_sent = 12345678901ull};
    CHECK(dt_log_json_step(f, &s) == 0, "second line");
    CHECK(dt_log_json_eval(f, 5, 1.25) == 0, "eval line");
    CHECK(dt_log_json_eval(f, 6, NAN) == 0, "eval line, diverged");
    fclose(f);
    const char *want =
        "{\"step\":4,\"loss\":2.5,\"lr\":0.001,\"ms\":12.5,\"tokens_per_s\":2048,"
        "\"grad_norm\":0.75,\"mfu\":0.25}\n"
        "{\"step\":5,\"loss\":null,\"lr\":0.5,\"ms\":1,\"tokens_per_s\":3,\"comm_ms\":0.5,"
        "\"bytes_sent\":12345678901,\"grad_norm\":null}\n"
        "{\"step\":5,\"val_loss\":1.25}\n"
        "{\"step\":6,\"val_loss\":null}\n";
    CHECK(strcmp(contents(), want) == 0, "log:\n%s", contents());
}

static void test_full_disk(void)
{
    FILE *f = fopen("/dev/full", "w");
    if (!f) {
        CHECK(0, "cannot open /dev/full");
        return;
    }
    dt_step_stats s = {.step = 0, .loss = 1, .mfu = -1, .ranks = 1};
    CHECK(dt_log_json_step(f, &s) == ENOSPC, "a step line on a full disk: not ENOSPC");
    CHECK(dt_log_json_step(f, &s) == ENOSPC, "the next line on a full disk: not ENOSPC");
    fclose(f);
    f = fopen("/dev/full", "w");
    CHECK(f && dt_log_json_eval(f, 3, 2.0) == ENOSPC, "an eval line on a full disk: not ENOSPC");
    if (f) fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "unit") != 0) {
        fprintf(stderr, "usage: %s unit\n", argv[0]);
        return 2;
    }
    snprintf(path, sizeof path, "/tmp/dtrain_log_json_%ld.json", (long)getpid());
    test_text();
    test_full_disk();
    unlink(path);
    return finish("log_json");
}
