// responses.test.cjs — POST /v1/responses (OpenAI's Responses API) through `qwen35 serve` with the official `openai`
// npm client (started by tests/serve/run.sh). The server runs a Responses request as the equivalent chat request, so
// each check pairs the two: the same conversation gives the same prompt tokens and (deterministic mode, same seed)
// the same output. Streams go through the client's own responses.stream(), whose accumulator refuses events out of
// order, items or parts it has not seen added, and ids that do not match; its final response must equal the
// non-streamed one.
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

const TOOLS = [
    { type: "function", name: "get_weather", description: "Current weather of a city.",
        parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
    { type: "function", name: "get_time", description: "Local time in a time zone.",
        parameters: { type: "object", properties: { tz: { type: "string" } }, required: ["tz"] } },
];
const CHAT_TOOLS = TOOLS.map(({ type, ...f }) => ({ type, function: f }));
const QUESTION = server.QUESTION;

// The response object's documented shape (https://platform.openai.com/docs/api-reference/responses/object), the
// parts this server fills.
function checkResponse(r) {
    assert.equal(r.object, "response");
    assert.match(r.id, /^resp_/);
    assert.ok(["completed", "incomplete"].includes(r.status), r.status);
    assert.equal(r.error, null);
    assert.deepEqual(r.incomplete_details, r.status === "incomplete" ? { reason: "max_output_tokens" } : null);
    assert.equal(r.model, MODEL);
    assert.equal(typeof r.created_at, "number");
    assert.ok(Array.isArray(r.output) && r.output.length >= 1);
    const ids = new Set();
    for (const it of r.output) {
        assert.ok(!ids.has(it.id), "item ids are unique");
        ids.add(it.id);
        assert.ok(["completed", "incomplete"].includes(it.status));
        if (it.type === "message") {
            assert.match(it.id, /^msg_/);
            assert.equal(it.role, "assistant");
            assert.equal(it.content.length, 1);
            assert.equal(it.content[0].type, "output_text");
            assert.deepEqual(it.content[0].annotations, []);
        } else if (it.type === "reasoning") {
            assert.match(it.id, /^rs_/);
            assert.equal(it.content[0].type, "reasoning_text");
        } else {
            assert.equal(it.type, "function_call");
            assert.match(it.id, /^fc_/);
            assert.match(it.call_id, /^call_[0-9a-f]{24}$/);
            const a = JSON.parse(it.arguments);
            assert.ok(a !== null && typeof a === "object" && !Array.isArray(a), it.arguments);
        }
    }
    const u = r.usage;
    assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
    assert.equal(typeof u.input_tokens_details.cached_tokens, "number");
    assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
}

// The stream of params through the client's accumulator; returns its final response and the event types.
async function streamed(params) {
    const stream = client.responses.stream(params);
    const types = [];
    let seq = 0;
    for await (const ev of stream) {
        assert.equal(ev.sequence_number, seq++, "sequence numbers count up from 0");
        types.push(ev.type);
    }
    const final = await stream.finalResponse();
    assert.deepEqual(types.slice(0, 2), ["response.created", "response.in_progress"]);
    assert.equal(types.at(-1), `response.${final.status}`);
    return { final, types };
}

// The output items without their ids (which carry the response's own id) and the client's own additions.
const items = (r) => r.output.map(({ id, parsed_arguments, ...rest }) =>
    rest.content ? { ...rest, content: rest.content.map(({ parsed, ...p }) => p) } : rest);
const usage = ({ input_tokens_details: _, ...u }) => u; // cached_tokens depend on what ran before

test("text in, a message out; streamed: the same response, event by event", async () => {
    const p = { model: MODEL, input: QUESTION, max_output_tokens: 12, temperature: 1, seed: 3,
        reasoning: { effort: "none" } };
    const r = await client.responses.create(p);
    checkResponse(r);
    assert.equal(r.output.at(-1).type, "message");
    assert.equal(r.output_text, r.output.at(-1).content[0].text); // the client's own join of the text parts
    assert.equal(r.max_output_tokens, 12);
    assert.equal(r.usage.output_tokens_details.reasoning_tokens, 0, "thinking off");
    const { final, types } = await streamed(p);
    checkResponse(final);
    assert.deepEqual(items(final), items(r));
    assert.deepEqual(usage(final.usage), usage(r.usage));
    assert.equal(final.output_text, r.output_text);
    assert.ok(types.includes("response.output_text.delta") || r.output_text === "");
    for (const t of ["response.output_item.added", "response.content_part.added", "response.output_text.done",
        "response.content_part.done", "response.output_item.done"])
        assert.ok(types.includes(t), t);
    // the chat request it stands for gives the same tokens
    const c = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: QUESTION }],
        max_tokens: 12, temperature: 1, seed: 3, chat_template_kwargs: { enable_thinking: false } });
    assert.equal(r.output_text, c.choices[0].message.content);
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    assert.equal(r.status, c.choices[0].finish_reason === "length" ? "incomplete" : "completed");
});

