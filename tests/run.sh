#!/bin/sh
# Runs each test binary, then prints the closing line "N passed, N failed" over all checks. A binary's
# failures (test.h's "FAIL file:line: ...", wherever they landed in a line) come first, then its last 40 lines.
pass=0; fail=0; bad=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -oE 'FAIL [^ ]+:[0-9]+: .*' | head -n 20
    printf '%s\n' "$out" | grep -vE 'FAIL [^ ]+:[0-9]+: ' | tail -n 40
    line=$(printf '%s\n' "$out" | grep -E '[0-9]+ passed, [0-9]+ failed' | tail -n 1)
    p=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/'); f=$(printf '%s' "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    [ -n "$p" ] && pass=$((pass + p)); [ -n "$f" ] && fail=$((fail + f))
    if [ $rc -ne 0 ]; then bad=$((bad + 1)); echo "BINARY FAILED: $t (exit $rc)"; [ -z "$line" ] && fail=$((fail + 1)); fi
done
echo "tests: $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $bad -eq 0 ]
