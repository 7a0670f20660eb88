/* tokdata.h — where the tokenizer tests find their data. Qwen3: .cache/qwen3-tokenizer (from
 * scripts/fetch_tokenizer.sh). Qwen3.5 (optional, arrives with the weights): the directory given on the
 * command line, else the first directory under .cache/ or models/ whose tokenizer.json (12 MB or more:
 * Qwen3's is 11.4 MB) has the Qwen3.5 vocabulary. Returns 1 and loads *t, or 0 when there is none. */
#ifndef Q35_TOKDATA_H
#define Q35_TOKDATA_H
#include <glob.h>
#include <stdio.h>
#include <sys/stat.h>

#include "qwen35.h"

static int find_qwen35_tokenizer(const char *arg, Q35Tokenizer **t, char *dir, size_t n) {
    const char *pats[] = {".cache/*/tokenizer.json", "models/*/tokenizer.json", ".cache/*/*/tokenizer.json"};
    Q35Err err;
    if (arg) {
        snprintf(dir, n, "%s", arg);
        if (q35_tokenizer_load(t, dir, &err) == 0) return 1;
        fprintf(stderr, "Qwen3.5 tokenizer at %s: %s\n", dir, err.msg);
        return 0;
    }
    for (size_t p = 0; p < sizeof pats / sizeof *pats; p++) {
        glob_t g;
        if (glob(pats[p], 0, NULL, &g)) continue;
        for (size_t i = 0; i < g.gl_pathc; i++) {
            struct stat st;
            if (stat(g.gl_pathv[i], &st) || st.st_size < 12000000) continue;
            snprintf(dir, n, "%.*s", (int)(strlen(g.gl_pathv[i]) - strlen("/tokenizer.json")), g.gl_pathv[i]);
            if (q35_tokenizer_load(t, dir, &err) == 0) {
                if (q35_tokenizer_family(*t) == Q35_TOK_QWEN35) { globfree(&g); return 1; }
                q35_tokenizer_free(*t);
            }
        }
        globfree(&g);
    }
    *t = NULL;
    return 0;
}
#endif
