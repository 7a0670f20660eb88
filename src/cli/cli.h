/* cli.h — the qwen35 command-line subcommands. Each takes argv after the subcommand name,
 * prints errors as one line on stderr and returns the process exit code. */
#ifndef Q35_CLI_H
#define Q35_CLI_H
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);   /* src/cli/tok.c */
int cmd_detokenize(int argc, char **argv); /* src/cli/tok.c */
int cmd_chat(int argc, char **argv);       /* src/cli/tok.c */
int cmd_download(int argc, char **argv);   /* src/cli/download.c */
int cmd_serve(int argc, char **argv);      /* src/cli/serve.c */
#endif
