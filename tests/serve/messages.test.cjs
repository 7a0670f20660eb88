// messages.test.cjs — POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API) through
// `qwen35 serve` with Anthropic's official `@anthropic-ai/sdk` npm client (started by tests/serve/run.sh). The server
// runs a Messages request as the equivalent chat request, so each check pairs the two on one server
// (deterministic): the same conversation gives the same prompt tokens and, with the same seed, the same output.
// Streams go through the client's own messages.stream(), whose final message must equal the non-streamed one.
const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const server = require("./server.cjs");
const OpenAI = require(process.env.OPENAI_DIR + "/node_modules/openai").default;
const Anthropic = require(process.env.ANTHROPIC_DIR + "/node_modules/@anthropic-ai/sdk").default;

const MODEL = "serve-model";
const KEY = "messages-key";
let srv, base, ant, oai;

before(async () => {
    srv = await server.start(["--api-key", KEY]);
    base = `http://127.0.0.1:${srv.port}`;
    ant = new Anthropic({ apiKey: KEY, baseURL: base, maxRetries: 0 }); // sends x-api-key
    oai = new OpenAI({ apiKey: KEY, baseURL: base + "/v1", maxRetries: 0 });
});

after(async () => assert.equal(await server.stop(srv), 0, "SIGTERM: exit status 0"));

const TOOLS = [
    { name: "get_weather", description: "Current weather of a city.",
        input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
    { name: "get_time", description: "Local time in a time zone.",
        input_schema: { type: "object", properties: { tz: { type: "string" } }, required: ["tz"] } },
];
const CHAT_TOOLS = TOOLS.map(({ name, description, input_schema }) =>
    ({ type: "function", function: { name, description, parameters: input_schema } }));
const QUESTION = server.QUESTION;
const STOP = { end_turn: "stop", max_tokens: "length", tool_use: "tool_calls", stop_sequence: "stop" };

// The message object's documented shape (https://docs.anthropic.com/en/api/messages), the parts this server fills.
function checkMessage(m) {
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.match(m.id, /^msg_/);
    assert.equal(m.model, MODEL);
    assert.ok(["end_turn", "max_tokens", "tool_use", "stop_sequence"].includes(m.stop_reason), m.stop_reason);
    assert.equal(m.stop_sequence === null, m.stop_reason !== "stop_sequence");
    assert.ok(m.content.length >= 1);
    for (const b of m.content) {
        if (b.type === "text") assert.equal(typeof b.text, "string");
        else if (b.type === "thinking") assert.equal(typeof b.thinking, "string");
        else {
            assert.equal(b.type, "tool_use");
            assert.match(b.id, /^call_[0-9a-f]{24}$/);
            assert.ok(b.input !== null && typeof b.input === "object" && !Array.isArray(b.input));
        }
    }
    for (const k of ["input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"])
        assert.equal(typeof m.usage[k], "number", k);
}

// The stream of params through the client's accumulator; its final message and the event types.
async function streamed(params) {
    const stream = ant.messages.stream(params);
    const types = [];
    stream.on("streamEvent", (ev) => types.push(ev.type));
    const final = await stream.finalMessage();
    assert.equal(types[0], "message_start");
    assert.deepEqual(types.slice(-2), ["message_delta", "message_stop"]);
    return { final, types };
}
// A message without its id, the client's own additions to a streamed one, and the prompt's split between cached and
// not (the prefix cache serves a repeated prompt)
const body = ({ id, parsed_output, stop_details, usage: { cache_read_input_tokens: _, input_tokens: __, ...u }, ...m }) =>
    ({ ...m, u });

test("text: the chat request's tokens; streamed, the same message", async () => {
    const p = { model: MODEL, max_tokens: 12, temperature: 1, top_k: 40, seed: 3, system: "Be brief.",
        messages: [{ role: "user", content: QUESTION }], thinking: { type: "disabled" } };
    const m = await ant.messages.create(p);
    checkMessage(m);
    const c = await oai.chat.completions.create({ model: MODEL, max_tokens: 12, temperature: 1, top_k: 40, seed: 3,
        messages: [{ role: "system", content: "Be brief." }, { role: "user", content: QUESTION }],
        chat_template_kwargs: { enable_thinking: false } });
    assert.equal(m.content.map((b) => b.text).join(""), c.choices[0].message.content);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, c.usage.prompt_tokens);
    assert.equal(m.usage.output_tokens, c.usage.completion_tokens);
    assert.equal(STOP[m.stop_reason], c.choices[0].finish_reason);
    const { final, types } = await streamed(p);
    checkMessage(final);
    assert.deepEqual(body(final), body(m));
    assert.ok(types.includes("content_block_start") && types.includes("content_block_stop"));
    const n = await ant.messages.countTokens({ model: MODEL, system: "Be brief.", messages: p.messages,
        thinking: { type: "disabled" } });
    assert.equal(n.input_tokens, c.usage.prompt_tokens);
});

