/* Assertions for the train tests: a failed check prints where and why and
 * counts, so one run reports every broken case, not just the first. */
#ifndef DT_TESTS_TRAIN_CHECK_H
#define DT_TESTS_TRAIN_CHECK_H

#include <stdio.h>
#include <string.h>

static int failures;

#define CHECK(cond, ...)                                        \
    do {                                                        \
        if (!(cond)) {                                          \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                       \
            fprintf(stderr, "\n");                              \
            failures++;                                         \
        }                                                       \
    } while (0)

/* A call that must fail with a message holding every one of the texts. */
#define CHECK_ERR(rc, err, ...)                                                        \
    do {                                                                               \
        const char *want_[] = {__VA_ARGS__};                                           \
        CHECK((rc) != 0, "expected a failure, got success");                           \
        for (size_t i_ = 0; i_ < sizeof want_ / sizeof want_[0]; i_++)                 \
            CHECK(strstr((err), want_[i_]), "message '%s' lacks '%s'", (err), want_[i_]); \
    } while (0)

static int finish(const char *name)
{
    if (failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif
