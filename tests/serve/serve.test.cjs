// serve.test.cjs — `qwen35 serve` driven by the official `openai` npm client on a real port (node --test;
// started by tests/serve/run.sh, which sets QWEN35_BIN, SERVE_MODEL and OPENAI_DIR). The model is a random
// Qwen3.5-architecture checkpoint with Qwen3's vocabulary, on the CPU backend. Sampling uses fixed seeds, so a
// request's text is the same alone, streamed or among others (the server runs --deterministic).
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;

const KEY = "test-key-123";
const CTX = 512;
let srv, base, client, stderr = "";

function startServer(args) {
    return new Promise((resolve, reject) => {
        const p = spawn(process.env.QWEN35_BIN, args, { stdio: ["ignore", "ignore", "pipe"] });
        let err = "";
        p.stderr.on("data", (d) => {
            err += d;
            const m = err.match(/listening on http:\/\/[^:]+:(\d+)/);
            if (m && !p.port) {
                p.port = Number(m[1]);
                resolve(p);
            }
        });
        p.stderr.on("data", (d) => (stderr += d));
        p.on("exit", (code) => { if (!p.port) reject(new Error(`server exited ${code}: ${err}`)); });
    });
}

before(async () => {
    srv = await startServer(["serve", "--model", process.env.SERVE_MODEL, "--backend", "cpu", "--port", "0",
        "--ctx", String(CTX), "--kv-memory", "64M", "--threads", "1", "--deterministic", "--api-key", KEY,
        "--max-body-kb", "64", "--max-seqs", "8"]);
    base = `http://127.0.0.1:${srv.port}`;
    client = new OpenAI({ apiKey: KEY, baseURL: base + "/v1", maxRetries: 0 });
});

after(async () => {
    if (!srv || srv.exitCode !== null) return;
    const code = await new Promise((resolve) => { srv.on("exit", (c) => resolve(c)); srv.kill("SIGTERM"); });
    assert.equal(code, 0, "SIGTERM: exit status 0");
});

const MODEL = "serve-model";
const chatReq = (extra) => ({ model: MODEL, messages: [{ role: "system", content: "Be brief." },
    { role: "user", content: "Tell me a story about a cat." }], max_tokens: 12, temperature: 1, seed: 7, ...extra });

async function collectChat(params) {
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let text = "", finish = null, usage = null, role = null, chunks = 0;
    for await (const ch of stream) {
        chunks++;
        if (ch.usage) usage = ch.usage;
        for (const c of ch.choices) {
            if (c.delta.role) role = c.delta.role;
            if (c.delta.content) text += c.delta.content;
            if (c.finish_reason) finish = c.finish_reason;
        }
    }
    return { text, finish, usage, role, chunks };
}

test("GET /health, /v1/models and /v1/models/{model}", async () => {
    const h = await fetch(base + "/health");
    assert.equal(h.status, 200);
    const models = await client.models.list();
    assert.equal(models.data.length, 1);
    assert.equal(models.data[0].id, MODEL);
    assert.equal(models.data[0].max_model_len, CTX);
    const m = await client.models.retrieve(MODEL);
    assert.deepEqual(m, models.data[0]);
    await assert.rejects(client.models.retrieve("other"), (e) => e.status === 404 && e.code === "model_not_found");
    assert.equal((await fetch(base + "/v1/models/" + MODEL)).status, 401, "the key applies");
});

test("chat: non-streamed, usage and finish_reason length", async () => {
    const r = await client.chat.completions.create(chatReq());
    assert.equal(r.object, "chat.completion");
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, "assistant");
    assert.equal(typeof r.choices[0].message.content, "string");
    assert.ok(r.choices[0].message.content.length > 0);
    assert.equal(r.choices[0].finish_reason, "length");
    assert.equal(r.usage.completion_tokens, 12);
    assert.ok(r.usage.prompt_tokens > 10);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 12);
});

test("chat: streamed deltas equal the non-streamed reply", async () => {
    const whole = await client.chat.completions.create(chatReq());
    const s = await collectChat(chatReq());
    assert.equal(s.role, "assistant");
    assert.equal(s.text, whole.choices[0].message.content);
    assert.equal(s.finish, "length");
    const { prompt_tokens_details: _a, ...u1 } = s.usage, { prompt_tokens_details: _b, ...u2 } = whole.usage;
    assert.deepEqual(u1, u2); // cached_tokens differ: the later request hits the prefix cache
    assert.ok(s.chunks >= 3);
});

