#!/bin/bash
# SASS of a CUDA source on this machine, which has nvcc 13.0 and ptxas but no disassembler: nvdisasm comes from
# Debian trixie's non-free nvidia-cuda-toolkit 12.4 (downloaded once with a private apt configuration, nothing
# installed, no root needed). That nvdisasm predates CUDA 13's cubin header (ELF OS/ABI 0x41, ABI version 8, the
# SM number in bits 8-15 of e_flags), so the header is rewritten to the older form first (OS/ABI 0x33, ABI 7,
# e_flags sm | 0x500 | sm << 16); the instruction stream is not touched. sm_90a's wgmma (HGMMA / QGMMA), TMA and
# mbarrier (SYNCS.*) instructions disassemble.
#   usage: scripts/sass.sh [--summary] FILE.cu [nvcc flags, e.g. -DQ35_TRACE] > FILE.sass
#          --summary: per kernel, its instructions and the ones that matter for a wgmma kernel (HGMMA / QGMMA,
#          WARPGROUP.DEPBAR waits, BAR, local memory LDL / STL) instead of the listing.
# The tool lands in ${SASS_TOOLS:-$HOME/.cache/qwen35-sass}.
set -eu
cd "$(dirname "$0")/.."
summary=0
[ "${1:-}" = --summary ] && summary=1 && shift
src=${1:?usage: scripts/sass.sh [--summary] FILE.cu [nvcc flags]}
shift
T=${SASS_TOOLS:-$HOME/.cache/qwen35-sass}
DIS=$T/x/usr/bin/nvdisasm
if [ ! -x "$DIS" ]; then
    mkdir -p "$T/lists/partial" "$T/cache/archives/partial" "$T/parts"
    key=/usr/share/keyrings/debian-archive-keyring.gpg
    printf 'deb [signed-by=%s] http://deb.debian.org/debian trixie non-free\n' "$key" > "$T/sources.list"
    A=(-o Dir::Etc::SourceList="$T/sources.list" -o Dir::Etc::SourceParts="$T/parts" -o Dir::State::Lists="$T/lists"
        -o Dir::Cache="$T/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
    apt-get "${A[@]}" -qq update >&2
    (cd "$T" && apt-get "${A[@]}" -qq download nvidia-cuda-toolkit >&2)
    dpkg-deb -x "$T"/nvidia-cuda-toolkit_*.deb "$T/x"
    rm -f "$T"/nvidia-cuda-toolkit_*.deb
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
${NVCC:-nvcc} -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Isrc -cubin "$@" \
    -o "$W/k.cubin" "$src"
python3 - "$W/k.cubin" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], 'rb').read())
flags = struct.unpack_from('<I', b, 0x30)[0]
if b[7] != 0x33:  # the CUDA 13 header: the SM number in bits 8-15
    sm = (flags >> 8) & 0xff
    b[7], b[8] = 0x33, 7
    struct.pack_into('<I', b, 0x30, sm | 0x500 | sm << 16)
open(sys.argv[1], 'wb').write(b)
EOF
"$DIS" -c "$W/k.cubin" > "$W/k.sass"
if [ $summary = 0 ]; then
    cat "$W/k.sass"
    exit 0
fi
awk '
function flush() { if (name != "") printf "%-72s %6d %5d %5d %5d %5d\n", name, n, mma, dep, bar, loc }
/^\.text\./ { flush(); name = substr($0, 7); sub(/:$/, "", name); n = mma = dep = bar = loc = 0; next }
/^ +\/\*[0-9a-f]+\*\// { n++ }
/[HQ]GMMA/ { mma++ }
/WARPGROUP\.DEPBAR/ { dep++ }
/ BAR\./ { bar++ }
/ (LDL|STL)/ { loc++ }
BEGIN { printf "%-72s %6s %5s %5s %5s %5s\n", "kernel", "instr", "mma", "wait", "bar", "local" }
END { flush() }' "$W/k.sass"
