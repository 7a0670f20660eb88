// prefix.test.cjs — the prefix cache of `qwen35 serve` (issue 29) through the official `openai` client (node --test;
// started by tests/serve/run.sh). Three --deterministic CPU servers on the tests/serve model: "warm" (the default
// cache), "cold" (--prefix-cache-memory 0) and "tiny" (a cache of a few snapshots and blocks). Every answer of a
// cached server must equal the cold server's, text and logprobs, bit for bit; usage.prompt_tokens_details.cached_tokens,
// the request log line and /metrics (vllm:prefix_cache_queries / _hits) must say what was reused.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;

const MODEL = "serve-model";
const servers = {};

async function start(name, extra) {
    const s = { stderr: "" };
    s.proc = spawn(process.env.QWEN35_BIN, ["serve", "--model", process.env.SERVE_MODEL, "--backend", "cpu", "--port",
        "0", "--ctx", "1024", "--kv-memory", "16M", "--max-seqs", "4", "--threads", "1", "--deterministic", ...extra],
    { stdio: ["ignore", "ignore", "pipe"] });
    const port = await new Promise((resolve, reject) => {
        s.proc.stderr.on("data", (d) => {
            s.stderr += d;
            const m = s.stderr.match(/listening on http:\/\/[^:]+:(\d+)/);
            if (m) resolve(Number(m[1]));
        });
        s.proc.on("exit", (code) => reject(new Error(`server ${name} exited ${code}: ${s.stderr}`)));
    });
    s.base = `http://127.0.0.1:${port}`;
    s.client = new OpenAI({ apiKey: "none", baseURL: s.base + "/v1", maxRetries: 0 });
    servers[name] = s;
}

before(async () => {
    await start("warm", []);
    await start("cold", ["--prefix-cache-memory", "0"]);
    await start("tiny", ["--prefix-cache-memory", "200K"]);
});

after(async () => {
    for (const s of Object.values(servers)) {
        if (s.proc.exitCode !== null) continue;
        const code = await new Promise((resolve) => { s.proc.on("exit", (c) => resolve(c)); s.proc.kill("SIGINT"); });
        assert.equal(code, 0, "SIGINT: exit status 0");
    }
});

async function counter(s, name) {
    const m = await (await fetch(s.base + "/metrics")).text();
    return Number(m.match(new RegExp(`^${name}_total\\{[^}]*\\} ([\\d.]+)`, "m"))[1]);
}

const lps = (c) => JSON.stringify(c.logprobs);
async function chat(s, messages, max_tokens = 8) {
    return s.client.chat.completions.create({ model: MODEL, messages, max_tokens, temperature: 0, logprobs: true,
        top_logprobs: 3 });
}
async function complete(s, prompt, max_tokens = 8) {
    return s.client.completions.create({ model: MODEL, prompt, max_tokens, temperature: 0, logprobs: 3 });
}
const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;

test("the cache is announced; off on the cold server", () => {
    assert.match(servers.warm.stderr, /prefix cache [\d.]+ MiB: \d+ DeltaNet snapshots/);
    assert.match(servers.cold.stderr, /prefix cache off/);
});

test("an exactly repeated short prompt hits all but its last token, same output as cold", async () => {
    const w = servers.warm;
    const q0 = await counter(w, "vllm:prefix_cache_queries"), h0 = await counter(w, "vllm:prefix_cache_hits");
    const prompt = "The quick brown fox";
    const first = await complete(w, prompt), again = await complete(w, prompt), cold = await complete(servers.cold, prompt);
    const n = first.usage.prompt_tokens;
    assert.equal(cached(first), 0);
    assert.equal(cached(again), n - 1);
    assert.equal(cached(cold), 0);
    for (const r of [first, again]) {
        assert.equal(r.choices[0].text, cold.choices[0].text);
        assert.equal(lps(r.choices[0]), lps(cold.choices[0]));
    }
    assert.equal(await counter(w, "vllm:prefix_cache_queries") - q0, 2 * n);
    assert.equal(await counter(w, "vllm:prefix_cache_hits") - h0, n - 1);
    assert.match(w.stderr, new RegExp(`cmpl-\\S+ prompt ${n} completion 8 ttft [\\d.]+ ms [\\d.]+ tok/s finish length cached ${n - 1}`));
});

const SYSTEM = "You are a careful assistant. " + Array.from({ length: 60 }, (_, i) => `Rule ${i}: answer briefly.`).join(" ");

