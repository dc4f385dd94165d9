#!/usr/bin/env python3
"""Regenerates the real-model constants the tests hold for the default model (SmolLM2-135M-
Instruct Q4_1) from llama.cpp itself, and says whether the committed ones still match:

- `crates/tinynn-models/tests/smollm2_tokenizer.rs`: llama.cpp's ids of every text in
  `reference_ids` and `LLAMA_CPP_IDS`;
- `crates/tinynn-models/tests/smollm2_greedy.rs` (`PROMPT`, `LLAMA_CPP_IDS`, `LLAMA_CPP_TEXT`)
  and `crates/tinynn-cli/tests/run_cli.rs` (`LLAMA_CPP_TEXT`): llama.cpp's 48 greedy tokens
  after "The capital of France is" (2 threads, the prompt in one batch, then a token a step).

    python3 scripts/make-real-model-constants.py LLAMA_SRC LLAMA_BUILD MODEL.gguf

LLAMA_SRC is a llama.cpp source tree (`include/`, `ggml/include/`), LLAMA_BUILD a build of it
holding `bin/libllama.so`, both made outside this repository (the committed constants: llama.cpp
0c1e570 as bundled in llama-cpp-python 0.3.36, gcc 12, x86-64). The script writes a small C
program of its own against llama.cpp's C API, reads the texts out of the test files (Rust string
literals), prints llama.cpp's values as Rust constants and exits 1 if any committed one differs.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TOKENIZER_TEST = "crates/tinynn-models/tests/smollm2_tokenizer.rs"
GREEDY_TEST = "crates/tinynn-models/tests/smollm2_greedy.rs"
RUN_TEST = "crates/tinynn-cli/tests/run_cli.rs"
GREEDY_PROMPT, GREEDY_STEPS = "The capital of France is", 48

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

/* MODEL tok: stdin holds texts (byte count, newline, bytes), each with a flag line before it
   (1: add the model's special tokens); one JSON array of ids per text.
   MODEL gen N: stdin holds one prompt; prints {"prompt":[...],"ids":[...],"text":"..."} with
   the N greedy tokens' pieces as hex. */
int main(int argc, char **argv) {
    llama_backend_init();
    struct llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    static llama_token ids[65536];
    size_t len;
    int special;
    if (strcmp(argv[2], "tok") == 0) {
        /* "%d %zu" then exactly one newline: a text may itself start with whitespace. */
        while (fscanf(stdin, "%d %zu", &special, &len) == 2 && getchar() == '\n') {
            char *text = malloc(len + 1);
            if (len && fread(text, 1, len, stdin) != len) return 1;
            text[len] = 0;
            int n = llama_tokenize(vocab, text, (int)len, ids, 65536, special, false);
            if (n < 0) return 1;
            printf("[");
            for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
            printf("]\n");
            free(text);
        }
        return 0;
    }
    int steps = atoi(argv[3]);
    if (fscanf(stdin, "%zu", &len) != 1 || getchar() != '\n') return 1;
    char *text = malloc(len + 1);
    if (fread(text, 1, len, stdin) != len) return 1;
    text[len] = 0;
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_threads = 2; cp.n_threads_batch = 2;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    int n = llama_tokenize(vocab, text, (int)len, ids, 512, true, false);
    if (n < 0 || llama_decode(ctx, llama_batch_get_one(ids, n))) return 1;
    printf("{\"prompt\":[");
    for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("],\"ids\":[");
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token out[4096];
    for (int s = 0; s < steps; s++) {
        const float *l = llama_get_logits_ith(ctx, -1);
        llama_token next = 0;
        for (int i = 1; i < n_vocab; i++) if (l[i] > l[next]) next = i;
        out[s] = next;
        printf("%s%d", s ? "," : "", next);
        if (s + 1 < steps && llama_decode(ctx, llama_batch_get_one(&next, 1))) return 1;
    }
    printf("],\"text\":\"");
    for (int s = 0; s < steps; s++) {
        char piece[256];
        int k = llama_token_to_piece(vocab, out[s], piece, sizeof piece, 0, false);
        for (int i = 0; i < k; i++) printf("%02x", (unsigned char)piece[i]);
    }
    printf("\"}\n");
    return 0;
}
"""

ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "'": "'", "0": "\0"}


