// kvcache.test.cjs — `qwen35 serve --kv-cache-dtype fp8` (the served sequences' K and V kept as e4m3 values): the
// checks of stored.cjs (node --test; started by tests/serve/run.sh).
const { storedTests } = require("./stored.cjs");

storedTests({
    args: ["--kv-cache-dtype", "fp8"],
    says: /KV cache fp8 e4m3; DeltaNet states float32/,
    flag: "--kv-cache-dtype",
    bad: "fp16",
    badMessage: /--kv-cache-dtype: 'fp16' is not auto, bfloat16, fp8 or fp8_e4m3/,
});