test("a tool conversation (thinking, tool_use, tool_result blocks) renders as the chat messages do", async () => {
    const messages = [
        { role: "user", content: QUESTION },
        { role: "assistant", content: [
            { type: "thinking", thinking: "Weather first.", signature: "x" },
            { type: "tool_use", id: "call_a1", name: "get_weather", input: { city: "Paris" } },
            { type: "tool_use", id: "call_a2", name: "get_time", input: { tz: "Asia/Tokyo" } }] },
        { role: "user", content: [
            { type: "tool_result", tool_use_id: "call_a1", content: '{"temperature": 21}' },
            { type: "tool_result", tool_use_id: "call_a2", content: [{ type: "text", text: "09:30" }] },
            { type: "text", text: "Thanks!" }] },
    ];
    const chat = [...server.TOOL_ROUND, { role: "user", content: "Thanks!" }];
    const m = await ant.messages.create({ model: MODEL, max_tokens: 8, temperature: 1, seed: 9, messages, tools: TOOLS,
        thinking: { type: "disabled" } });
    checkMessage(m);
    const c = await oai.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 1, seed: 9, messages: chat,
        tools: CHAT_TOOLS, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, c.usage.prompt_tokens);
    assert.ok(c.usage.prompt_tokens > 150, "the tools, the calls and their results are in the prompt");
    const n = await ant.messages.countTokens({ model: MODEL, messages, tools: TOOLS, thinking: { type: "disabled" } });
    assert.equal(n.input_tokens, c.usage.prompt_tokens);
});

test("tool_choice any / tool: tool_use blocks with input objects; streamed the same", async () => {
    let complete = 0;
    for (let seed = 1; seed <= 4; seed++) {
        // '"' (id 1) gets a bias so that the random model closes the call's strings (see tools.test.cjs)
        const p = { model: MODEL, max_tokens: 40, temperature: 1, seed, logit_bias: { 1: 8 }, tools: TOOLS,
            tool_choice: { type: "any" }, messages: [{ role: "user", content: QUESTION }],
            thinking: { type: "disabled" } };
        const m = await ant.messages.create(p);
        checkMessage(m);
        const uses = m.content.filter((b) => b.type === "tool_use");
        if (m.stop_reason === "tool_use") {
            assert.ok(uses.length >= 1);
            for (const u of uses) assert.ok(["get_weather", "get_time"].includes(u.name));
            complete++;
        }
        const { final } = await streamed(p);
        assert.deepEqual(body(final), body(m));
        const c = await oai.chat.completions.create({ model: MODEL, max_tokens: 40, temperature: 1, seed,
            logit_bias: { 1: 8 }, tools: CHAT_TOOLS, tool_choice: "required",
            messages: [{ role: "user", content: QUESTION }], chat_template_kwargs: { enable_thinking: false } });
        assert.deepEqual(uses.map((u) => [u.id, u.name, u.input]), (c.choices[0].message.tool_calls ?? []).map((k) =>
            [k.id, k.function.name, JSON.parse(k.function.arguments)]));
    }
    assert.ok(complete >= 1, "no complete call in 4 seeds");
    const named = await ant.messages.create({ model: MODEL, max_tokens: 40, temperature: 1, seed: 2,
        logit_bias: { 1: 8 }, tools: TOOLS, tool_choice: { type: "tool", name: "get_time" },
        messages: [{ role: "user", content: QUESTION }] });
    for (const u of named.content.filter((b) => b.type === "tool_use")) assert.equal(u.name, "get_time");
});

