/* strbuf.c — see strbuf.h. Capacity doubles; the string stays NUL-terminated. */
#include "strbuf.h"

#include <stdlib.h>
#include <string.h>

int sb_put(StrBuf *s, const char *x, size_t n) {
    if (s->oom) return -1;
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->n + n + 1) cap *= 2;
        char *p = realloc(s->p, cap);
        if (!p) {
            s->oom = 1;
            return -1;
        }
        s->p = p;
        s->cap = cap;
    }
    if (n) memcpy(s->p + s->n, x, n);
    s->n += n;
    s->p[s->n] = 0;
    return 0;
}

void sb_puts(StrBuf *s, const char *x) { sb_put(s, x, strlen(x)); }
void sb_putc(StrBuf *s, char c) { sb_put(s, &c, 1); }

void sb_drop(StrBuf *s, size_t n) {
    if (!s->p || !n) return;
    memmove(s->p, s->p + n, s->n - n + 1);
    s->n -= n;
}

void sb_free(StrBuf *s) {
    free(s->p);
    *s = (StrBuf){0};
}