test("a tool conversation as input items renders as the chat messages do", async () => {
    const input = [
        { role: "user", content: [{ type: "input_text", text: QUESTION }] },
        { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "Weather first." }] },
        { type: "function_call", call_id: "call_a1", name: "get_weather", arguments: '{"city": "Paris"}' },
        { type: "function_call", call_id: "call_a2", name: "get_time", arguments: '{"tz": "Asia/Tokyo"}' },
        { type: "function_call_output", call_id: "call_a1", output: '{"temperature": 21}' },
        { type: "function_call_output", call_id: "call_a2", output: [{ type: "input_text", text: "09:30" }] },
        { role: "assistant", content: [{ type: "output_text", text: "Clear, 21 degrees; 09:30 in Tokyo." }] },
        { role: "user", content: "Thanks!" },
    ];
    const messages = [{ role: "system", content: "Be brief." }, ...server.TOOL_ROUND,
        { role: "assistant", content: "Clear, 21 degrees; 09:30 in Tokyo." }, { role: "user", content: "Thanks!" }];
    const common = { model: MODEL, temperature: 1, seed: 9 };
    const r = await client.responses.create({ ...common, instructions: "Be brief.", input, tools: TOOLS,
        max_output_tokens: 8, reasoning: { effort: "minimal" } });
    checkResponse(r);
    const c = await client.chat.completions.create({ ...common, messages, tools: CHAT_TOOLS, max_tokens: 8,
        chat_template_kwargs: { enable_thinking: false } });
    assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
    assert.ok(r.usage.input_tokens > 150, "the tools, the calls and their results are in the prompt");
    assert.equal(r.output_text, c.choices[0].message.content ?? "");
    // the echoed settings
    assert.equal(r.instructions, "Be brief.");
    assert.deepEqual(r.tools, TOOLS);
    assert.equal(r.tool_choice, "auto");
});

test("tool_choice required: function_call items; streamed the same", async () => {
    let complete = 0;
    for (let seed = 1; seed <= 4; seed++) {
        // '"' (id 1) gets a bias so that the random model closes the call's strings (see tools.test.cjs)
        const p = { model: MODEL, input: QUESTION, tools: TOOLS, tool_choice: "required", max_output_tokens: 40,
            temperature: 1, seed, logit_bias: { 1: 8 }, reasoning: { effort: "none" } };
        const r = await client.responses.create(p);
        checkResponse(r);
        const calls = r.output.filter((it) => it.type === "function_call");
        if (r.status === "completed") {
            assert.ok(calls.length >= 1, JSON.stringify(r.output));
            for (const k of calls) assert.ok(["get_weather", "get_time"].includes(k.name));
            complete++;
        }
        const { final, types } = await streamed(p);
        assert.deepEqual(items(final), items(r));
        if (calls.length) assert.ok(types.includes("response.function_call_arguments.delta"));
        // the chat request's calls are the same
        const c = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: QUESTION }],
            tools: CHAT_TOOLS, tool_choice: "required", max_tokens: 40, temperature: 1, seed, logit_bias: { 1: 8 },
            chat_template_kwargs: { enable_thinking: false } });
        assert.deepEqual(calls.map((k) => [k.call_id, k.name, k.arguments]),
            (c.choices[0].message.tool_calls ?? []).map((k) => [k.id, k.function.name, k.function.arguments]));
    }
    assert.ok(complete >= 1, "no complete call in 4 seeds");
    const named = await client.responses.create({ model: MODEL, input: QUESTION, tools: TOOLS, max_output_tokens: 40,
        tool_choice: { type: "function", name: "get_time" }, temperature: 1, seed: 2, logit_bias: { 1: 8 } });
    for (const k of named.output.filter((it) => it.type === "function_call")) assert.equal(k.name, "get_time");
});

test("reasoning effort on: a reasoning item first, its tokens counted, as the chat's reasoning_content", async () => {
    // newlines (ids 198, 271) banned: the random model repeats them, and newlines at the reasoning's ends are dropped
    const common = { model: MODEL, max_output_tokens: 10, temperature: 2, logit_bias: { 198: -100, 271: -100 } };
    let seen = 0;
    for (const seed of [1, 2]) {
        const p = { ...common, input: QUESTION, seed, reasoning: { effort: "high" } };
        const r = await client.responses.create(p);
        checkResponse(r);
        const { max_output_tokens, ...chat } = common;
        const c = await client.chat.completions.create({ ...chat, messages: [{ role: "user", content: QUESTION }],
            max_tokens: 10, seed, chat_template_kwargs: { enable_thinking: true } });
        const m = c.choices[0].message;
        const rs = r.output.find((it) => it.type === "reasoning");
        assert.equal(rs ? rs.content[0].text : "", m.reasoning_content ?? "");
        if (rs) {
            seen++;
            assert.equal(r.output[0], rs, "the reasoning item comes first");
            assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
            assert.equal(rs.status, r.output.length === 1 && r.status === "incomplete" ? "incomplete" : "completed");
        }
        assert.equal(r.output_text, m.content ?? "");
        const { final, types } = await streamed(p);
        assert.deepEqual(items(final), items(r));
        assert.deepEqual(usage(final.usage), usage(r.usage));
        if (rs) assert.ok(types.includes("response.reasoning_text.delta"));
    }
    assert.ok(seen >= 1, "some reasoning came out");
});

