// limits.test.cjs — `qwen35 serve` under memory and queue limits, with the official `openai` client (node --test;
// started by tests/serve/run.sh). A KV pool of 20 blocks x 16 tokens and 2 slots: two requests of 190 tokens
// each cannot both hold their blocks, so one is preempted and recomputed; both must still return exactly what
// they return alone. With both slots busy and --max-queue 1, a second waiting request is refused with 429.
// Thinking mode puts the text into reasoning_content.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;

let srv, base, client, stderr = "";
const MODEL = "serve-model";

before(async () => {
    srv = spawn(process.env.QWEN35_BIN, ["serve", "--model", process.env.SERVE_MODEL, "--backend", "cpu", "--port", "0",
        "--ctx", "256", "--kv-memory", "200K", "--max-seqs", "2", "--max-queue", "1", "--threads", "1", "--deterministic"],
        { stdio: ["ignore", "ignore", "pipe"] });
    const port = await new Promise((resolve, reject) => {
        srv.stderr.on("data", (d) => {
            stderr += d;
            const m = stderr.match(/listening on http:\/\/[^:]+:(\d+)/);
            if (m) resolve(Number(m[1]));
        });
        srv.on("exit", (code) => reject(new Error(`server exited ${code}: ${stderr}`)));
    });
    base = `http://127.0.0.1:${port}`;
    client = new OpenAI({ apiKey: "none", baseURL: base + "/v1", maxRetries: 0 });
});

after(async () => {
    if (!srv || srv.exitCode !== null) return;
    const code = await new Promise((resolve) => { srv.on("exit", (c) => resolve(c)); srv.kill("SIGINT"); });
    assert.equal(code, 0, "SIGINT: exit status 0");
});

async function gauge(name) {
    const m = await (await fetch(base + "/metrics")).text();
    return Number(m.match(new RegExp(`^${name}\\{[^}]*\\} ([\\d.]+)`, "m"))[1]);
}
async function until(name, value) {
    for (let i = 0; i < 400; i++) {
        if ((await gauge(name)) === value) return;
        await new Promise((r) => setTimeout(r, 25));
    }
    assert.fail(`${name} never reached ${value}`);
}

test("the pool prints its size", () => {
    assert.match(stderr, /2 sequences at once, KV pool 20 blocks x 16 tokens/);
});

test("preemption: two sequences that outgrow the KV pool both finish with their solo text", async () => {
    const reqs = [1, 2].map((i) => ({ model: MODEL, prompt: `Long story number ${i}:`, max_tokens: 180, temperature: 1,
        seed: 40 + i }));
    const solo = [];
    for (const q of reqs) solo.push((await client.completions.create(q)).choices[0].text);
    assert.doesNotMatch(stderr, /preempted/);
    const together = await Promise.all(reqs.map((q) => client.completions.create(q)));
    together.forEach((r, i) => {
        assert.equal(r.usage.completion_tokens, 180);
        assert.equal(r.choices[0].text, solo[i], `request ${i}`);
    });
    // one preemption: the preempted request waits for the other's blocks; before, its recompute preempted the
    // other, whose recompute preempted it back, and so on
    const n = (stderr.match(/preempted \(KV blocks full\)/g) || []).length;
    assert.ok(n >= 1 && n <= 2, `${n} preemptions`);
});

test("queue limit: with the slots busy and one request waiting, the next gets 429", async () => {
    const long = (i) => client.completions.create({ model: MODEL, prompt: `Busy ${i}`, max_tokens: 120, seed: i });
    const running = [long(1), long(2)];
    await until("vllm:num_requests_running", 2);
    const waiting = long(3);
    await until("vllm:num_requests_waiting", 1);
    await assert.rejects(long(4), (err) => err.status === 429 && err.type === "rate_limit_error");
    const done = await Promise.all([...running, waiting]);
    for (const r of done) assert.equal(r.usage.completion_tokens, 120);
    await until("vllm:num_requests_running", 0);
    assert.equal(await gauge("vllm:kv_cache_usage_perc"), 0);
});

test("thinking: the reply goes to reasoning_content", async () => {
    const msgs = [{ role: "user", content: "Why is the sky blue?" }];
    const on = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8, seed: 5,
        logprobs: true, chat_template_kwargs: { enable_thinking: true } });
    const m = on.choices[0].message;
    assert.equal(typeof m.reasoning_content, "string");
    // no </think> in the reply: all of it is reasoning, without the newlines at its ends (the chat parser's rule)
    const raw = on.choices[0].logprobs.content.map((t) => t.token).join("");
    assert.ok(!raw.includes("</think>"), JSON.stringify(raw));
    assert.equal(m.reasoning_content, raw.replace(/^<think>/, "").replace(/^\n+|\n+$/g, ""));
    assert.equal(m.content, "");
    const off = await client.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 8, seed: 5 });
    assert.equal(off.choices[0].message.reasoning_content, undefined);
    assert.ok(off.usage.prompt_tokens > on.usage.prompt_tokens); // the empty <think></think> block of thinking off
});
