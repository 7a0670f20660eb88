/* common.h — flag parsing shared by the subcommands: model/backend options, id lists. */
#ifndef Q35_CLI_COMMON_H
#define Q35_CLI_COMMON_H
#include "qwen35.h"

/* If argv[*i] is a model/backend flag (--model, --dummy, --backend, --ctx, --threads, --seed-weights, --probe,
 * --deterministic, --no-graph, --keep-f32-params, --strict), consumes it (and its value) and returns 1;
 * 0 if not such a flag; -1 after printing an error. */
int cli_model_flag(Q35Options *o, int argc, char **argv, int *i);
/* Returns the flag's value (argv[++*i]) or prints "FLAG needs a value" and returns NULL. */
const char *cli_value(int argc, char **argv, int *i);
int cli_int(const char *flag, const char *s, long lo, long hi, int *out);
int cli_float(const char *flag, const char *s, float *out);
/* Parses "5,17,9" into a malloc'ed array. Prints an error and returns -1 on bad input. */
int cli_parse_ids(const char *s, int **ids, int *n);
/* Applies QWEN35_DETERMINISTIC=1 (mirroring --deterministic). */
void cli_env_options(Q35Options *o);
/* Sampling flags shared by run and chat: --temp --top-k --top-p --min-p --presence-penalty
 * --repetition-penalty --seed --greedy. Unset flags keep the model's defaults. */
typedef struct SamplingFlags {
    float temp, top_p, min_p, presence, rep;
    int top_k, seed, have_presence, have_rep;
} SamplingFlags;
void cli_sampling_init(SamplingFlags *f);
/* Like cli_model_flag: 1 if consumed, 0 if not a sampling flag, -1 after printing an error. */
int cli_sampling_flag(SamplingFlags *f, int argc, char **argv, int *i);
/* The model's defaults (q35_sampling_defaults) overridden by the flags that were given. */
void cli_sampling_apply(const SamplingFlags *f, const Q35Engine *e, Q35Sampling *s);
int cli_fail(const Q35Err *err);   /* prints "qwen35: <msg>" and returns 1 */
int cli_open(Q35Engine **e, Q35Options *o); /* opens, printing the error; returns 0 or 1 */
#endif