test("logprobs (include message.output_text.logprobs): the text tokens' entries, as the chat's; streamed the same", async () => {
    const p = { model: MODEL, input: QUESTION, max_output_tokens: 10, temperature: 1, seed: 4, top_logprobs: 3,
        include: ["message.output_text.logprobs"], reasoning: { effort: "none" } };
    const r = await client.responses.create(p);
    checkResponse(r);
    assert.equal(r.top_logprobs, 3);
    const part = r.output.at(-1).content[0];
    const c = await client.chat.completions.create({ model: MODEL, messages: [{ role: "user", content: QUESTION }],
        max_tokens: 10, temperature: 1, seed: 4, logprobs: true, top_logprobs: 3,
        chat_template_kwargs: { enable_thinking: false } });
    // thinking off, no tools: every generated token is text, so the entries are the chat's one for one
    assert.deepEqual(part.logprobs, c.choices[0].logprobs.content);
    assert.equal(part.logprobs.length, r.usage.output_tokens);
    for (const t of part.logprobs) {
        assert.equal(t.top_logprobs.length, 3);
        assert.deepEqual(t.bytes, [...Buffer.from(t.token, "utf8")]);
    }
    const { final } = await streamed(p);
    assert.deepEqual(final.output.at(-1).content[0].logprobs, part.logprobs);
    // without the include: none
    const { include, ...plain } = p;
    assert.deepEqual((await client.responses.create(plain)).output.at(-1).content[0].logprobs, []);
    // with thinking: the reasoning's tokens are not the text's
    const t = await client.responses.create({ ...p, reasoning: { effort: "high" }, temperature: 2,
        logit_bias: { 198: -100, 271: -100 } });
    const rs = t.output.find((it) => it.type === "reasoning"), msg = t.output.find((it) => it.type === "message");
    if (rs) assert.ok((msg ? msg.content[0].logprobs.length : 0) < t.usage.output_tokens);
});

test("text.format json_schema: the reply validates", async () => {
    const schema = { type: "object", properties: { ok: { type: "boolean" }, color: { enum: ["red", "blue"] } },
        required: ["ok", "color"], additionalProperties: false };
    for (let seed = 1; seed <= 2; seed++) {
        const r = await client.responses.create({ model: MODEL, input: QUESTION, max_output_tokens: 100,
            temperature: 1, seed, text: { format: { type: "json_schema", name: "answer", schema, strict: true } } });
        checkResponse(r);
        assert.equal(r.status, "completed");
        const v = JSON.parse(r.output_text);
        assert.equal(typeof v.ok, "boolean");
        assert.ok(["red", "blue"].includes(v.color));
        assert.deepEqual(Object.keys(v).sort(), ["color", "ok"]);
    }
});

test("SIGTERM mid-stream: the stream ends with response.failed, the server exits 0", async () => {
    const own = await server.start([]);
    const res = await fetch(`http://127.0.0.1:${own.port}/v1/responses`, { method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model: MODEL, input: QUESTION, max_output_tokens: 900, stream: true, ignore_eos: true,
            reasoning: { effort: "none" } }) });
    const reader = res.body.getReader(), dec = new TextDecoder();
    let text = "", killed = null;
    for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += dec.decode(value, { stream: true });
        if (!killed && text.includes("response.output_text.delta")) killed = server.stop(own);
    }
    assert.ok(killed, "deltas came before the end");
    assert.equal(await killed, 0);
    const events = text.trim().split("\n\n").map((e) => JSON.parse(e.split("\n").find((l) => l.startsWith("data: ")).slice(6)));
    const last = events.at(-1);
    assert.equal(last.type, "response.failed", JSON.stringify(last).slice(0, 300));
    assert.equal(last.response.status, "failed");
    assert.match(last.response.error.message, /aborted/);
    events.forEach((e, i) => assert.equal(e.sequence_number, i));
});

test("errors name the Responses API's fields", async () => {
    const bad = (extra, param) => assert.rejects(client.responses.create({ model: MODEL, input: "x", ...extra }),
        (e) => e.status === 400 && e.param === param, param);
    await bad({ previous_response_id: "resp_1" }, "previous_response_id");
    await bad({ conversation: "conv_1" }, "conversation");
    await bad({ tools: [{ type: "web_search" }] }, "tools[0]");
    await bad({ input: [{ type: "item_reference", id: "msg_1" }] }, "input[0].type");
    await bad({ input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] }, "input[0].content[0]");
    await bad({ input: [{ type: "function_call", name: "f", arguments: "{}" }] }, "input[0].call_id");
    await bad({ input: [] }, "input");
    await bad({ max_output_tokens: 0 }, "max_output_tokens");
    await bad({ top_logprobs: 21, include: ["message.output_text.logprobs"] }, "top_logprobs");
    await bad({ truncation: "auto" }, "truncation");
    await bad({ text: { format: { type: "xml" } } }, "text.format.type");
    await bad({ tool_choice: "required" }, "tool_choice");
    await assert.rejects(client.responses.create({ model: "other", input: "x" }), (e) => e.status === 404);
});