test("multi-turn: turn 2 resends the history and prefills only what follows the turn-1 assistant header", async () => {
    const w = servers.warm, c = servers.cold;
    const m1 = [{ role: "system", content: SYSTEM }, { role: "user", content: "Name a colour." }];
    const t1 = await chat(w, m1);
    // the history as a client resends it (a fixed reply: the random model's text could merge with the header's "\n")
    const m2 = [...m1, { role: "assistant", content: "Blue." },
        { role: "user", content: "And another one?" }];
    const t2 = await chat(w, m2), c2 = await chat(c, m2);
    // turn 1's prompt ends "<|im_start|>assistant\n" + "<think>\n\n</think>\n\n" (4 ids, thinking off): the resent
    // history diverges right after the header, where a snapshot was taken
    assert.equal(cached(t2), t1.usage.prompt_tokens - 4);
    assert.ok(t2.usage.prompt_tokens - cached(t2) < 60, `prefilled ${t2.usage.prompt_tokens - cached(t2)}`);
    assert.equal(t2.choices[0].message.content, c2.choices[0].message.content);
    assert.equal(lps(t2.choices[0]), lps(c2.choices[0]));
    const m3 = [...m2, { role: "assistant", content: "Green." }, { role: "user", content: "Thanks." }];
    const t3 = await chat(w, m3), c3 = await chat(c, m3);
    assert.equal(cached(t3), t2.usage.prompt_tokens - 4);
    assert.equal(lps(t3.choices[0]), lps(c3.choices[0]));
});

test("two requests sharing a long system prompt prefill it once", async () => {
    const w = servers.warm, c = servers.cold;
    const sys = SYSTEM + " Also: be kind.";
    const a = await chat(w, [{ role: "system", content: sys }, { role: "user", content: "First question?" }]);
    const mb = [{ role: "system", content: sys }, { role: "user", content: "A different one!" }];
    const b = await chat(w, mb), cb = await chat(c, mb);
    assert.equal(cached(a), 0);
    assert.ok(a.usage.prompt_tokens > 300);
    // b resumes at the end of the system message (the snapshot after its "<|im_end|>\n"): only its own turn is fed
    assert.ok(cached(b) > 300 && b.usage.prompt_tokens - cached(b) < 25, `cached ${cached(b)} of ${b.usage.prompt_tokens}`);
    assert.equal(b.choices[0].message.content, cb.choices[0].message.content);
    assert.equal(lps(b.choices[0]), lps(cb.choices[0]));
});

test("two requests sharing a long system prompt sent together: the second waits for the first to cache it", async () => {
    const w = servers.warm, c = servers.cold;
    // starts unlike every earlier prompt (nothing of it is cached yet) and is longer than a step's 512 tokens, so the
    // first request is still prefilling it when the second is up for admission
    const sys = "Sent together. " + SYSTEM + " " + SYSTEM;
    const ma = [{ role: "system", content: sys }, { role: "user", content: "One?" }];
    const mb = [{ role: "system", content: sys }, { role: "user", content: "Two!" }];
    const [a, b] = await Promise.all([chat(w, ma), chat(w, mb)]);
    const [ca, cb] = await Promise.all([chat(c, ma), chat(c, mb)]);
    // whichever was admitted second resumes where the two diverge instead of computing the system prompt again
    const hit = Math.max(cached(a), cached(b)), miss = Math.min(cached(a), cached(b));
    assert.ok(miss < 10 && hit > 300, `cached ${cached(a)} and ${cached(b)} of ${a.usage.prompt_tokens}`);
    assert.equal(lps(a.choices[0]), lps(ca.choices[0]));
    assert.equal(lps(b.choices[0]), lps(cb.choices[0]));
});

test("a tiny cache evicts and still answers exactly", async () => {
    const t = servers.tiny, c = servers.cold;
    assert.match(t.stderr, /prefix cache 0.2 MiB: 5 DeltaNet snapshots of 0.02 MiB, up to 13 cached KV blocks/);
    let hits = 0;
    for (let i = 0; i < 6; i++) { // each prompt twice in a row; 6 x up to 13 blocks pass the 13 the cache may keep
        const prompt = `Story ${i}: ` + "once upon a time ".repeat(10 + 7 * i);
        const rc = await complete(c, prompt, 4);
        for (const r of [await complete(t, prompt, 4), await complete(t, prompt, 4)]) {
            assert.equal(r.choices[0].text, rc.choices[0].text);
            assert.equal(lps(r.choices[0]), lps(rc.choices[0]));
            hits += cached(r);
        }
    }
    assert.ok(hits > 0, "some requests hit");
    assert.ok(await counter(t, "vllm:prefix_cache_hits") < await counter(t, "vllm:prefix_cache_queries"));
});