def rust_str(body):
    """The value of a Rust string literal's body (the escapes the tests use)."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
        elif body[i + 1] == "u":
            end = body.index("}", i)
            out.append(chr(int(body[i + 3:end], 16)))
            i = end + 1
        else:
            out.append(ESCAPES[body[i + 1]])
            i += 2
    return "".join(out)


def literal(s):
    """`s` as a Rust string literal."""
    out = []
    for c in s:
        if c in '\\"':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 or c in "\u200b\u200d\u3000\ufe0f\u0301":
            out.append("\\u{%x}" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def pairs(path):
    """(text, ids) of every `("text", &[ids])` pair in a test file."""
    src = open(os.path.join(ROOT, path), encoding="utf-8").read()
    pat = re.compile(r'\(\s*"((?:[^"\\]|\\.)*)",\s*&\[([0-9,\s]*)\],?\s*\)', re.S)
    return [(rust_str(t), [int(x) for x in ids.replace(",", " ").split()])
            for t, ids in pat.findall(src)]


def const(path, name):
    src = open(os.path.join(ROOT, path), encoding="utf-8").read()
    m = re.search(name + r': [^=]+= (.*?);\n', src, re.S)
    return m.group(1)


def main():
    src, build, model = sys.argv[1:4]
    tmp = tempfile.mkdtemp()
    c, exe = os.path.join(tmp, "consts.c"), os.path.join(tmp, "consts")
    with open(c, "w") as f:
        f.write(PROGRAM)
    lib = os.path.join(build, "bin")
    subprocess.run(["cc", "-O2", c, "-o", exe, f"-I{src}/include", f"-I{src}/ggml/include",
                    f"-L{lib}", "-lllama", f"-Wl,-rpath,{lib}"], check=True)
    ok = True

    # Tokenizer: reference_ids adds special tokens, LLAMA_CPP_IDS does not.
    cases = pairs(TOKENIZER_TEST)
    first = const(TOKENIZER_TEST, "const LLAMA_CPP_IDS")
    n_ref = len(cases) - len(pairs_in(first))
    feed = b"".join(f"{1 if i < n_ref else 0} {len(t.encode())}\n".encode() + t.encode()
                    for i, (t, _) in enumerate(cases))
    run = subprocess.run([exe, model, "tok"], input=feed, capture_output=True, check=True)
    got = [json.loads(line) for line in run.stdout.decode().splitlines()]
    assert len(got) == len(cases), f"{len(got)} of {len(cases)} texts tokenized"
    print(f"// {TOKENIZER_TEST}")
    for (text, want), ids in zip(cases, got):
        mark = "" if ids == want else "   // DIFFERS from the committed ids"
        ok &= ids == want
        print(f"({literal(text)}, &{ids}),{mark}")

    # Greedy text.
    feed = f"{len(GREEDY_PROMPT.encode())}\n{GREEDY_PROMPT}".encode()
    run = subprocess.run([exe, model, "gen", str(GREEDY_STEPS)], input=feed, capture_output=True,
                         check=True)
    g = json.loads(run.stdout.decode().splitlines()[-1])
    text = bytes.fromhex(g["text"]).decode("utf-8", errors="replace")
    print(f"\n// {GREEDY_TEST}, {RUN_TEST}")
    print(f"const PROMPT: [u32; {len(g['prompt'])}] = {g['prompt']};")
    print(f"greedy ids: {g['ids']}")
    print(f"const LLAMA_CPP_TEXT: &str = {literal(text)};")
    want_prompt = [int(x) for x in re.findall(r"\d+", const(GREEDY_TEST, "const PROMPT").split("=")[-1])]
    want_ids = [int(x) for x in re.findall(r"\d+", const(GREEDY_TEST, "const LLAMA_CPP_IDS"))]
    checks = [
        ("PROMPT", g["prompt"] == want_prompt),
        ("LLAMA_CPP_IDS (a prefix of the greedy ids)", g["ids"][:len(want_ids)] == want_ids),
        (f"LLAMA_CPP_TEXT in {GREEDY_TEST}", rust_str(const(GREEDY_TEST, "const LLAMA_CPP_TEXT")[1:-1]) == text),
        (f"LLAMA_CPP_TEXT in {RUN_TEST}", rust_str(const(RUN_TEST, "const LLAMA_CPP_TEXT")[1:-1]) == text),
    ]
    for name, same in checks:
        ok &= same
        print(f"{name}: {'matches' if same else 'DIFFERS'}")
    sys.exit(0 if ok else 1)


def pairs_in(text):
    pat = re.compile(r'\(\s*"((?:[^"\\]|\\.)*)",\s*&\[([0-9,\s]*)\],?\s*\)', re.S)
    return pat.findall(text)


if __name__ == "__main__":
    main()
