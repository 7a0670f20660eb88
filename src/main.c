/* main.c — the qwen35 CLI: dispatches to the subcommands in src/cli/. No tensor knowledge here. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/common.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *about;
} cmds[] = {
    {"run", cmd_run, "generate text after a prompt (--prompt TEXT or --ids 1,2,3)"},
    {"chat", cmd_chat, "interactive multi-turn chat, one message per stdin line"},
    {"logits", cmd_logits, "raw float32 logits [n x vocab] of some ids into a file"},
    {"info", cmd_info, "the model: architecture, parameters, dtypes, maximum and chosen context"},
    {"bench", cmd_bench, "decode ms/token and prefill time at several lengths"},
    {"tokenize", cmd_tokenize, "text -> token ids"},
    {"detokenize", cmd_detokenize, "token ids -> text"},
    {"download", cmd_download, "fetch a Hugging Face model repo (e.g. Qwen/Qwen3.5-0.8B)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with continuous batching (docs/SERVE.md)"},
};

static void usage(FILE *f) {
    fputs("usage: qwen35 COMMAND [flags]   (qwen35 COMMAND --help: that command's flags)\ncommands:\n", f);
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-11s %s\n", cmds[i].name, cmds[i].about);
    fputs("examples: qwen35 download Qwen/Qwen3.5-0.8B\n"
          "          qwen35 run --model models/Qwen3.5-0.8B --prompt 'Hello' -n 32\n",
          f);
    cli_exit_codes_help(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        char names[256] = "";
        for (size_t i = 0, k = 0; i < sizeof cmds / sizeof cmds[0] && k < sizeof names; i++)
            k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "", cmds[i].name);
        return cli_usage_error(NULL, "give a command: %s (qwen35 --help says more)", names);
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 2, argv + 2);
    return cli_usage_error(NULL, "unknown command '%s' (qwen35 --help lists them)", argv[1]);
}
