// stored.cjs — the checks of a serve flag that changes how the served sequences' state is stored (state.test.cjs:
// --state-dtype bfloat16, kvcache.test.cjs: --kv-cache-dtype fp8), with the official `openai` client against the CPU
// backend in deterministic mode: the startup line names the choice, a sampled request gives the same text alone and
// among concurrent others (batch invariance with the stored values), a repeated prompt (a prefix-cache hit: its
// stored snapshot and blocks reused) gives its first text, and a value the flag does not know is a usage error.
//   storedTests({ args, says, flag, bad, badMessage }): args the server's flags, says a RegExp for its startup line,
//   flag / bad an unknown value for the usage error and badMessage the RegExp its message must match.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const { start, stop } = require("./server.cjs");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;

const MODEL = "serve-model";

function storedTests({ args, says, flag, bad, badMessage }) {
    let srv, client;
    before(async () => {
        srv = await start(args);
        client = new OpenAI({ apiKey: "none", baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0 });
    });

    after(async () => {
        assert.equal(await stop(srv), 0, "SIGTERM: exit status 0");
    });

    test(`the server says what it stores (${args.join(" ")})`, () => {
        assert.match(srv.log, says);
    });

    test("a sampled request: the same text alone and among three concurrent others", async () => {
        const q = { model: MODEL, prompt: "Once upon a time", max_tokens: 40, temperature: 1, seed: 11 };
        const alone = await client.completions.create(q);
        assert.equal(alone.usage.completion_tokens, 40);
        const others = [1, 2, 3].map((i) => client.completions.create({ model: MODEL, prompt: `Other prompt ${i}: ` +
            "word ".repeat(5 * i), max_tokens: 10 + 7 * i, temperature: 0.7, seed: i }));
        const [again, ...rest] = await Promise.all([client.completions.create(q), ...others]);
        assert.equal(again.choices[0].text, alone.choices[0].text);
        rest.forEach((r, i) => assert.equal(r.usage.completion_tokens, 17 + 7 * i));
    });

    test("a repeated chat prompt (prefix-cache hit) gives its first text", async () => {
        const q = { model: MODEL, messages: [{ role: "system", content: "You are terse. ".repeat(30) },
            { role: "user", content: "Name a color." }], max_tokens: 20, temperature: 0 };
        const a = await client.chat.completions.create(q), b = await client.chat.completions.create(q);
        assert.equal(b.choices[0].message.content, a.choices[0].message.content);
        assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens);
        assert.ok(b.usage.prompt_tokens_details.cached_tokens > 0, "the second request hits the prefix cache");
    });

    test(`${flag} with an unknown type is a usage error`, async () => {
        const p = spawn(process.env.QWEN35_BIN, ["serve", "--model", process.env.SERVE_MODEL, "--backend", "cpu",
            flag, bad], { stdio: ["ignore", "ignore", "pipe"] });
        let err = "";
        p.stderr.on("data", (d) => { err += d; });
        const code = await new Promise((resolve) => p.on("exit", (c) => resolve(c)));
        assert.equal(code, 2);
        assert.match(err, badMessage);
    });
}

module.exports = { storedTests };
