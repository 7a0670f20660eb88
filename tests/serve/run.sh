#!/bin/sh
# run.sh — the serve tests: the official `openai` npm client (installed into .cache/npm-openai, pinned; Anthropic's
# `@anthropic-ai/sdk` into .cache/npm-anthropic for /v1/messages) drives
# BUILD/qwen35 serve on the CPU backend over a real port (node --test tests/serve/serve.test.cjs). The model is
# generated here (BUILD/tests/gen_serve_model: random weights, Qwen3.5 architecture, Qwen3 vocabulary) with the
# tokenizer files of .cache/qwen3-tokenizer (scripts/fetch_tokenizer.sh). No network: one line, skipped.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
B=${BUILD:-build}
pkg="openai@7.59.0"
npmdir="$root/.cache/npm-openai"
command -v node >/dev/null 2>&1 || { echo "serve tests: SKIPPED (node is not installed)"; exit 0; }
if [ ! -f "$npmdir/node_modules/openai/package.json" ] ||
    ! grep -q '"version": "7.59.0"' "$npmdir/node_modules/openai/package.json"; then
    mkdir -p "$npmdir"
    if ! (cd "$npmdir" && npm install --silent --no-audit --no-fund --no-package-lock --prefix . "$pkg" \
        >"$npmdir/npm.log" 2>&1); then
        echo "serve tests: SKIPPED (npm install $pkg failed, offline? $(tail -n 1 "$npmdir/npm.log"))"
        exit 0
    fi
fi
# Anthropic's official client for /v1/messages (messages.test.cjs), pinned the same way
apkg="@anthropic-ai/sdk@1.17.0"
adir="$root/.cache/npm-anthropic"
if [ ! -f "$adir/node_modules/@anthropic-ai/sdk/package.json" ] ||
    ! grep -q '"version": "1.17.0"' "$adir/node_modules/@anthropic-ai/sdk/package.json"; then
    mkdir -p "$adir"
    if ! (cd "$adir" && npm install --silent --no-audit --no-fund --no-package-lock --prefix . "$apkg" \
        >"$adir/npm.log" 2>&1); then
        echo "serve tests: SKIPPED (npm install $apkg failed, offline? $(tail -n 1 "$adir/npm.log"))"
        exit 0
    fi
fi
tok="$root/.cache/qwen3-tokenizer"
[ -f "$tok/tokenizer.json" ] || { echo "serve tests: FAILED: no $tok/tokenizer.json (scripts/fetch_tokenizer.sh)"; exit 1; }
model="$root/.cache/serve-model"
"$B/tests/gen_serve_model" "$root/tests/fixtures/qwen35_text/config.json" "$model" || exit 1
cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$model/"
QWEN35_BIN="$B/qwen35" SERVE_MODEL="$model" OPENAI_DIR="$npmdir" ANTHROPIC_DIR="$adir" node --test "$root/tests/serve/serve.test.cjs" "$root/tests/serve/limits.test.cjs" \
    "$root/tests/serve/tools.test.cjs" "$root/tests/serve/prefix.test.cjs" "$root/tests/serve/responses.test.cjs" \
    "$root/tests/serve/messages.test.cjs"
