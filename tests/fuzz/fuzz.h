/* fuzz.h — shared pieces of the libFuzzer targets (tests/fuzz/fuzz_*.c; docs/FUZZ.md): a private scratch
 * directory (the loaders under test read files by path), whole-file writes, and REQUIRE, which aborts so
 * that libFuzzer reports the input. */
#ifndef Q35_FUZZ_H
#define Q35_FUZZ_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define REQUIRE(c)                                                                                                     \
    do {                                                                                                               \
        if (!(c)) {                                                                                                    \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #c);                                                    \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* A directory for this process's files (/dev/shm when there, else /tmp), removed at exit. */
static char fuzz_dir[256];
static void fuzz_dir_rm(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fuzz_dir);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", fuzz_dir);
}
static const char *fuzz_scratch(void) {
    if (fuzz_dir[0]) return fuzz_dir;
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/q35fuzz.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    REQUIRE(mkdtemp(fuzz_dir));
    atexit(fuzz_dir_rm);
    return fuzz_dir;
}

/* Writes n bytes to <scratch>/name; returns the path (static buffer). */
static const char *fuzz_write(const char *name, const void *data, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", fuzz_scratch(), name);
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    REQUIRE(n == 0 || fwrite(data, 1, n, f) == n);
    REQUIRE(fclose(f) == 0);
    return path;
}

/* A malloc'ed NUL-terminated copy of the input (the JSON parsers take C strings). */
static char *fuzz_cstr(const unsigned char *data, size_t n) {
    char *s = malloc(n + 1);
    REQUIRE(s);
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}
#endif
