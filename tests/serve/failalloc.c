/* failalloc.c — an LD_PRELOAD shim for the serve tests (oom.test.cjs): while armed, realloc fails (NULL, ENOMEM)
 * for the sizes a doubling string buffer (strbuf.c) asks for from 2 KB on: powers of two in [2 KB, 1 MB]. SIGUSR2
 * arms and disarms it, so the server starts normally and the test says when its memory "runs out". The server's
 * other reallocs (cJSON's print buffers, arrays of structs) are not powers of two at these sizes, or not this big. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stddef.h>

static void *(*real_realloc)(void *, size_t);
static volatile sig_atomic_t armed;

static void toggle(int sig) {
    (void)sig;
    armed = !armed;
}

__attribute__((constructor)) static void init(void) {
    real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    struct sigaction sa = {.sa_handler = toggle, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR2, &sa, NULL);
}

void *realloc(void *p, size_t n) {
    if (armed && n >= 2048 && n <= (1u << 20) && !(n & (n - 1))) {
        errno = ENOMEM;
        return NULL;
    }
    return real_realloc(p, n);
}
