#!/usr/bin/env bash
# The official `openai` Python client and the chat page (headless Chromium) against `tnn serve`
# (default model, loopback only): installs Debian's chromium + chromedriver when missing, and
# openai, pytest and selenium into a venv under target/ (once); starts the server on a free port
# with an API key, runs tests/python/, then stops it with SIGTERM (it must exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "installing chromium and chromedriver (Debian packages)"
    sudo=""
    [[ "$(id -u)" == 0 ]] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi

target="${CARGO_TARGET_DIR:-target}"
venv="$target/py-openai"
if ! "$venv/bin/python" -c "import openai, pytest, selenium" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        "openai>=1.40,<3" "pytest>=8,<10" "selenium>=4.20,<5"
fi

tnn="$target/release/tnn"
cargo build --release --quiet --bin tnn
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
log="$(mktemp)"
"$tnn" serve --port "$port" -c 2048 --parallel 4 -t 2 --api-key test-key >"$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 1 600); do
    if python3 -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1], timeout=1)" \
        "http://127.0.0.1:$port/health" 2>/dev/null; then break; fi
    kill -0 "$server" 2>/dev/null || { cat "$log"; echo "tnn serve exited"; exit 1; }
    sleep 0.1
done

TINYNN_SERVER="http://127.0.0.1:$port" timeout 600 "$venv/bin/pytest" -q tests/python

# SIGTERM lets the request in flight finish (its stream ends with [DONE]) and exits 0.
python3 - "http://127.0.0.1:$port" "$server" <<'PY'
import json, os, signal, sys, time, urllib.request
base, pid = sys.argv[1], int(sys.argv[2])
body = json.dumps({"prompt": "Counting: 1, 2, 3,", "max_tokens": 64, "temperature": 0,
                   "ignore_eos": True, "stream": True}).encode()
req = urllib.request.Request(base + "/v1/completions", data=body, headers={
    "Content-Type": "application/json", "Authorization": "Bearer test-key"})
lines = []
with urllib.request.urlopen(req, timeout=60) as r:
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data:"):
            lines.append(line)
            if len(lines) == 2:
                os.kill(pid, signal.SIGTERM)
assert lines[-1] == "data: [DONE]", lines[-3:]
finish = [json.loads(l[5:])["choices"][0]["finish_reason"] for l in lines[:-1]]
assert finish[-1] == "length" and len(lines) >= 65, (len(lines), finish[-1])
PY
code=0
wait "$server" || code=$?
trap 'rm -f "$log"' EXIT
[[ "$code" == 0 ]] || { cat "$log"; echo "tnn serve exited $code after SIGTERM"; exit 1; }
grep -q "shutting down" "$log" || { cat "$log"; exit 1; }
