/* test.h — a tiny test harness: CHECK records failures, TEST_SUMMARY prints the summary line
 * "N passed, N failed" and exits non-zero on failure. Each tests/test_<module>.c is a binary.
 * A failure goes to stderr after stdout is flushed: with stdout a pipe (tests/run.sh), a block
 * flushed later would otherwise cut a line in two around the FAIL text. */
#ifndef Q35_TEST_H
#define Q35_TEST_H
#include <stdio.h>
#include <stdlib.h>

static int t_pass, t_fail;
#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            t_pass++;                                                      \
        } else {                                                           \
            t_fail++;                                                      \
            fflush(stdout); /* the lines before it first, whole */         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
        }                                                                  \
    } while (0)
#define TEST_SUMMARY(name)                                                  \
    (printf("%s: %d passed, %d failed\n", (name), t_pass, t_fail), t_fail ? 1 : 0)
#endif