test("completions: text prompt and token-id prompt, streamed and not", async () => {
    const a = await client.completions.create({ model: MODEL, prompt: "Hello, world", max_tokens: 6, temperature: 1, seed: 3 });
    assert.equal(a.object, "text_completion");
    assert.equal(a.usage.prompt_tokens, 3); // Hello | , | Ġworld in Qwen3's vocabulary
    assert.equal(a.usage.completion_tokens, 6);
    const b = await client.completions.create({ model: MODEL, prompt: [9707, 11, 1879], max_tokens: 6, temperature: 1, seed: 3 });
    assert.equal(b.choices[0].text, a.choices[0].text);
    const st = await client.completions.create({ model: MODEL, prompt: "Hello, world", max_tokens: 6, temperature: 1, seed: 3, stream: true });
    let text = "", finish = null;
    for await (const ch of st) for (const c of ch.choices) { text += c.text; if (c.finish_reason) finish = c.finish_reason; }
    assert.equal(text, a.choices[0].text);
    assert.equal(finish, "length");
});

test("stop strings: matched across tokens, not emitted, finish_reason stop", async () => {
    const req = { model: MODEL, prompt: "Once upon a time", max_tokens: 24, temperature: 1, seed: 11 };
    const full = (await client.completions.create(req)).choices[0].text;
    // a stop string of 3 characters from the middle of the text (it may span tokens)
    const cps = [...full]; // code points: no half surrogate pairs in the stop string
    const at = Math.floor(cps.length / 2);
    const stop = cps.slice(at, at + 3).join("");
    assert.ok(stop.length > 0, `text too short: ${JSON.stringify(full)}`);
    const want = full.slice(0, full.indexOf(stop));
    const r = await client.completions.create({ ...req, stop: ["@@never@@", stop] });
    assert.equal(r.choices[0].text, want);
    assert.equal(r.choices[0].finish_reason, "stop");
    const st = await client.completions.create({ ...req, stop, stream: true });
    let text = "";
    for await (const ch of st) for (const c of ch.choices) text += c.text;
    assert.equal(text, want);
});

test("logprobs: one entry per token, top alternatives sorted, chosen token among them when greedy", async () => {
    const r = await client.chat.completions.create(chatReq({ temperature: 0, logprobs: true, top_logprobs: 3, max_tokens: 5 }));
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
        assert.ok(t.logprob <= 0);
        assert.equal(t.top_logprobs.length, 3);
        for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
        assert.equal(t.top_logprobs[0].token, t.token); // greedy takes the most likely id
        assert.ok(Math.abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6);
    }
    assert.equal(lp.map((t) => t.token).join(""), r.choices[0].message.content);
});

test("logit_bias: +100 forces an id, the larger bias wins, -100 bans the greedy id; streamed alike", async () => {
    const ids = (t) => require("node:child_process").execFileSync(process.env.QWEN35_BIN,
        ["tokenize", "--model", process.env.SERVE_MODEL, "--text", t]).toString().trim().split(/\s+/).map(Number);
    const [paris] = ids(" Paris"), [tokyo] = ids(" Tokyo");
    const one = async (extra) => (await client.completions.create({ model: "serve-model", prompt: "The capital is",
        max_tokens: 3, seed: 5, temperature: 1, ...extra })).choices[0].text;
    assert.equal(await one({ logit_bias: { [paris]: 100 } }), " Paris Paris Paris");
    assert.equal(await one({ logit_bias: { [paris]: 90, [tokyo]: 100 } }), " Tokyo Tokyo Tokyo");
    const st = await client.completions.create({ model: "serve-model", prompt: "The capital is", max_tokens: 3,
        seed: 5, temperature: 1, logit_bias: { [tokyo]: 100 }, stream: true });
    let text = "";
    for await (const ch of st) for (const c of ch.choices) text += c.text;
    assert.equal(text, " Tokyo Tokyo Tokyo");
    // -100 on the greedy token: the next most likely one comes instead (the greedy token's id by the CLI tokenizer;
    // with the top-2 logprobs the replacement is known)
    const greedy = async (extra) => (await client.completions.create({ model: "serve-model", prompt: "The capital is",
        max_tokens: 1, temperature: 0, logprobs: 2, ...extra })).choices[0];
    const g0 = await greedy({});
    const gid = ids(g0.text);
    assert.equal(gid.length, 1, `the greedy token ${JSON.stringify(g0.text)} re-tokenizes to one id`);
    const banned = await greedy({ logit_bias: { [gid[0]]: -100 } });
    assert.equal(banned.text, Object.keys(g0.logprobs.top_logprobs[0])[1]);
    // chat: the same bias, and logprobs of the raw logits
    const g = await client.chat.completions.create(chatReq({ temperature: 0, max_tokens: 2, logprobs: true }));
    const b = await client.chat.completions.create(chatReq({ temperature: 0, max_tokens: 2, logprobs: true,
        logit_bias: { [paris]: 100 } }));
    assert.equal(b.choices[0].message.content, " Paris Paris");
    assert.notEqual(g.choices[0].message.content, " Paris Paris");
    assert.ok(b.choices[0].logprobs.content[0].logprob < -1, "logprobs are of the raw logits, not the biased ones");
    const bad = async (lb) => assert.rejects(client.completions.create({ model: "serve-model", prompt: "x",
        max_tokens: 1, logit_bias: lb }), (e) => e.status === 400 && e.param === "logit_bias", JSON.stringify(lb));
    await bad({ "x": 1 });
    await bad({ "-1": 1 });
    await bad({ " 5": 1 });
    await bad({ "999999999": 1 });
    await bad({ [paris]: 101 });
    await bad({ [paris]: "1" });
    await bad([1, 2]);
});

