#!/usr/bin/env bash
# The docs' pictures, made on the simulated cluster (root, after
# scripts/setup.sh): docs/top.png (invoke top on sim-a2 serving, an
# 80-column terminal) and docs/verify-comm.png (the verify-comm report of
# sim-a3 with npu5 of sim-a3-1 taken down, in headless Chromium).
# Takes both clusters down again at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
out=docs
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'ip -n lds-sim-a3-sim-a3-1 link set npu5 up 2>/dev/null || true; invoke sim.down >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT

shot() {  # shot FILE.html|svg PNG WIDTH HEIGHT: a headless Chromium screenshot
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/chromium" \
        --window-size="$3,$4" --screenshot="$2" "file://$1" >/dev/null 2>&1
}

# invoke top: sim-a2 serving, the snapshot drawn as an 80-column terminal shows it
invoke sim.up --cluster sim-a2 >/dev/null
invoke deploy --cluster sim-a2 --force >/dev/null
invoke bench --cluster sim-a2 --requests 8 --concurrency 4 --output-tokens 64 >/dev/null
invoke top --cluster sim-a2 --once --json > "$tmp/top.json"
python - "$tmp/top.json" "$tmp/top.svg" <<'EOF'
import json, sys
from rich.console import Console
from flows.top import render
doc = json.load(open(sys.argv[1]))
con = Console(record=True, width=80, file=open("/dev/null", "w"), force_terminal=True, color_system="truecolor")
con.print(render(doc, 2, 80))
con.save_svg(sys.argv[2], title="invoke top --cluster sim-a2")
EOF
shot "$tmp/top.svg" "$out/top.png" 1000 620

# the verify-comm report: sim-a3 with npu5 of sim-a3-1 down
invoke sim.up --cluster sim-a3 >/dev/null
ip -n lds-sim-a3-sim-a3-1 link set npu5 down
invoke verify-comm --cluster sim-a3 --report "$tmp/report" >/dev/null || true
ip -n lds-sim-a3-sim-a3-1 link set npu5 up
shot "$(ls "$tmp"/report/*.html | head -1)" "$out/verify-comm.png" 1400 1300
echo "written: $out/top.png $out/verify-comm.png"
