#!/bin/sh
# run.sh — the serve tests: the official `openai` npm client (installed into .cache/npm-openai, pinned; Anthropic's
# `@anthropic-ai/sdk` into .cache/npm-anthropic for /v1/messages) drives
# BUILD/qwen35 serve on the CPU backend over a real port (node --test tests/serve/serve.test.cjs). The model is
# generated here (BUILD/tests/gen_serve_model: random weights, Qwen3.5 architecture, Qwen3 vocabulary) with the
# tokenizer files of .cache/qwen3-tokenizer (scripts/fetch_tokenizer.sh). No network: one line, skipped.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-build}
command -v node >/dev/null 2>&1 || { echo "serve tests: SKIPPED (node is not installed)"; exit 0; }
# pinned NAME VERSION DIR: the npm package NAME at VERSION in DIR (installed unless it is there); offline: skipped
pinned() {
    if [ ! -f "$3/node_modules/$1/package.json" ] || ! grep -q "\"version\": \"$2\"" "$3/node_modules/$1/package.json"; then
        mkdir -p "$3"
        if ! (cd "$3" && npm install --silent --no-audit --no-fund --no-package-lock --prefix . "$1@$2" \
            >"$3/npm.log" 2>&1); then
            echo "serve tests: SKIPPED (npm install $1@$2 failed, offline? $(tail -n 1 "$3/npm.log"))"
            exit 0
        fi
    fi
}
npmdir="$root/.cache/npm-openai"
pinned openai 7.59.0 "$npmdir"
adir="$root/.cache/npm-anthropic" # Anthropic's client, for /v1/messages (messages.test.cjs)
pinned @anthropic-ai/sdk 1.17.0 "$adir"
tok="$root/.cache/qwen3-tokenizer"
[ -f "$tok/tokenizer.json" ] || { echo "serve tests: FAILED: no $tok/tokenizer.json (scripts/fetch_tokenizer.sh)"; exit 1; }
model="$root/.cache/serve-model"
"$B/tests/gen_serve_model" "$root/tests/fixtures/qwen35_text/config.json" "$model" || exit 1
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$model/"
# the out-of-memory shim (oom.test.cjs), not under a sanitizer: its runtime must come first in the process
fail="$B/tests/failalloc.so"
{ [ -f "$fail" ] && ! ldd "$B/qwen35" | grep -q libasan; } || fail=
FAILALLOC="$fail" QWEN35_BIN="$B/qwen35" SERVE_MODEL="$model" OPENAI_DIR="$npmdir" ANTHROPIC_DIR="$adir" node --test "$root/tests/serve/serve.test.cjs" "$root/tests/serve/limits.test.cjs" \
    "$root/tests/serve/tools.test.cjs" "$root/tests/serve/prefix.test.cjs" "$root/tests/serve/responses.test.cjs" \
    "$root/tests/serve/messages.test.cjs" "$root/tests/serve/oom.test.cjs" "$root/tests/serve/state.test.cjs" "$root/tests/serve/kvcache.test.cjs"