test("n choices: each its own draws, choice 0 as the request alone, streamed alike, usage summed", async () => {
    const p = chatReq({ temperature: 2, seed: 11, max_tokens: 6 });
    const solo = await client.chat.completions.create(p);
    const r = await client.chat.completions.create({ ...p, n: 3 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
    assert.equal(r.choices[0].message.content, solo.choices[0].message.content);
    const texts = r.choices.map((c) => c.message.content);
    // the random model's rows are peaked, so two draws may agree; with this seed they do not all agree
    assert.ok(new Set(texts).size >= 2, `different draws: ${JSON.stringify(texts)}`);
    assert.equal(r.usage.prompt_tokens, solo.usage.prompt_tokens);
    assert.equal(r.usage.completion_tokens, 3 * solo.usage.completion_tokens);
    const st = await client.chat.completions.create({ ...p, n: 3, stream: true, stream_options: { include_usage: true } });
    const got = ["", "", ""], fin = [null, null, null];
    let usage = null;
    for await (const ch of st) {
        if (ch.usage) usage = ch.usage;
        for (const c of ch.choices) {
            got[c.index] += c.delta.content ?? "";
            if (c.finish_reason) { assert.equal(fin[c.index], null); fin[c.index] = c.finish_reason; }
        }
    }
    assert.deepEqual(got, texts);
    assert.deepEqual(fin, r.choices.map((c) => c.finish_reason));
    assert.deepEqual(usage, r.usage);
    const cr = await client.completions.create({ model: MODEL, prompt: "The capital is", max_tokens: 4, n: 3,
        best_of: 3, seed: 3, temperature: 2 });
    assert.deepEqual(cr.choices.map((c) => c.index), [0, 1, 2]);
    assert.ok(new Set(cr.choices.map((c) => c.text)).size >= 2, JSON.stringify(cr.choices));
});

test("completions with a list of prompts: choice p * n + j is draw j of prompt p, as that prompt alone", async () => {
    const prompts = ["The capital of France is", "Once upon a time", "1, 2, 3,"];
    const p = { model: MODEL, max_tokens: 5, temperature: 2, seed: 7 };
    const solo = await Promise.all(prompts.map((prompt) => client.completions.create({ ...p, prompt, n: 2 })));
    const r = await client.completions.create({ ...p, prompt: prompts, n: 2 });
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3, 4, 5]);
    assert.deepEqual(r.choices.map((c) => c.text), solo.flatMap((s) => s.choices.map((c) => c.text)));
    assert.equal(r.usage.prompt_tokens, solo.reduce((a, s) => a + s.usage.prompt_tokens, 0));
    assert.equal(r.usage.completion_tokens, solo.reduce((a, s) => a + s.usage.completion_tokens, 0));
    const st = await client.completions.create({ ...p, prompt: prompts, n: 2, stream: true });
    const got = Array(6).fill("");
    for await (const ch of st) for (const c of ch.choices) got[c.index] += c.text;
    assert.deepEqual(got, r.choices.map((c) => c.text));
    // token-id prompts, as lists
    const ids = (t) => require("node:child_process").execFileSync(process.env.QWEN35_BIN, ["tokenize", "--model",
        process.env.SERVE_MODEL, "--text", t]).toString().trim().split(/\s+/).map(Number);
    const byIds = await client.completions.create({ ...p, prompt: prompts.map(ids), n: 2 });
    assert.deepEqual(byIds.choices.map((c) => c.text), r.choices.map((c) => c.text));
    // one kind per list; at most 64 choices
    await assert.rejects(client.completions.create({ ...p, prompt: ["a", [1, 2]] }),
        (e) => e.status === 400 && e.param === "prompt[1]");
    await assert.rejects(client.completions.create({ ...p, prompt: Array(33).fill("a"), n: 2 }),
        (e) => e.status === 400 && e.param === "n");
});

