/* main.c — the qwen35 CLI: dispatches to the subcommands in src/cli/. No tensor knowledge here. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *usage =
    "usage: qwen35 COMMAND [flags]\n"
    "  run        --model DIR | --dummy NAME  (--prompt TEXT | --ids 1,2,3) [-n N] [--temp T] [--top-k K]\n"
    "             [--top-p P] [--min-p P] [--presence-penalty X] [--repetition-penalty X] [--seed S] [--print-ids]\n"
    "  chat       --model DIR [--think] [--system TEXT]   interactive multi-turn chat\n"
    "  logits     --model DIR --ids 1,2,3 [--mode prefill|decode] [--last] --out FILE   raw float32 [n x vocab]\n"
    "  info       --model DIR | --dummy NAME\n"
    "  bench      --model DIR | --dummy qwen3.5-0.8b [--backend cpu|cuda] [--ops] [--json FILE] [--md FILE]\n"
    "             [--ctx-list 128,2048,16384] [--prefill-list 128,512,2048,8192,32768]\n"
    "  tokenize   --model DIR (--text TEXT | --text-file F) [--jsonl]\n"
    "  detokenize --model DIR --ids 1,2,3\n"
    "  download   REPO [--dir DIR]   e.g. qwen35 download Qwen/Qwen3.5-0.8B\n"
    "common flags: --backend cpu|cuda|auto  --ctx N  --threads N  --deterministic  --no-graph\n"
    "              --keep-f32-params  --strict  --seed-weights S (dummy)  --probe DIR (activation dumps)\n";

int main(int argc, char **argv) {
    static const struct { const char *name; int (*fn)(int, char **); } cmds[] = {
        {"run", cmd_run},           {"logits", cmd_logits}, {"info", cmd_info},
        {"bench", cmd_bench},       {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize},
        {"chat", cmd_chat},         {"download", cmd_download},
    };
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 1 : 0;
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return cmds[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "qwen35: unknown command '%s' (try qwen35 --help)\n", argv[1]);
    return 1;
}
