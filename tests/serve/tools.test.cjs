// tools.test.cjs — tool calls and reasoning through `qwen35 serve` with the official `openai` npm client (issue 30;
// started by tests/serve/run.sh). The model has random weights, so it never writes a call by itself: the request side
// (tools, assistant tool_calls, tool results, reasoning_content) is checked by a three-round tool loop that the server
// must render and answer, the response side by tool_choice "required" / a named function, where the server samples
// under the tool guide, so a well-formed call comes out whatever the weights. Every response and stream chunk is
// checked against OpenAI's documented shapes (a small JSON-schema check below). response_format (json_object,
// json_schema) is sampled under the schema's reader the same way: every reply that stops parses and validates.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const server = require("./server.cjs");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;

const MODEL = "serve-model";
let srv, base, client;

before(async () => {
    srv = await server.start([]);
    base = `http://127.0.0.1:${srv.port}`;
    client = new OpenAI({ apiKey: "none", baseURL: base + "/v1", maxRetries: 0 });
});

after(async () => assert.equal(await server.stop(srv), 0, "SIGTERM: exit status 0"));

// ---- a JSON-schema subset: type (one or a list), enum, properties, required, additionalProperties: false, items ----
function check(v, s, path = "$") {
    const types = [].concat(s.type || []);
    const kind = v === null ? "null" : Array.isArray(v) ? "array" : Number.isInteger(v) ? "integer" : typeof v;
    if (types.length && !types.includes(kind) && !(kind === "integer" && types.includes("number")))
        throw new Error(`${path}: ${JSON.stringify(v)} is not ${types.join("|")}`);
    if (s.enum && !s.enum.includes(v)) throw new Error(`${path}: ${JSON.stringify(v)} not in ${JSON.stringify(s.enum)}`);
    if (kind === "object" && s.properties) {
        for (const k of s.required || []) if (!(k in v)) throw new Error(`${path}: missing ${k}`);
        for (const [k, x] of Object.entries(v)) {
            if (s.properties[k]) check(x, s.properties[k], `${path}.${k}`);
            else if (s.additionalProperties === false) throw new Error(`${path}: unexpected field ${k}`);
        }
    }
    if (kind === "array" && s.items) v.forEach((x, i) => check(x, s.items, `${path}[${i}]`));
    if (kind === "array" && s.minItems !== undefined && v.length < s.minItems) throw new Error(`${path}: too few items`);
}
const str = { type: "string" }, int = { type: "integer" };
const FINISH = ["stop", "length", "tool_calls", "content_filter", "function_call"];
const usage = { type: "object", required: ["prompt_tokens", "completion_tokens", "total_tokens"],
    properties: { prompt_tokens: int, completion_tokens: int, total_tokens: int } };
const logprobs = { type: ["object", "null"] };
// https://platform.openai.com/docs/api-reference/chat/object (reasoning_content: the vLLM / DeepSeek extension)
const COMPLETION = { type: "object", required: ["id", "object", "created", "model", "choices", "usage"], properties: {
    id: str, object: { enum: ["chat.completion"] }, created: int, model: str, usage,
    choices: { type: "array", minItems: 1, items: { type: "object", required: ["index", "message", "finish_reason"],
        additionalProperties: false, properties: { index: int, logprobs, finish_reason: { enum: FINISH },
            message: { type: "object", required: ["role", "content"], additionalProperties: false, properties: {
                role: { enum: ["assistant"] }, content: { type: ["string", "null"] }, reasoning_content: str,
                tool_calls: { type: "array", minItems: 1, items: { type: "object", required: ["id", "type", "function"],
                    additionalProperties: false, properties: { id: str, type: { enum: ["function"] },
                        function: { type: "object", required: ["name", "arguments"], additionalProperties: false,
                            properties: { name: str, arguments: str } } } } } } } } } } } };