test("stop_token_ids and min_tokens: the greedy token's id ends the completion, not before min_tokens", async () => {
    const ids = (t) => require("node:child_process").execFileSync(process.env.QWEN35_BIN,
        ["tokenize", "--model", process.env.SERVE_MODEL, "--text", t]).toString().trim().split(/\s+/).map(Number);
    const req = { model: MODEL, prompt: "The capital is", max_tokens: 4, temperature: 0 };
    const g = (await client.completions.create(req)).choices[0];
    const first = await client.completions.create({ ...req, max_tokens: 1 });
    const id = ids(first.choices[0].text);
    assert.equal(id.length, 1, JSON.stringify(first.choices[0].text));
    const r = await client.completions.create({ ...req, stop_token_ids: id, ignore_eos: true });
    assert.deepEqual([r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens], ["", "stop", 1]);
    const other = await client.completions.create({ ...req, stop_token_ids: [id[0] === 0 ? 1 : 0] });
    assert.equal(other.choices[0].text, g.text);
    // min_tokens: the stop ids (here the request's) are not sampled before that many tokens
    const m = await client.completions.create({ ...req, stop_token_ids: id, logit_bias: { [id[0]]: 100 },
        min_tokens: 3, max_tokens: 8 });
    assert.deepEqual([m.choices[0].finish_reason, m.usage.completion_tokens], ["stop", 4]);
    const m0 = await client.completions.create({ ...req, stop_token_ids: id, logit_bias: { [id[0]]: 100 }, max_tokens: 8 });
    assert.equal(m0.usage.completion_tokens, 1);
    const eos = {};
    for (const t of ["<|im_end|>", "<|endoftext|>"]) eos[ids(t)[0]] = 100; // the model's stop ids, favoured
    const e0 = await client.completions.create({ ...req, logit_bias: eos, max_tokens: 8 });
    const e3 = await client.completions.create({ ...req, logit_bias: eos, max_tokens: 8, min_tokens: 3 });
    assert.deepEqual([e0.usage.completion_tokens, e3.usage.completion_tokens, e3.choices[0].finish_reason], [1, 4, "stop"]);
    await assert.rejects(client.completions.create({ ...req, min_tokens: 5 }),
        (e) => e.status === 400 && e.param === "min_tokens");
    await assert.rejects(client.completions.create({ ...req, stop_token_ids: [-1] }),
        (e) => e.status === 400 && e.param === "stop_token_ids");
    await assert.rejects(client.completions.create({ ...req, stop_token_ids: "5" }),
        (e) => e.status === 400 && e.param === "stop_token_ids");
});

test("echo: the completion's text starts with the prompt, streamed alike; not for chat", async () => {
    const req = { model: MODEL, prompt: "The capital is", max_tokens: 4, temperature: 1, seed: 9 };
    const plain = (await client.completions.create(req)).choices[0].text;
    const r = await client.completions.create({ ...req, echo: true, n: 2 });
    assert.equal(r.choices[0].text, req.prompt + plain);
    assert.ok(r.choices[1].text.startsWith(req.prompt));
    const st = await client.completions.create({ ...req, echo: true, stream: true });
    let text = "";
    for await (const ch of st) for (const c of ch.choices) text += c.text;
    assert.equal(text, req.prompt + plain);
    const ids = await client.completions.create({ model: MODEL, prompt: [785, 6722], max_tokens: 1, echo: true });
    assert.ok(ids.choices[0].text.startsWith("The capital"), ids.choices[0].text);
    await assert.rejects(client.chat.completions.create(chatReq({ echo: true })),
        (e) => e.status === 400 && e.param === "echo");
});

