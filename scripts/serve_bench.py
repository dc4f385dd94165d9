#!/usr/bin/env python3
"""Load test of OpenAI-compatible servers, side by side (a benchmark, not a test).

Each target is NAME=URL[,PID]: a running server (tnn serve, llama-server, ...) and optionally
its process id, for peak RSS. For every client count, the targets take turns (interleaved
rounds): C clients each stream one chat completion of --tokens new tokens (ignore_eos) from a
~40-token prompt that differs per client. Reported per target and client count: aggregate
generated tokens/s (all tokens over the wall time of the round), time to first token p50/p95,
per-token latency p50/p95 (gaps between streamed chunks), errors, and peak RSS.

  scripts/serve_bench.py --target tnn=http://127.0.0.1:8080,$TNN_PID \
                         --target llama=http://127.0.0.1:8081,$LLAMA_PID --clients 1,4,8

--soak SECONDS instead keeps --soak-clients clients busy against the first target for that
long (bounded), printing RSS every 10 s and the error count at the end.

Loopback only: it refuses any host but 127.0.0.1, ::1 or localhost. Standard library only.
"""

import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

# A fresh nonce per run and an index per request: no server can answer from a cache of an
# earlier run's prompts (llama-server keeps one in host memory).
NONCE = f"{time.time_ns() % 1000003}"

PROMPT = (
    "Client " + NONCE + "-{i}: you are helping me plan a weekend trip to the mountains with two friends. "
    "Write a detailed day-by-day plan with meals, hikes, and what to pack for cold nights."
)


def parse_target(s):
    name, rest = s.split("=", 1)
    url, _, pid = rest.partition(",")
    u = urllib.parse.urlparse(url)
    if u.hostname not in ("127.0.0.1", "::1", "localhost"):
        raise SystemExit(f"{url}: only loopback servers may be load-tested")
    return {"name": name, "host": u.hostname, "port": u.port or 80, "pid": int(pid) if pid else None}


def rss_mib(pid, field="VmHWM"):
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def model_id(t):
    c = http.client.HTTPConnection(t["host"], t["port"], timeout=30)
    c.request("GET", "/v1/models")
    data = json.loads(c.getresponse().read())
    return data["data"][0]["id"]


def one_request(t, model, i, tokens, out):
    """Streams one chat completion; appends (ttft, gaps, n_tokens, error) to out."""
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": PROMPT.format(i=i)}],
        "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    })
    t0 = time.perf_counter()
    first, last, gaps, n, err = None, None, [], 0, None
    try:
        c = http.client.HTTPConnection(t["host"], t["port"], timeout=600)
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            j = json.loads(data)
            if j.get("usage"):
                n = j["usage"]["completion_tokens"]
            for ch in j.get("choices", []):
                if ch.get("delta", {}).get("content"):
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        gaps.append(now - last)
                    last = now
    except Exception as e:  # noqa: BLE001 - every failure is counted
        err = str(e)
    out.append((None if first is None else first - t0, gaps, n, err))


def round_of(t, model, clients, tokens, base):
    out, threads = [], []
    t0 = time.perf_counter()
    for k in range(clients):
        th = threading.Thread(target=one_request, args=(t, model, base + k, tokens, out))
        th.start()
        threads.append(th)
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    return out, wall


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def bench(targets, clients_list, tokens, rounds):
    models = {t["name"]: model_id(t) for t in targets}
    rows = []
    for clients in clients_list:
        acc = {t["name"]: {"tps": [], "ttft": [], "gaps": [], "errors": 0} for t in targets}
        for r in range(rounds):
            order = targets if r % 2 == 0 else list(reversed(targets))
            for t in order:
                out, wall = round_of(t, models[t["name"]], clients, tokens, 1000 * r)
                a = acc[t["name"]]
                a["tps"].append(sum(o[2] for o in out) / wall)
                a["ttft"] += [o[0] for o in out if o[0] is not None]
                a["gaps"] += [g for o in out for g in o[1]]
                a["errors"] += sum(1 for o in out if o[3])
        for t in targets:
            a = acc[t["name"]]
            rows.append((t["name"], clients, statistics.median(a["tps"]), pct(a["ttft"], 50) * 1e3,
                         pct(a["ttft"], 95) * 1e3, pct(a["gaps"], 50) * 1e3, pct(a["gaps"], 95) * 1e3,
                         a["errors"], rss_mib(t["pid"])))
    print("| server | clients | aggregate t/s | TTFT p50 ms | TTFT p95 ms | token p50 ms | token p95 ms | errors | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| {} | {} | {:.1f} | {:.0f} | {:.0f} | {:.1f} | {:.1f} | {} | {:.0f} |".format(*row))
    if len(targets) == 2:
        a, b = targets[0]["name"], targets[1]["name"]
        for clients in clients_list:
            ra = next(r for r in rows if r[0] == a and r[1] == clients)
            rb = next(r for r in rows if r[0] == b and r[1] == clients)
            print(f"{clients} clients: {a}/{b} aggregate t/s {ra[2] / rb[2]:.2f}x, "
                  f"TTFT p95 {ra[4]:.0f} vs {rb[4]:.0f} ms")


def soak(t, clients, seconds, tokens):
    model = model_id(t)
    stop = time.monotonic() + seconds
    errors, done, lock = [0], [0], threading.Lock()

    def client(i):
        k = 0
        while time.monotonic() < stop:
            out = []
            one_request(t, model, i * 100000 + k, tokens, out)
            with lock:
                done[0] += 1
                errors[0] += 1 if out[0][3] else 0
            k += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for th in threads:
        th.start()
    t0 = time.monotonic()
    while any(th.is_alive() for th in threads):
        time.sleep(10)
        print(f"t={time.monotonic() - t0:5.0f}s rss={rss_mib(t['pid'], 'VmRSS'):.0f} MiB "
              f"requests={done[0]} errors={errors[0]}", flush=True)
    for th in threads:
        th.join()
    print(f"soak: {done[0]} requests, {errors[0]} errors, peak RSS {rss_mib(t['pid']):.0f} MiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", required=True, help="NAME=URL[,PID]")
    ap.add_argument("--clients", default="1,4,8")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--soak", type=float, default=0, help="seconds of soak against the first target")
    ap.add_argument("--soak-clients", type=int, default=8)
    a = ap.parse_args()
    targets = [parse_target(s) for s in a.target]
    if a.soak > 0:
        soak(targets[0], a.soak_clients, min(a.soak, 3600), a.tokens)
    else:
        bench(targets, [int(c) for c in a.clients.split(",")], a.tokens, a.rounds)


if __name__ == "__main__":
    main()