// https://platform.openai.com/docs/api-reference/chat/streaming
const CHUNK = { type: "object", required: ["id", "object", "created", "model", "choices"], properties: {
    id: str, object: { enum: ["chat.completion.chunk"] }, created: int, model: str, usage: { type: ["object", "null"] },
    choices: { type: "array", items: { type: "object", required: ["index", "delta", "finish_reason"],
        additionalProperties: false, properties: { index: int, logprobs, finish_reason: { enum: [null, ...FINISH] },
            delta: { type: "object", additionalProperties: false, properties: {
                role: { enum: ["assistant"] }, content: { type: ["string", "null"] }, reasoning_content: str,
                tool_calls: { type: "array", minItems: 1, items: { type: "object", required: ["index"],
                    additionalProperties: false, properties: { index: int, id: str, type: { enum: ["function"] },
                        function: { type: "object", additionalProperties: false,
                            properties: { name: str, arguments: str } } } } } } } } } } } };

// ---- requests ----
const TOOLS = [
    { type: "function", function: { name: "get_weather", description: "Current weather of a city.",
        parameters: { type: "object", properties: { city: { type: "string", description: "City name" },
            unit: { type: "string", enum: ["celsius", "fahrenheit"] } }, required: ["city"] } } },
    { type: "function", function: { name: "get_time", description: "Local time in a time zone.",
        parameters: { type: "object", properties: { tz: { type: "string" } }, required: ["tz"] } } },
];
const NO_THINK = { chat_template_kwargs: { enable_thinking: false } };

async function ask(params) {
    const r = await client.chat.completions.create(params);
    check(r, COMPLETION);
    return r;
}

// Streams params; checks every chunk and the tool_calls delta protocol; returns the assembled message.
async function askStream(params) {
    const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    let content = "", reasoning = "", finish = null, usage = null, sawContent = false;
    const calls = [];
    for await (const ch of stream) {
        check(ch, CHUNK);
        if (ch.usage) usage = ch.usage;
        for (const c of ch.choices) {
            const d = c.delta;
            if (typeof d.content === "string") { content += d.content; sawContent ||= d.content.length > 0; }
            if (d.reasoning_content) reasoning += d.reasoning_content;
            for (const t of d.tool_calls || []) {
                if (t.index === calls.length) { // first delta of a call: id, type, name, empty arguments
                    assert.equal(typeof t.id, "string");
                    assert.equal(t.type, "function");
                    assert.equal(typeof t.function.name, "string");
                    assert.equal(t.function.arguments, "");
                    calls.push({ id: t.id, type: "function", function: { name: t.function.name, arguments: "" } });
                } else {
                    assert.equal(t.index, calls.length - 1, "argument fragments follow their call's first delta");
                    assert.equal(t.id, undefined);
                    assert.equal(t.function.name, undefined);
                    calls[t.index].function.arguments += t.function.arguments;
                }
            }
            if (c.finish_reason) { assert.equal(finish, null, "one finish_reason"); finish = c.finish_reason; }
        }
    }
    assert.ok(finish, "a finish_reason");
    assert.ok(usage, "a usage chunk");
    return { content, reasoning, calls, finish, usage, sawContent };
}

// A response's calls: each a known function whose arguments parse as a JSON object.
function checkCalls(calls, names) {
    for (const c of calls) {
        assert.ok(names.includes(c.function.name), `call of ${c.function.name}`);
        assert.match(c.id, /^call_[0-9a-f]{24}$/);
        const a = JSON.parse(c.function.arguments);
        assert.ok(a !== null && typeof a === "object" && !Array.isArray(a), `arguments ${c.function.arguments}`);
    }
}

const user = { role: "user", content: "What is the weather in Paris and the time in Tokyo?" };

