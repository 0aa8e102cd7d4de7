/* Windows (core/window.h), plain and pooled: a dropped part reads as
 * zeros and holds no memory (the RSS falls), a brought part is resident
 * before it is written (no page faults while a step writes it, counted by
 * getrusage) and reads zeros when asked, the pool reuses its pages (its
 * size stays that of the most bytes brought at once over many rounds), a
 * part brought twice keeps what it holds, a drop that cuts a brought part
 * leaves the rest of it intact and never hands its pages out again, and a
 * window reserved beyond the pool table still works, as a plain one.
 *
 *   test_window */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "check.h"
#include "core/window.h"

#define PAGE DT_PAGE_BYTES
#define PAGES 64
#define PART (8 * PAGE)

static long minor_faults(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
}

/* Resident kB of the process (VmRSS), shared pages included. */
static long rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb;
}

static int all_equal(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return 0;
    return 1;
}

static void test_plain(void)
{
    size_t bytes = PAGES * PAGE;
    unsigned char *w = dt_window_reserve(bytes);
    CHECK(w && all_equal(w, bytes, 0), "plain: reserved and zero");
    if (!w) return;
    memset(w, 7, bytes);
    /* Bytes [100, 3 pages + 5): only pages 1 and 2 lie wholly inside. */
    dt_window_drop(w, 100, 3 * PAGE + 5);
    CHECK(all_equal(w, PAGE, 7) && all_equal(w + PAGE, 2 * PAGE, 0) &&
              all_equal(w + 3 * PAGE, PAGE, 7),
          "plain: a drop zeros the whole pages inside the range, and only those");
    dt_window_bring(w, 0, PART, 1); /* no pool: nothing happens */
    CHECK(all_equal(w, PAGE, 7), "plain: bring leaves a plain window as it is");
    CHECK(dt_window_pooled_bytes(w) == 0, "plain: no pool");
    dt_window_free(w, bytes);
}

static void test_pooled_reuse(void)
{
    size_t bytes = PAGES * PAGE;
    unsigned char *w = dt_window_reserve_pooled(bytes);
    CHECK(w != NULL, "pooled: reserved");
    if (!w) return;
    /* Rounds of a step: two parts live at once, each written whole after
     * it is brought, then dropped. */
    long faults = 0;
    for (int round = 0; round < 20; round++)
        for (int k = 0; k < PAGES / 8; k++) {
            unsigned char *part = w + (size_t)k * PART;
            dt_window_bring(w, (size_t)k * PART, (size_t)(k + 1) * PART, 0);
            long f0 = minor_faults();
            memset(part, k + 1, PART);
            if (round > 0) faults += minor_faults() - f0;
            size_t prev = (size_t)(k ? k - 1 : PAGES / 8 - 1);
            if (round || k) dt_window_drop(w, prev * PART, (prev + 1) * PART);
        }
    dt_window_drop(w, 0, bytes);
    CHECK(faults == 0, "pooled: writing a brought part faults no page (%ld faults)", faults);
    CHECK(dt_window_pooled_bytes(w) == 2 * PART,
          "pooled: the pool holds the two parts live at once, %zu bytes (%zu after 20 rounds)",
          (size_t)2 * PART, dt_window_pooled_bytes(w));
    CHECK(all_equal(w, bytes, 0), "pooled: every dropped part reads as zeros");
    dt_window_bring(w, 0, PART, 1);
    CHECK(all_equal(w, PART, 0), "pooled: brought with zero, reused pages read zeros");
    memset(w, 9, PART);
    dt_window_bring(w, 0, PART, 1);
    CHECK(all_equal(w, PART, 9), "pooled: a part brought again keeps what it holds");
    dt_window_free(w, bytes);
}

/* A drop that cuts a brought part: the part's other pages keep their
 * values, and its pages are not handed to the next part brought. */
static void test_pooled_cut(void)
{
    size_t bytes = PAGES * PAGE;
    unsigned char *w = dt_window_reserve_pooled(bytes);
    if (!w) return;
    dt_window_bring(w, 0, PART, 0);
    memset(w, 3, PART);
    dt_window_drop(w, 0, PAGE);
    CHECK(all_equal(w, PAGE, 0) && all_equal(w + PAGE, PART - PAGE, 3),
          "cut: the dropped page reads zeros, the part's others keep their values");
    dt_window_bring(w, 2 * PART, 3 * PART, 0);
    memset(w + 2 * PART, 4, PART);
    CHECK(all_equal(w + PAGE, PART - PAGE, 3),
          "cut: a new part does not alias the cut part's pages");
    CHECK(dt_window_pooled_bytes(w) == 2 * PART, "cut: the cut part's slot is retired (%zu)",
          dt_window_pooled_bytes(w));
    dt_window_free(w, bytes);
}

/* A brought part counts in the RSS; dropped, its pages stay in the pool
 * (the RSS holds), and a plain window's dropped pages leave it. */
static void test_rss(void)
{
    size_t bytes = (size_t)4096 * PAGE; /* 16 MiB */
    unsigned char *w = dt_window_reserve_pooled(bytes);
    if (!w) return;
    long r0 = rss_kb();
    dt_window_bring(w, 0, bytes, 0);
    long r1 = rss_kb();
    dt_window_drop(w, 0, bytes);
    long r2 = rss_kb();
    CHECK(r1 - r0 >= 15 * 1024, "rss: a brought part is resident (+%ld kB)", r1 - r0);
    CHECK(r2 - r0 <= 1024, "rss: dropped, it leaves the process's mappings (+%ld kB)", r2 - r0);
    dt_window_free(w, bytes);
    unsigned char *p = dt_window_reserve(bytes);
    if (!p) return;
    memset(p, 1, bytes);
    long r3 = rss_kb();
    dt_window_drop(p, 0, bytes);
    CHECK(r3 - rss_kb() >= 15 * 1024, "rss: a plain window's drop gives memory back");
    dt_window_free(p, bytes);
}

/* More pooled windows than the table holds: the rest are plain, and work. */
static void test_many(void)
{
    enum { N = 24 };
    unsigned char *w[N];
    int pooled = 0;
    for (int i = 0; i < N; i++) {
        w[i] = dt_window_reserve_pooled(PART);
        CHECK(w[i] != NULL, "many: window %d reserved", i);
        if (!w[i]) return;
        dt_window_bring(w[i], 0, PART, 0);
        memset(w[i], i + 1, PART);
        pooled += dt_window_pooled_bytes(w[i]) > 0;
    }
    for (int i = 0; i < N; i++) CHECK(all_equal(w[i], PART, (unsigned char)(i + 1)), "many: %d", i);
    CHECK(pooled > 0 && pooled < N, "many: %d of %d pooled, the rest plain", pooled, N);
    for (int i = 0; i < N; i++) dt_window_free(w[i], PART);
}

int main(void)
{
    test_plain();
    test_pooled_reuse();
    test_pooled_cut();
    test_rss();
    test_many();
    return finish("core.window");
}