test("stop_sequences: stop_reason stop_sequence names the one that matched, its text not returned", async () => {
    const p = { model: MODEL, max_tokens: 16, messages: [{ role: "user", content: QUESTION }],
        thinking: { type: "disabled" }, logit_bias: { 198: -100, 271: -100 } }; // no newlines: a stop to find
    const whole = (await ant.messages.create(p)).content[0].text;
    assert.ok(whole.length >= 4, JSON.stringify(whole));
    const stop = whole.slice(2, 4);
    const m = await ant.messages.create({ ...p, stop_sequences: ["never-there", stop] });
    checkMessage(m);
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, whole.slice(0, whole.indexOf(stop)));
    const { final } = await streamed({ ...p, stop_sequences: ["never-there", stop] });
    assert.deepEqual(body(final), body(m));
});

test("thinking enabled: a thinking block first, as the chat's reasoning_content", async () => {
    let seen = 0;
    for (const seed of [1, 2]) {
        // newlines (ids 198, 271) banned: the random model repeats them, and newlines at the reasoning's ends drop
        const p = { model: MODEL, max_tokens: 10, temperature: 2, seed, logit_bias: { 198: -100, 271: -100 },
            messages: [{ role: "user", content: QUESTION }], thinking: { type: "enabled", budget_tokens: 1024 } };
        const m = await ant.messages.create(p);
        checkMessage(m);
        const c = await oai.chat.completions.create({ model: MODEL, max_tokens: 10, temperature: 2, seed,
            logit_bias: { 198: -100, 271: -100 }, messages: p.messages, chat_template_kwargs: { enable_thinking: true } });
        const th = m.content.find((b) => b.type === "thinking");
        assert.equal(th ? th.thinking : "", c.choices[0].message.reasoning_content ?? "");
        if (th) {
            seen++;
            assert.equal(m.content[0], th);
        }
        const { final } = await streamed(p);
        assert.deepEqual(body(final), body(m));
    }
    assert.ok(seen >= 1, "some thinking came out");
});

test("errors: Anthropic's error objects, the fields named", async () => {
    const bad = (extra, what) => assert.rejects(ant.messages.create({ model: MODEL, max_tokens: 4,
        messages: [{ role: "user", content: "x" }], ...extra }), (e) => e.status === 400 &&
        e.error.type === "error" && e.error.error.type === "invalid_request_error" && e.error.error.message.includes(what), what);
    await bad({ messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png",
        data: "AA==" } }] }] }, "messages[0].content[0]");
    await bad({ tools: [{ type: "web_search_20250305", name: "web_search" }] }, "tools[0]");
    await bad({ messages: [{ role: "system", content: "x" }] }, "messages[0].role");
    await bad({ stop_sequences: "x" }, "stop_sequences");
    await bad({ thinking: { type: "sometimes" } }, "thinking");
    await assert.rejects(ant.messages.create({ model: MODEL, messages: [{ role: "user", content: "x" }] }),
        (e) => e.status === 400 && e.error.error.message.includes("max_tokens"));
    await assert.rejects(ant.messages.create({ model: "claude-x", max_tokens: 4, messages: [{ role: "user",
        content: "x" }] }), (e) => e.status === 404 && e.error.error.type === "not_found_error");
    const wrong = new Anthropic({ apiKey: "wrong", baseURL: base, maxRetries: 0 });
    await assert.rejects(wrong.messages.create({ model: MODEL, max_tokens: 4, messages: [{ role: "user",
        content: "x" }] }), (e) => e.status === 401 && e.error.error.type === "authentication_error");
});