test("a three-round tool loop: tools, assistant tool_calls + reasoning_content, tool results", async () => {
    const base1 = { model: MODEL, max_tokens: 8, temperature: 1, seed: 5, ...NO_THINK };
    const plain = await ask({ ...base1, messages: [user] });
    const r1 = await ask({ ...base1, messages: [user], tools: TOOLS });
    // the tools block is in the system turn: Qwen3's template adds > 100 tokens for these two tools
    assert.ok(r1.usage.prompt_tokens > plain.usage.prompt_tokens + 100, `${r1.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
    const none = await ask({ ...base1, messages: [user], tools: TOOLS, tool_choice: "none" });
    assert.equal(none.usage.prompt_tokens, r1.usage.prompt_tokens, "tool_choice none keeps the tools in the prompt");
    assert.equal(none.choices[0].message.tool_calls, undefined);

    const call1 = { id: "call_a1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } };
    const round2 = [user,
        { role: "assistant", content: null, reasoning_content: "The user wants the weather.", tool_calls: [call1] },
        { role: "tool", tool_call_id: "call_a1", content: '{"temperature": 21, "sky": "clear"}' }];
    const r2 = await ask({ ...base1, messages: round2, tools: TOOLS });
    assert.ok(r2.usage.prompt_tokens > r1.usage.prompt_tokens + 15, "round 2 renders the call and its result");

    const calls3 = [
        { id: "call_b1", type: "function", function: { name: "get_time", arguments: '{"tz": "Asia/Tokyo"}' } },
        { id: "call_b2", type: "function", function: { name: "get_weather", arguments: '{"city": "Tōkyō", "unit": "celsius"}' } }];
    const round3 = [...round2, { role: "assistant", content: "Paris is clear. Now Tokyo.", tool_calls: calls3 },
        { role: "tool", tool_call_id: "call_b1", content: "09:30" },
        { role: "tool", tool_call_id: "call_b2", content: '{"temperature": 12}' },
        { role: "user", content: "Thanks! Summarize." }];
    const r3 = await ask({ ...base1, messages: round3, tools: TOOLS, max_tokens: 12 });
    assert.ok(r3.usage.prompt_tokens > r2.usage.prompt_tokens + 30);
    const s3 = await askStream({ ...base1, messages: round3, tools: TOOLS, max_tokens: 12 });
    const m3 = r3.choices[0].message;
    assert.equal(s3.content, m3.content ?? "");
    assert.deepEqual(s3.calls, m3.tool_calls ?? []);
    assert.equal(s3.finish, r3.choices[0].finish_reason);
    const { prompt_tokens_details: _a, ...u1 } = s3.usage, { prompt_tokens_details: _b, ...u2 } = r3.usage;
    assert.deepEqual(u1, u2); // cached_tokens differ: the later request hits the prefix cache

    // a bad assistant call is refused with the field named
    await assert.rejects(ask({ ...base1, tools: TOOLS, messages: [user, { role: "assistant", tool_calls: [{ type: "function",
        function: { arguments: "{}" } }] }] }), (e) => e.status === 400 && e.param === "messages[1].tool_calls[0]");
});

test("reasoning: thinking on puts the text before </think> into reasoning_content, streamed the same", async () => {
    for (const seed of [1, 2, 3]) {
        const p = { model: MODEL, messages: [user], tools: TOOLS, max_tokens: 10, temperature: 2, seed, logprobs: true,
            chat_template_kwargs: { enable_thinking: true } };
        const r = await ask(p);
        const m = r.choices[0].message;
        const raw = r.choices[0].logprobs.content.map((t) => t.token).join("");
        assert.equal(typeof m.reasoning_content, "string");
        const rt = r.usage.completion_tokens_details.reasoning_tokens; // the tokens whose text went to reasoning
        assert.ok(rt <= r.usage.completion_tokens && (!m.reasoning_content || rt > 0), `reasoning_tokens ${rt}`);
        if (!raw.includes("</think>") && !raw.includes("<tool_call>")) { // all reasoning: newlines at its ends dropped
            assert.equal(m.reasoning_content, raw.replace(/^<think>/, "").replace(/^\n+|\n+$/g, ""), JSON.stringify(raw));
            assert.equal(m.content, "");
        }
        const s = await askStream(p);
        assert.equal(s.reasoning, m.reasoning_content);
        assert.equal(s.content, m.content ?? "");
    }
});

// The guided requests: seeds 1..N; each answer is either a complete call (finish tool_calls) or, when max_tokens cut
// the call, its text as content (finish length). At least one must complete: the random model closes a string only
// by chance, so '"' (id 1 in Qwen3's vocabulary) gets a logit bias of 8.
async function guided(choice, names, n) {
    const done = [];
    for (let seed = 1; seed <= n; seed++) {
        const p = { model: MODEL, messages: [user], tools: TOOLS, tool_choice: choice, max_tokens: 40, temperature: 1,
            seed, logit_bias: { 1: 8 }, ...NO_THINK };
        const r = await ask(p);
        const c = r.choices[0], m = c.message;
        if (c.finish_reason === "tool_calls") {
            assert.ok(m.tool_calls.length >= 1);
            if (typeof choice === "object") assert.equal(m.tool_calls.length, 1, "a named function: one call");
            checkCalls(m.tool_calls, names);
            assert.equal(m.content, null);
            done.push({ params: p, r });
        } else {
            assert.equal(c.finish_reason, "length", JSON.stringify(r));
            assert.ok(m.content.startsWith("<tool_call>\n"), `unfinished call as content: ${JSON.stringify(m.content)}`);
        }
        const s = await askStream(p);
        assert.equal(s.finish, c.finish_reason);
        assert.deepEqual(s.calls, m.tool_calls ?? []);
        assert.equal(s.content, m.content ?? "");
        assert.equal(s.usage.completion_tokens, r.usage.completion_tokens);
    }
    assert.ok(done.length >= 1, `no complete call in ${n} seeds`);
    return done;
}

test("tool_choice named function: the guide forces one well-formed call of that function", async () => {
    const done = await guided({ type: "function", function: { name: "get_time" } }, ["get_time"], 4);
    // stop strings apply to content only: "{" and "tz" are in the call's JSON text and do not cut it
    const r = await ask({ ...done[0].params, stop: ["{", "tz"] });
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.deepEqual(r.choices[0].message.tool_calls, done[0].r.choices[0].message.tool_calls);
});

test("tool_choice required: calls of the listed functions only", async () => {
    await guided("required", ["get_weather", "get_time"], 4);
});

test("tools are rendered with their numbers as the client wrote them (a Python client sends 1.0, tojson keeps it)", async () => {
    // a raw body: JSON.stringify (the npm client's) would write 1.0 as 1
    const body = `{"model": "${MODEL}", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "number",
        "default": 1.0, "maximum": 1e100, "minimum": -0.50}, "n": {"type": "integer",
        "maximum": 12345678901234567890}}}}}]}`;
    const post = async (path, b) => (await fetch(base + path, { method: "POST", body: b,
        headers: { "Content-Type": "application/json" } })).json();
    const t = await post("/tokenize", body);
    assert.ok(Array.isArray(t.tokens), JSON.stringify(t));
    const text = (await post("/detokenize", JSON.stringify({ model: MODEL, tokens: t.tokens }))).prompt;
    for (const lit of ['"default": 1.0', '"maximum": 1e+100', '"minimum": -0.5', '"maximum": 12345678901234567890'])
        assert.ok(text.includes(lit), `${lit} in the rendered prompt: ${text}`);
    // a body with bytes after its JSON value is refused
    const r = await fetch(base + "/v1/chat/completions", { method: "POST", body: body + " x",
        headers: { "Content-Type": "application/json" } });
    assert.equal(r.status, 400);
});

test("tool requests: 400s name the field", async () => {
    const p = { model: MODEL, messages: [user], max_tokens: 4 };
    const bad = async (extra, param) => assert.rejects(client.chat.completions.create({ ...p, ...extra }),
        (e) => e.status === 400 && e.param === param, JSON.stringify(extra));
    await bad({ tool_choice: "required" }, "tool_choice");
    await bad({ tools: TOOLS, tool_choice: "sometimes" }, "tool_choice");
    await bad({ tools: TOOLS, tool_choice: { type: "function", function: { name: "nope" } } }, "tool_choice");
    await bad({ tools: [{ type: "retrieval" }] }, "tools[0]");
    await bad({ tools: [{ type: "function", function: { description: "no name" } }] }, "tools[0]");
    await bad({ messages: [{ role: "user", content: "x", tool_calls: [] }] }, "messages[0].tool_calls");
    await bad({ messages: [user, { role: "tool", content: "1", tool_call_id: 5 }] }, "messages[1].tool_call_id");
    await assert.rejects(client.completions.create({ model: MODEL, prompt: "x", tools: TOOLS }),
        (e) => e.status === 400 && e.param === "tools");
});

// ---- response_format: the reply is sampled under the schema's reader, so it validates whatever the weights ----
const ANSWER = { type: "object", properties: { ok: { type: "boolean" },
    color: { enum: ["red", "green", "blue"] }, tags: { type: "array", items: { enum: ["a", "b"] }, maxItems: 2 } },
required: ["ok", "color"], additionalProperties: false };

test("response_format json_schema: every reply parses and validates; streamed the same", async () => {
    for (let seed = 1; seed <= 3; seed++) {
        const p = { model: MODEL, messages: [user], max_tokens: 200, temperature: 1, seed, ...NO_THINK,
            response_format: { type: "json_schema", json_schema: { name: "answer", schema: ANSWER, strict: true } } };
        const r = await ask(p);
        const c = r.choices[0];
        assert.equal(c.finish_reason, "stop", JSON.stringify(r));
        check(JSON.parse(c.message.content), ANSWER);
        assert.equal(c.message.tool_calls, undefined);
        const s = await askStream(p);
        assert.equal(s.content, c.message.content);
        assert.equal(s.finish, "stop");
        assert.equal(s.usage.completion_tokens, r.usage.completion_tokens);
    }
    // tools in auto mode do not turn the reply into calls
    const r = await ask({ model: MODEL, messages: [user], tools: TOOLS, max_tokens: 200, seed: 7, ...NO_THINK,
        response_format: { type: "json_schema", json_schema: { name: "answer", schema: ANSWER } } });
    check(JSON.parse(r.choices[0].message.content), ANSWER);
});

// a json_object reply: it opens an object, and when it stops (not at max_tokens) it is one
function objectReply(r) {
    const c = r.choices[0];
    assert.match(c.message.content, /^\s*\{/, JSON.stringify(r));
    if (c.finish_reason === "stop") {
        const v = JSON.parse(c.message.content);
        assert.ok(v !== null && typeof v === "object" && !Array.isArray(v));
    } else assert.equal(c.finish_reason, "length");
}

test("response_format json_object: the reply opens an object; when it stops, it is one", async () => {
    for (let seed = 1; seed <= 3; seed++) {
        const r = await ask({ model: MODEL, messages: [user], max_tokens: 48, temperature: 1, seed, ...NO_THINK,
            response_format: { type: "json_object" } });
        objectReply(r);
    }
    // logprobs of guided tokens: one entry per token, of the raw row (the guide may pick below the row's best)
    const r = await ask({ model: MODEL, messages: [user], max_tokens: 12, temperature: 1, seed: 1, ...NO_THINK,
        response_format: { type: "json_object" }, logprobs: true, top_logprobs: 2 });
    const lp = r.choices[0].logprobs.content;
    assert.equal(lp.length, r.usage.completion_tokens);
    for (const t of lp) {
        assert.equal(t.top_logprobs.length, 2);
        assert.ok(t.logprob <= t.top_logprobs[0].logprob + 1e-6 && t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob);
        const same = t.top_logprobs.find((x) => x.token === t.token);
        if (same) assert.ok(Math.abs(same.logprob - t.logprob) < 1e-6);
    }
});

test("response_format with penalties: the guided tokens take them (greedy: another reply), still valid", async () => {
    const p = { model: MODEL, messages: [user], max_tokens: 200, temperature: 0, ...NO_THINK,
        response_format: { type: "json_schema", json_schema: { name: "answer", schema: ANSWER, strict: true } } };
    const plain = (await ask(p)).choices[0].message.content;
    assert.equal((await ask({ ...p, repetition_penalty: 1, presence_penalty: 0 })).choices[0].message.content, plain);
    for (const pen of [{ repetition_penalty: 100 }, { frequency_penalty: 2, presence_penalty: 2 }]) {
        const c = (await ask({ ...p, ...pen })).choices[0];
        check(JSON.parse(c.message.content), ANSWER);
        assert.notEqual(c.message.content, plain, JSON.stringify(pen));
    }
});

test("response_format with stop_token_ids: a request's stop id ends the reply only where it may end", async () => {
    const brace = require("node:child_process").execFileSync(process.env.QWEN35_BIN, ["tokenize", "--model",
        process.env.SERVE_MODEL, "--text", "{"]).toString().trim().split(/\s+/).map(Number);
    assert.equal(brace.length, 1);
    // "{" favoured and a stop id: never drawn as the object's opening text, only once the object is complete
    for (let seed = 1; seed <= 2; seed++) {
        const r = await ask({ model: MODEL, messages: [user], max_tokens: 48, temperature: 1, seed, ...NO_THINK,
            response_format: { type: "json_object" }, stop_token_ids: brace, logit_bias: { [brace[0]]: 100 } });
        objectReply(r);
    }
});

test("response_format on /v1/completions: an enum schema gives one of its values", async () => {
    for (let seed = 1; seed <= 3; seed++) {
        const r = await client.completions.create({ model: MODEL, prompt: "Answer:", max_tokens: 16, seed,
            temperature: 1, response_format: { type: "json_schema", json_schema: { name: "yn",
                schema: { enum: ["yes", "no", 42] } } } });
        assert.equal(r.choices[0].finish_reason, "stop");
        assert.ok(["yes", "no", 42].includes(JSON.parse(r.choices[0].text)), r.choices[0].text);
    }
});

test("response_format: 400s name the field", async () => {
    const p = { model: MODEL, messages: [user], max_tokens: 4 };
    const bad = async (extra, param, msg) => assert.rejects(client.chat.completions.create({ ...p, ...extra }),
        (e) => e.status === 400 && e.param === param && (!msg || e.message.includes(msg)), JSON.stringify(extra));
    await bad({ response_format: "json" }, "response_format");
    await bad({ response_format: { type: "xml" } }, "response_format.type");
    await bad({ response_format: { type: "json_schema" } }, "response_format.json_schema");
    await bad({ response_format: { type: "json_schema", json_schema: { name: "x", schema: 3 } } },
        "response_format.json_schema.schema");
    await bad({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string",
        pattern: "^a" } } } }, "response_format", "'pattern' is not supported");
    await bad({ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "object",
        properties: { n: { type: "integer", minimum: 0 } } } } } }, "response_format", "properties.n: 'minimum'");
    await bad({ tools: TOOLS, tool_choice: "required", response_format: { type: "json_object" } }, "response_format");
    const ok = await ask({ ...p, response_format: { type: "text" } });
    assert.equal(ok.choices[0].finish_reason, "length");
});

test("parallel_tool_calls false: one call, and the reply ends with it", async () => {
    // greedy, with logit_bias steering the random model: "{}" / " {}" close the arguments at once, the stop ids are
    // banned, so after a call the guide leaves only another call: parallel replies run to max_tokens with several
    const ids = (t) => require("node:child_process").execFileSync(process.env.QWEN35_BIN,
        ["tokenize", "--model", process.env.SERVE_MODEL, "--text", t]).toString().trim().split(/\s+/).map(Number);
    const bias = {};
    for (const t of ["{}", " {}"]) bias[ids(t)[0]] = 100;
    for (const t of ["<|im_end|>", "<|endoftext|>"]) bias[ids(t)[0]] = -100;
    const p = { model: MODEL, messages: [user], tool_choice: "required", max_tokens: 80, temperature: 0, seed: 3,
        logit_bias: bias, ...NO_THINK, tools: [{ type: "function", function: { name: "ping",
            parameters: { type: "object", properties: {} } } }] };
    const many = await ask(p);
    assert.equal(many.choices[0].finish_reason, "length");
    assert.ok(many.choices[0].message.tool_calls.length >= 2, JSON.stringify(many.choices[0].message));
    const one = await ask({ ...p, parallel_tool_calls: false });
    const c = one.choices[0];
    assert.equal(c.finish_reason, "tool_calls");
    assert.deepEqual(c.message.tool_calls.map((t) => t.function), [many.choices[0].message.tool_calls[0].function]);
    assert.equal(c.message.content, null);
    assert.ok(one.usage.completion_tokens < 40, `ended with the call: ${one.usage.completion_tokens} tokens`);
    const s = await askStream({ ...p, parallel_tool_calls: false });
    assert.deepEqual(s.calls, c.message.tool_calls);
    assert.equal(s.finish, "tool_calls");
    assert.equal(s.usage.completion_tokens, one.usage.completion_tokens);
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [user], max_tokens: 2,
        parallel_tool_calls: "no" }), (e) => e.status === 400 && e.param === "parallel_tool_calls");
});
