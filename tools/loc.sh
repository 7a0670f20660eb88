#!/bin/sh
# Lines per source file, warning above the ~800-line budget of STYLE.md.
find include src tests bench tools -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' \) 2>/dev/null |
    sort | xargs wc -l | awk '{ flag = ($1 > 800 && $2 != "total") ? "  <-- over 800" : ""; print $0 flag }'
