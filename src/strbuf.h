/* strbuf.h — a growable NUL-terminated byte string (the chat renderer and parser, the detokenizer, the server's
 * request bodies, output text and events). An allocation failure sets oom and turns later appends into no-ops; the
 * owner checks oom once at the end, or each append's result. */
#ifndef Q35_STRBUF_H
#define Q35_STRBUF_H

#include <stddef.h>

typedef struct StrBuf {
    char *p; /* NUL-terminated once anything was appended; NULL before */
    size_t n, cap;
    int oom;
} StrBuf;

/* Appends x[0 .. n) (n may be 0: the string then exists, \"\" at least); 0, or -1 once oom is set. */
int sb_put(StrBuf *s, const char *x, size_t n);
void sb_puts(StrBuf *s, const char *x);
void sb_putc(StrBuf *s, char c);
/* Drops the first n bytes (n <= s->n). */
void sb_drop(StrBuf *s, size_t n);
void sb_free(StrBuf *s);

#endif
