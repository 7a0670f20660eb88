// server.cjs — starts `qwen35 serve` for a test file: the CPU backend on a free port with the test model, the given
// extra arguments and environment variables (env); resolves with the process once it prints its address (its port
// in proc.port, what it printed so far in proc.log). stop() sends SIGTERM and resolves with the exit status.
const { spawn } = require("node:child_process");

function start(extra, env) {
    return new Promise((resolve, reject) => {
        const p = spawn(process.env.QWEN35_BIN, ["serve", "--model", process.env.SERVE_MODEL, "--backend", "cpu",
            "--port", "0", "--ctx", "1024", "--kv-memory", "64M", "--threads", "1", "--deterministic", "--quiet",
            "--max-seqs", "8", ...extra], { stdio: ["ignore", "ignore", "pipe"], env: { ...process.env, ...env } });
        let err = "";
        p.stderr.on("data", (d) => {
            err += d;
            p.log = err;
            const m = err.match(/listening on http:\/\/[^:]+:(\d+)/);
            if (m && !p.port) { p.port = Number(m[1]); resolve(p); }
        });
        p.on("exit", (code) => { if (!p.port) reject(new Error(`server exited ${code}: ${err}`)); });
    });
}

function stop(p) {
    if (!p || p.exitCode !== null) return Promise.resolve(p ? p.exitCode : 0);
    return new Promise((resolve) => { p.on("exit", (c) => resolve(c)); p.kill("SIGTERM"); });
}

// The question of the tool tests, and its first tool round as chat messages (a reasoning, two calls, their results):
// what the Responses and Messages tests' input items and blocks must render as.
const QUESTION = "What is the weather in Paris and the time in Tokyo?";
const TOOL_ROUND = [
    { role: "user", content: QUESTION },
    { role: "assistant", content: "", reasoning_content: "Weather first.", tool_calls: [
        { id: "call_a1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
        { id: "call_a2", type: "function", function: { name: "get_time", arguments: '{"tz": "Asia/Tokyo"}' } }] },
    { role: "tool", tool_call_id: "call_a1", content: '{"temperature": 21}' },
    { role: "tool", tool_call_id: "call_a2", content: "09:30" },
];

module.exports = { start, stop, QUESTION, TOOL_ROUND };
