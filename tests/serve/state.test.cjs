// state.test.cjs — `qwen35 serve --state-dtype bfloat16` (the served sequences' DeltaNet states kept in bf16): the
// checks of stored.cjs (node --test; started by tests/serve/run.sh).
const { storedTests } = require("./stored.cjs");

storedTests({
    args: ["--state-dtype", "bfloat16"],
    says: /DeltaNet states bfloat16, [\d.]+ MiB a sequence/,
    flag: "--state-dtype",
    bad: "float16",
    badMessage: /--state-dtype: 'float16' is not float32 or bfloat16/,
});
