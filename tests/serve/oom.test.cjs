// oom.test.cjs — `qwen35 serve` when its output cannot be stored (node --test; started by tests/serve/run.sh, which
// sets FAILALLOC to the shim tests/serve/failalloc.c, or leaves it unset under sanitizers: skipped). The shim makes
// the string buffers' reallocs from 2 KB on fail while armed (SIGUSR2 toggles it). A reply whose text outgrows that
// must end with a 500 error object, streamed or not, never as a 200 with its text cut short; a stream whose next
// event (a chunk with 20 top logprobs, over 1 KB: a 2 KB buffer) cannot be written ends broken, never with the event
// cut short; once memory is back the server answers as before.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;
const { start, stop } = require("./server.cjs");

const MODEL = "serve-model";
const skip = process.env.FAILALLOC ? false : "no FAILALLOC shim (a sanitizer build)";
let srv, client;

before(async () => {
    if (skip) return;
    srv = await start(["--max-seqs", "2"], { LD_PRELOAD: process.env.FAILALLOC });
    client = new OpenAI({ apiKey: "none", baseURL: `http://127.0.0.1:${srv.port}/v1`, maxRetries: 0 });
});

after(async () => {
    if (!skip) assert.equal(await stop(srv), 0, "SIGTERM: exit status 0");
});

// 900 tokens of the random model: KBs of text, so the content buffer must grow past 2 KB.
const LONG = { model: MODEL, prompt: "Once upon a time", max_tokens: 900, ignore_eos: true, temperature: 1, seed: 5 };

test("a reply that cannot be stored ends with a 500 error, streamed or not, and the server recovers", { skip },
    async () => {
        const full = await client.completions.create(LONG);
        const bytes = Buffer.byteLength(full.choices[0].text);
        assert.ok(bytes > 2048, `the reply must outgrow 2 KB (${bytes} bytes)`);

        srv.kill("SIGUSR2"); // memory "runs out"
        await assert.rejects(client.completions.create(LONG), (e) => {
            assert.equal(e.status, 500);
            assert.match(e.message, /out of memory: the reply could not be stored whole/);
            return true;
        });
        await assert.rejects(async () => {
            let text = "";
            for await (const c of await client.completions.create({ ...LONG, stream: true })) text += c.choices[0].text;
            assert.fail(`the stream ended normally with ${text.length} bytes`);
        }, (e) => {
            assert.match(e.message, /out of memory: the reply could not be stored whole/);
            return true;
        });
        srv.kill("SIGUSR2"); // memory is back

        const again = await client.completions.create(LONG);
        assert.equal(again.choices[0].text, full.choices[0].text);
        assert.equal(again.choices[0].finish_reason, "length");
    });

test("a stream whose event cannot be written ends broken, and the server recovers", { skip }, async () => {
    const q = { model: MODEL, messages: [{ role: "user", content: "hi" }], max_tokens: 3, logprobs: true,
        top_logprobs: 20, stream: true };
    const chunks = async () => {
        const out = [];
        for await (const c of await client.chat.completions.create(q)) out.push(c);
        return out;
    };
    const whole = await chunks();
    assert.ok(whole.some((c) => JSON.stringify(c).length > 1100), "a chunk must need a 2 KB event buffer");

    srv.kill("SIGUSR2");
    await assert.rejects(chunks(), /terminated/);
    srv.kill("SIGUSR2");

    const text = (cs) => cs.map((c) => c.choices[0]?.delta?.content ?? "").join(""); // chunking follows timing
    assert.equal(text(await chunks()), text(whole));
});
