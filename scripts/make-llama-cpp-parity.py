#!/usr/bin/env python3
"""Reference data for tinynn's logit-level parity with llama.cpp: for each prompt of PROMPTS,
llama.cpp's prompt tokens, its 64 greedy steps and, at every step, the top-10 token ids and
log-probabilities (log-softmax of the logits, summed in double).

    python3 scripts/make-llama-cpp-parity.py LLAMA_SRC LLAMA_BUILD OUT.json MODEL.gguf [--no-flash-attn]

LLAMA_SRC is a llama.cpp source tree (its `include/` and `ggml/include/`), LLAMA_BUILD a build
of it holding `bin/libllama.so` (both made outside this repository; nothing of llama.cpp is
committed). The script writes a small C program of its own against llama.cpp's C API to a
temporary folder, compiles it with `cc`, and runs it with llama.cpp's default context settings
(as `llama-cli` runs): 2 threads, flash attention as llama.cpp chooses it (`auto`: on, for the
CPU; `--no-flash-attn` turns it off), one batch for the prompt, then one token a step. The output
(committed beside the tests) also records the file's SHA-256, the llama.cpp commit when the
source tree is a git checkout, ggml's CPU features as the build reports them
(`llama_print_system_info`), and the prompts.

The committed files (`crates/tinynn-models/tests/fixtures/llama-cpp-parity/`), llama.cpp 0c1e570:
- `smollm2-q4_1.json`, `-no-fa.json`: the default model, a native build (`-DGGML_NATIVE=ON`);
- `smollm2-q4_1-avx2-build.json`: the same file with a build limited to AVX2 (`-DGGML_NATIVE=OFF
  -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF`), for llama.cpp's spread
  across its own builds;
- `smollm2-{q8_0,f16,q4_k_m}.json`, `-no-fa.json`: native build, on the default model converted
  with `tnn quantize --allow-requantize MODEL OUT TYPE` (the test makes the same files and
  checks their SHA-256).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

STEPS, TOP = 64, 10


def license_text(name, start, length):
    with open(f"/usr/share/common-licenses/{name}", encoding="utf-8") as f:
        text = " ".join(f.read().split())
    return text[start:start + length]


def chatml(user, system=None):
    s = ""
    if system:
        s += f"<|im_start|>system\n{system}<|im_end|>\n"
    return s + f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# (kind, text): prose, code, chat-templated, multilingual, lists, letters and long texts.
PROMPTS = [
    ("prose", "The capital of France is"),
    ("prose", "Once upon a time, in a small village by the sea, there lived"),
    ("prose", "The history of the printing press begins"),
    ("prose", "Photosynthesis is the process by which plants"),
    ("license", license_text("GPL-3", 0, 300)),
    ("license", license_text("Apache-2.0", 2000, 400)),
    ("license", license_text("MPL-2.0", 1000, 350)),
    ("license", license_text("Artistic", 500, 300)),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("code", "fn main() {\n    let numbers = vec![3, 1, 4, 1, 5];\n"),
    ("code", "#include <stdio.h>\n\nint main(void) {\n"),
    ("code", "SELECT name, COUNT(*) FROM orders\n"),
    ("code", "function debounce(fn, ms) {\n"),
    ("code", "#!/bin/sh\n# Back up the home directory\n"),
    ("chat", chatml("What is the boiling point of water?")),
    ("chat", chatml("Write a haiku about autumn.")),
    ("chat", chatml("Explain recursion to a child.", "You are a helpful assistant.")),
    ("chat", chatml("List three uses of a paperclip.")),
    ("chat", chatml("¿Cuál es la capital de España?")),
    ("multilingual", "El sol brillaba sobre la ciudad cuando María salió de casa"),
    ("multilingual", "La tour Eiffel est située à Paris et"),
    ("multilingual", "Der schnelle braune Fuchs springt über den faulen Hund, und"),
    ("multilingual", "Il gatto dorme sul divano mentre"),
    ("multilingual", "O Brasil é o maior país da América do Sul e"),
    ("list", "Shopping list:\n1. Milk\n2. Eggs\n3."),
    ("list", "Steps to bake bread:\n- Mix flour and water\n-"),
    ("letter", "Dear Mr. Smith,\n\nThank you for your letter of"),
    ("letter", "To whom it may concern,\n\nI am writing to"),
    ("qa", "Q: How many legs does a spider have?\nA:"),
    ("math", "The derivative of x^2 + 3x is"),
    ("long", license_text("GPL-3", 5000, 1800)),
    ("long", license_text("GPL-2", 3000, 1500)),
]

DUMPER = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"

/* Reads prompts (a byte count, a newline, the bytes) from stdin; for each writes one JSON line:
   the prompt's ids, the greedy ids and per step the top-K (id, log-probability). */
static void top_k(const float *l, int n, int k, FILE *out) {
    double max = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++) if (l[i] > max) max = l[i];
    for (int i = 0; i < n; i++) sum += exp((double)l[i] - max);
    double lse = max + log(sum);
    int *best = malloc(sizeof(int) * k);
    for (int j = 0; j < k; j++) {
        int b = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int q = 0; q < j; q++) if (best[q] == i) taken = 1;
            if (taken) continue;
            if (b < 0 || l[i] > l[b]) b = i;
        }
        best[j] = b;
        fprintf(out, "%s[%d,%.6f]", j ? "," : "", b, (double)l[b] - lse);
    }
    free(best);
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: dump MODEL STEPS\n"); return 2; }
    int steps = atoi(argv[2]);
    llama_backend_init();
    printf("SYSTEM %s\n", llama_print_system_info());
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    size_t len;
    while (fscanf(stdin, "%zu\n", &len) == 1) {
        char *text = malloc(len + 1);
        if (fread(text, 1, len, stdin) != len) return 1;
        text[len] = 0;
        struct llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024; cp.n_batch = 1024; cp.n_threads = 2; cp.n_threads_batch = 2;
        if (argc > 3 && strcmp(argv[3], "off") == 0) cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        struct llama_context *ctx = llama_init_from_model(model, cp);
        llama_token ids[1024];
        int n = llama_tokenize(vocab, text, (int)len, ids, 1024, true, true);
        if (n < 0) return 1;
        printf("{\"prompt_ids\":[");
        for (int i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
        printf("],\"steps\":[");
        if (llama_decode(ctx, llama_batch_get_one(ids, n))) return 1;
        for (int s = 0; s < steps; s++) {
            const float *l = llama_get_logits_ith(ctx, -1);
            llama_token next = 0;
            for (int i = 1; i < n_vocab; i++) if (l[i] > l[next]) next = i;
            printf("%s{\"token\":%d,\"top\":[", s ? "," : "", next);
            top_k(l, n_vocab, TOP, stdout);
            printf("]}");
            if (s + 1 < steps && llama_decode(ctx, llama_batch_get_one(&next, 1))) return 1;
        }
        printf("]}\n");
        fflush(stdout);
        llama_free(ctx);
        free(text);
    }
    llama_model_free(model);
    return 0;
}
""".replace("TOP", str(TOP))


