#!/bin/sh
# deps.sh — installs the Debian packages qwen35 needs, and nothing else (--no-install-recommends, no upgrades
# of what is installed). The one list of them: `make deps` and .ci/run both call this script.
#   sh scripts/deps.sh            build (gcc, make, the libraries)
#   sh scripts/deps.sh test       + npm when it is missing (scripts/fetch_tokenizer.sh, the tokenizer tests),
#                                 python3-aiohttp (the soak in make test)
#   sh scripts/deps.sh fuzz       + clang (libFuzzer targets: make fuzz)
#   sh scripts/deps.sh all        all of the above
# Groups combine: sh scripts/deps.sh test fuzz. Prints what it installs; exit != 0 when apt-get fails.
set -eu
BUILD_PKGS="make gcc libc6-dev pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libcurl4-openssl-dev libssl-dev libmicrohttpd-dev ca-certificates"
FUZZ_PKGS="clang"
TEST_PKGS="nodejs npm"
SOAK_PKGS="python3-aiohttp" # tests/serve/soak.sh (tools/soak_serve.py)

pkgs="$BUILD_PKGS"
for g in "$@"; do
    case "$g" in
    build) ;;
    test) command -v npm >/dev/null 2>&1 || pkgs="$pkgs $TEST_PKGS"; pkgs="$pkgs $SOAK_PKGS" ;;
    fuzz) pkgs="$pkgs $FUZZ_PKGS" ;;
    all) pkgs="$pkgs $FUZZ_PKGS $SOAK_PKGS"; command -v npm >/dev/null 2>&1 || pkgs="$pkgs $TEST_PKGS" ;;
    *) echo "deps.sh: unknown group '$g' (build, test, fuzz, all)" >&2; exit 2 ;;
    esac
done
# only the packages not installed yet
missing=""
for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && { echo "deps.sh: all installed ($pkgs)"; exit 0; }
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "deps.sh: installing$missing"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
