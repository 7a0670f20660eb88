/* common.h — the one flag parser of the qwen35 commands, and the flags several commands share.
 *
 * A command declares its flags as tables (CliFlag arrays ending with {0}) and hands them to cli_parse:
 *
 *     int n = 64, print = 0;
 *     const char *prompt = NULL;
 *     const CliFlag own[] = {
 *         {"--prompt", NULL, CLI_STR, &prompt, .arg = "TEXT", .help = "the prompt"},
 *         {"-n", "--max-tokens", CLI_INT, &n, .lo = 0, .hi = 1 << 24, .arg = "N", .help = "tokens to generate"},
 *         {"--print-ids", NULL, CLI_BOOL, &print, .help = "print ids instead of text"},
 *         {0}};
 *     const CliGroup groups[] = {{"run flags", own}, {"model flags", model_flags}, {0}};
 *     const CliSpec spec = {"run", "--model DIR (--prompt TEXT | --ids 1,2,3) [flags]", "Generates text.", groups};
 *     int rc = cli_parse(&spec, argc, argv, NULL);
 *     if (rc != CLI_OK) return rc == CLI_HELP ? 0 : CLI_EXIT_USAGE;
 *
 * Every value is checked where it is parsed: integers and numbers against [lo, hi] (NaN and inf are never
 * numbers), id lists strictly ("1,2,3": no blanks, no empty items). -h / --help prints the command's usage
 * on stdout. Errors are one line on stderr, "qwen35: CMD: ...".
 *
 * Exit codes of every command (cli_exit_codes_help prints them in the usage):
 *   0  success
 *   1  runtime error: a file missing or malformed, a model the engine cannot run, out of memory, ...
 *   2  usage error: unknown flag, missing or malformed value, value out of range, missing required flag */
#ifndef Q35_CLI_COMMON_H
#define Q35_CLI_COMMON_H
#include <stdio.h>

#include "qwen35.h"

enum { CLI_EXIT_OK = 0, CLI_EXIT_RUNTIME = 1, CLI_EXIT_USAGE = 2 };

typedef enum CliType {
    CLI_BOOL,  /* no value; stores .set (or 1 when .set is 0) into *(int *)dst */
    CLI_INT,   /* int in [lo, hi] into *(int *)dst */
    CLI_FLOAT, /* finite number in [lo, hi] (lo_open: (lo, hi]) into *(float *)dst */
    CLI_STR,   /* any string into *(const char **)dst */
    CLI_U64,   /* integer in [lo, hi] (hi at most 2^53) into *(uint64_t *)dst */
    CLI_IDS,   /* strict list "5,17,9" of ints in [lo, hi] into *(CliIds *)dst (malloc'ed; cli_ids_free) */
} CliType;

typedef struct CliIds {
    int *v;
    int n;
} CliIds;

typedef struct CliFlag {
    const char *name;  /* "--temp" */
    const char *alias; /* another spelling ("-n"), or NULL */
    CliType type;
    void *dst;
    double lo, hi;    /* CLI_INT / CLI_FLOAT / CLI_U64 / CLI_IDS: the inclusive range */
    int lo_open;      /* CLI_FLOAT: lo itself is excluded */
    int set;          /* CLI_BOOL: the value stored (0 means 1) */
    int *seen;        /* optional: set to 1 when the flag is given */
    const char *arg;  /* value placeholder in the usage ("N", "DIR"); NULL for CLI_BOOL */
    const char *help; /* one line; NULL hides the flag from the usage (aliases of the past) */
} CliFlag;

typedef struct CliGroup {
    const char *title;    /* "sampling flags" */
    const CliFlag *flags; /* ends with {0} */
} CliGroup;

typedef struct CliSpec {
    const char *cmd;        /* "run" */
    const char *synopsis;   /* after "usage: qwen35 CMD " */
    const char *about;      /* what the command does (one or more lines), or NULL */
    const CliGroup *groups; /* ends with {0} */
    int max_pos;            /* positional arguments allowed (download's REPO: 1); 0: none */
} CliSpec;

enum { CLI_OK = 0, CLI_HELP = 1, CLI_ERROR = 2 };

/* Parses argv (after the command name). Positional arguments (at most spec->max_pos) go to pos[] in order,
 * their count to *n_pos (both may be NULL when max_pos is 0). "--" ends the flags. Returns CLI_OK;
 * CLI_HELP after printing the usage on stdout (exit 0); CLI_ERROR after printing one line on stderr
 * (exit CLI_EXIT_USAGE). */
int cli_parse(const CliSpec *spec, int argc, char **argv, const char **pos, int *n_pos);
/* The usage of the command (synopsis, about, every group's flags, the exit codes) on f. */
void cli_usage(const CliSpec *spec, FILE *f);
/* The exit-code lines of every usage text. */
void cli_exit_codes_help(FILE *f);

/* One line "qwen35: CMD: <message>" on stderr; returns CLI_EXIT_USAGE / CLI_EXIT_RUNTIME. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints a library error ("qwen35: CMD: msg") and returns CLI_EXIT_RUNTIME. */
int cli_fail(const char *cmd, const Q35Err *err);

/* Strict id list: decimal integers in [lo, hi] separated by single commas; no blanks, no empty items.
 * Prints "qwen35: CMD: FLAG: ..." and returns -1 on bad input. */
int cli_parse_ids(const char *cmd, const char *flag, const char *s, long lo, long hi, CliIds *out);
void cli_ids_free(CliIds *ids);

/* The CPU cores usable by this process (at least 1): the cap of --threads. */
int cli_hw_threads(void);

/* Model and backend flags shared by the engine commands: --model --dummy --backend --ctx --threads
 * --seed-weights --probe --deterministic --no-graph --keep-f32-params --strict --weights. */
typedef struct CliModel {
    Q35Options o;
    int threads_seen;
    CliFlag flags[14];
} CliModel;
/* Fills m->o with the defaults plus QWEN35_DETERMINISTIC=1 (mirrors --deterministic), and m->flags. */
void cli_model_init(CliModel *m);
/* After cli_parse: --backend one of cpu|cuda|auto, --threads capped at the hardware's count, a model given.
 * Prints the error and returns CLI_EXIT_USAGE, or 0. */
int cli_model_check(const char *cmd, CliModel *m);
/* Opens the engine; prints the error and returns CLI_EXIT_RUNTIME, or 0. Notes of the engine (e.g. an
 * auto backend fell back to the CPU) are NOT printed: cli_note prints them once the command has checked
 * everything else, so that no note comes before an error. */
int cli_open(const char *cmd, Q35Engine **e, const CliModel *m);
void cli_note(const char *cmd, const Q35Engine *e);

/* Sampling flags shared by run and chat: --temp --top-k --top-p --min-p --presence-penalty --frequency-penalty
 * --repetition-penalty --seed --greedy. Flags not given keep the model's defaults. */
typedef struct SamplingFlags {
    float temp, top_p, min_p, presence, frequency, rep;
    int top_k, seed, greedy;
    int have_temp, have_top_p, have_min_p, have_presence, have_frequency, have_rep, have_top_k, have_seed;
    CliFlag flags[10];
} SamplingFlags;
void cli_sampling_init(SamplingFlags *f);
/* The model's defaults (q35_sampling_defaults) overridden by the flags that were given. */
void cli_sampling_apply(const SamplingFlags *f, const Q35Engine *e, Q35Sampling *s);

#endif