def main():
    src, build, out, model = sys.argv[1:5]
    flash_attn = "--no-flash-attn" not in sys.argv[5:]
    tmp = tempfile.mkdtemp()
    c = os.path.join(tmp, "dump.c")
    exe = os.path.join(tmp, "dump")
    with open(c, "w") as f:
        f.write(DUMPER)
    lib = os.path.join(build, "bin")
    subprocess.run(["cc", "-O2", c, "-o", exe, f"-I{src}/include", f"-I{src}/ggml/include",
                    f"-L{lib}", "-lllama", "-lm", f"-Wl,-rpath,{lib}"], check=True)
    feed = b"".join(f"{len(t.encode())}\n".encode() + t.encode() for _, t in PROMPTS)
    run = subprocess.run([exe, model, str(STEPS), "auto" if flash_attn else "off"], input=feed,
                         capture_output=True, check=True)
    rows = [json.loads(line) for line in run.stdout.decode().splitlines() if line.startswith("{")]
    assert len(rows) == len(PROMPTS), run.stderr.decode()[-2000:]
    system = [line[7:] for line in run.stdout.decode().splitlines() if line.startswith("SYSTEM ")]
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    try:
        commit = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                                check=True).stdout.decode().strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        commit = None
    data = {
        "model_sha256": sha,
        "llama_cpp_commit": commit,
        "system_info": system[0].strip() if system else None,
        "threads": 2,
        "flash_attn": "auto" if flash_attn else "off",
        "steps": STEPS,
        "top": TOP,
        "prompts": [{"kind": k, "text": t, **r} for (k, t), r in zip(PROMPTS, rows)],
    }
    with open(out, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print(out, len(rows), "prompts")


if __name__ == "__main__":
    main()