// lm-evaluation-harness scores a continuation this way (echo, logprobs, max_tokens 1, temperature 0)
test("echo with logprobs: the prompt's tokens and logprobs first (the first null), each as if it were generated", async () => {
    const prompt = "The capital of France is Paris";
    const ids = require("node:child_process").execFileSync(process.env.QWEN35_BIN, ["tokenize", "--model",
        process.env.SERVE_MODEL, "--text", prompt]).toString().trim().split(/\s+/).map(Number);
    const req = { model: MODEL, prompt, max_tokens: 1, temperature: 0, echo: true, logprobs: 2 };
    const r = await client.completions.create(req);
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, ids.length + 1);
    assert.equal(lp.tokens.slice(0, ids.length).join(""), prompt);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    assert.equal(r.choices[0].text, prompt + lp.tokens.at(-1));
    // position i's logprob is the one generation reports for token i after the prompt's first i tokens (forced by
    // a logit bias: logprobs are the raw logits'); a shifted or wrong row gives another number
    for (let i = 1; i < ids.length; i++) {
        const g = await client.completions.create({ model: MODEL, prompt: ids.slice(0, i), max_tokens: 1,
            temperature: 0, logprobs: 2, logit_bias: { [ids[i]]: 100 } });
        assert.ok(Math.abs(g.choices[0].logprobs.token_logprobs[0] - lp.token_logprobs[i]) < 2e-3,
            `position ${i}: ${lp.token_logprobs[i]} vs ${g.choices[0].logprobs.token_logprobs[0]}`);
        assert.equal(Object.keys(lp.top_logprobs[i]).length, 2);
        assert.ok(lp.token_logprobs[i] <= 0);
    }
    // streamed: the prompt's chunk carries its entries; the same numbers; offsets count the whole text
    const st = await client.completions.create({ ...req, stream: true });
    const toks = [], lps = [], offs = [];
    for await (const ch of st)
        for (const c of ch.choices)
            if (c.logprobs) toks.push(...c.logprobs.tokens), lps.push(...c.logprobs.token_logprobs),
                offs.push(...c.logprobs.text_offset);
    assert.deepEqual(toks, lp.tokens);
    assert.deepEqual(lps, lp.token_logprobs);
    assert.deepEqual(offs, lp.text_offset);
    // two prompts, two choices each: every choice has its prompt's entries
    const two = await client.completions.create({ ...req, prompt: [prompt, "1, 2, 3"], n: 2, temperature: 1, seed: 2 });
    assert.deepEqual(two.choices[1].logprobs.token_logprobs.slice(0, ids.length), lp.token_logprobs.slice(0, ids.length));
    assert.equal(two.choices[2].logprobs.token_logprobs[0], null);
});

test("/tokenize and /detokenize: the CLI tokenizer's ids, a chat's ids as generation counts them, round trip", async () => {
    const post = async (path, body, key = KEY) => {
        const r = await fetch(base + path, { method: "POST", body: JSON.stringify(body),
            headers: { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) } });
        return { status: r.status, json: await r.json() };
    };
    const text = "The capital of France is Paris.";
    const cli = require("node:child_process").execFileSync(process.env.QWEN35_BIN, ["tokenize", "--model",
        process.env.SERVE_MODEL, "--text", text]).toString().trim().split(/\s+/).map(Number);
    const t = await post("/tokenize", { model: MODEL, prompt: text });
    assert.equal(t.status, 200);
    assert.deepEqual(t.json, { count: cli.length, max_model_len: CTX, tokens: cli });
    const d = await post("/detokenize", { model: MODEL, tokens: cli });
    assert.deepEqual(d, { status: 200, json: { prompt: text } });
    const msgs = chatReq({}).messages;
    const c = await post("/tokenize", { model: MODEL, messages: msgs });
    const r = await client.chat.completions.create(chatReq({ max_tokens: 1 }));
    assert.equal(c.json.count, r.usage.prompt_tokens);
    assert.equal((await post("/tokenize", { prompt: text }, null)).status, 401);
    assert.equal((await post("/detokenize", { tokens: [-1] })).json.error.param, "tokens");
    assert.equal((await post("/detokenize", { tokens: "1" })).status, 400);
    assert.equal((await post("/tokenize", { prompt: 5 })).json.error.param, "prompt");
});

