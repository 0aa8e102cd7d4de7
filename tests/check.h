/* Assertions shared by the C unit tests: a failed check prints where and
 * why and is counted, so one run reports every broken case, not only the
 * first; finish() turns the count into the exit status. Checks may run on
 * several threads at once (the counters are atomic), and a multi-rank test
 * names its rank (and whatever else it is varying) in check_label, printed
 * before each failure. Also a seeded xorshift generator for test inputs. */
#ifndef DT_TESTS_CHECK_H
#define DT_TESTS_CHECK_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static _Atomic int failures;
static _Atomic long checks; /* every CHECK made, passed or failed */
static char check_label[256];

/* check_label from a format, for example "rank 2: ". */
static inline void check_set_label(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void check_set_label(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(check_label, sizeof check_label, fmt, ap);
    va_end(ap);
}

/* Only the first 30 failures are printed: one broken kernel can fail
 * thousands of elements. */
#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        checks++;                                                                           \
        if (!(cond)) {                                                                      \
            if (failures < 30) {                                                            \
                fprintf(stderr, "%s:%d: %sFAIL: ", __FILE__, __LINE__, check_label);        \
                fprintf(stderr, __VA_ARGS__);                                               \
                fprintf(stderr, "\n");                                                      \
            }                                                                               \
            failures++;                                                                     \
        }                                                                                   \
    } while (0)

/* A call that must fail with a message holding every one of the texts. */
#define CHECK_ERR(rc, err, ...)                                                             \
    do {                                                                                    \
        const char *want_[] = {__VA_ARGS__};                                                \
        CHECK((rc) != 0, "expected a failure, got success");                                \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                      \
            CHECK(strstr((err), want_[i_]), "message '%s' lacks '%s'", (err), want_[i_]);   \
    } while (0)

static inline int finish(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static inline uint64_t rnd_u64(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

#endif