test("errors: bad JSON, bad field, unknown model, context, n, auth, route, method, size", async () => {
    const post = (path, body, key = KEY) => fetch(base + path, { method: "POST", body,
        headers: { "Content-Type": "application/json", ...(key ? { Authorization: `Bearer ${key}` } : {}) } });
    let r = await post("/v1/chat/completions", "{not json");
    assert.equal(r.status, 400);
    let e = (await r.json()).error;
    assert.equal(e.type, "invalid_request_error");
    assert.ok(e.message.length > 0);

    await assert.rejects(client.chat.completions.create(chatReq({ temperature: 5 })),
        (err) => err.status === 400 && err.param === "temperature");
    await assert.rejects(client.chat.completions.create(chatReq({ model: "no-such-model" })),
        (err) => err.status === 404 && err.code === "model_not_found");
    await assert.rejects(client.chat.completions.create(chatReq({ max_tokens: CTX + 1 })),
        (err) => err.status === 400 && err.code === "context_length_exceeded" && err.param === "max_tokens");
    await assert.rejects(client.chat.completions.create(chatReq({ n: 17 })), (err) => err.status === 400 && err.param === "n");
    await assert.rejects(client.chat.completions.create(chatReq({ n: 1, best_of: 2 })),
        (err) => err.status === 400 && err.param === "best_of");
    await assert.rejects(client.completions.create({ model: MODEL, prompt: "x", max_tokens: 1, suffix: "y" }),
        (err) => err.status === 400 && err.param === "suffix");
    const noKey = new OpenAI({ apiKey: "wrong", baseURL: base + "/v1", maxRetries: 0 });
    await assert.rejects(noKey.chat.completions.create(chatReq()), (err) => err.status === 401);
    r = await post("/v1/completions", JSON.stringify({ model: MODEL, prompt: "x" }), null);
    assert.equal(r.status, 401);
    assert.equal((await r.json()).error.type, "authentication_error");
    r = await fetch(base + "/v1/nothing");
    assert.equal(r.status, 404);
    r = await fetch(base + "/v1/chat/completions");
    assert.equal(r.status, 405);
    r = await post("/v1/completions", JSON.stringify({ model: MODEL, prompt: "x".repeat(100 * 1024) }));
    assert.equal(r.status, 413);
    const h = await fetch(base + "/health");
    assert.equal(h.status, 200);
});

test("concurrent requests: each gets its own text, as alone", async () => {
    const reqs = [1, 2, 3, 4, 5].map((i) => ({ model: MODEL, prompt: `Request number ${i} says`, max_tokens: 4 + 3 * i,
        temperature: 1, seed: 100 + i }));
    const solo = [];
    for (const q of reqs) solo.push((await client.completions.create(q)).choices[0].text);
    const together = await Promise.all(reqs.map((q) => client.completions.create(q)));
    together.forEach((r, i) => {
        assert.equal(r.choices[0].text, solo[i], `request ${i}`);
        assert.equal(r.usage.completion_tokens, reqs[i].max_tokens);
    });
});

test("a client that disconnects mid-stream frees its sequence", async () => {
    const ac = new AbortController();
    const stream = await client.chat.completions.create(chatReq({ max_tokens: 400, stream: true }), { signal: ac.signal });
    let n = 0;
    try {
        for await (const _ of stream) if (++n === 3) ac.abort();
    } catch (err) {
        assert.ok(ac.signal.aborted, String(err)); // the SDK may end the loop or throw on abort
    }
    assert.equal(n, 3);
    let running = -1;
    for (let i = 0; i < 100 && running !== 0; i++) {
        await new Promise((r) => setTimeout(r, 50));
        const m = await (await fetch(base + "/metrics")).text();
        running = Number(m.match(/^vllm:num_requests_running\{[^}]*\} (\d+)/m)[1]);
    }
    assert.equal(running, 0);
    const m = await (await fetch(base + "/metrics")).text();
    assert.match(m, /vllm:request_success_total\{finished_reason="abort",model_name="serve-model"\} [1-9]/);
    for (const name of ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum", "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total"])
        assert.ok(m.includes(name), name);
    assert.match(stderr, /chatcmpl-\S+ prompt \d+ completion \d+ ttft [\d.]+ ms [\d.]+ tok\/s finish \w+/);
});
