"""tinynn.Model on the default model: generation equals the CLI's, streaming, stop strings,
chat, tokens, embeddings, logits and perplexity, and errors as exceptions."""
import threading
import time

import numpy as np
import pytest

import tinynn


def test_greedy_text_equals_the_cli(model, tnn_run):
    for prompt in ["The capital of France is", "def fibonacci(n):", "Once upon a time"]:
        model.reset()
        got = "".join(model.generate(prompt, max_tokens=24))
        assert got == tnn_run(prompt, 24), prompt


def test_streaming_gives_pieces_and_a_finish_reason(model):
    g = model.generate("List three colors:", max_tokens=12)
    pieces = list(g)
    assert len(pieces) >= 3 and all(isinstance(p, str) for p in pieces)
    assert g.finish_reason in ("length", "stop")
    g2 = model.generate("List three colors:", max_tokens=12)
    first = next(g2)
    g2.close()
    assert first == pieces[0] and g2.finish_reason == "cancelled"
    assert list(g2) == []


def test_stop_strings_and_seeds(model):
    text = model.generate("Count: one, two, three,", max_tokens=40, stop=["five"]).text()
    assert "five" not in text
    a = model.generate("My favourite food is", max_tokens=16, temperature=0.9, seed=7).text()
    b = model.generate("My favourite food is", max_tokens=16, temperature=0.9, seed=7).text()
    assert a == b
    with pytest.raises(ValueError):
        model.generate("x", top_p=2.0)


def test_chat(model):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = model.chat(messages, max_tokens=24).text()
    assert reply.strip() and reply == model.chat(messages, max_tokens=24).text()
    # The template wraps the question: the reply is not the plain continuation of it.
    model.reset()
    assert reply != model.generate(messages[0]["content"], max_tokens=24).text()
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And of Spain?"}]
    assert model.chat(messages, max_tokens=16).text().strip()
    with pytest.raises(ValueError):
        model.chat([{"content": "no role"}])


def test_tokens_round_trip(model):
    text = "Hello, world! Ünïcödé and numbers 12345."
    ids = model.tokenize(text, add_special=False)
    assert model.detokenize(ids) == text
    assert model.tokenize(text)[0] != ids[0] or len(model.tokenize(text)) >= len(ids)
    with pytest.raises(ValueError):
        model.detokenize([10**9])


def test_embeddings(model):
    e = model.embed(["a cat sat on the mat", "a cat sat on a mat", "quantum chromodynamics"])
    assert e.shape == (3, model.n_embd) and e.dtype == np.float32
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-4)
    assert e[0] @ e[1] > e[0] @ e[2]
    with pytest.raises(ValueError):
        model.embed(["x"], pooling="max")


def test_logits_agree_with_generation(model):
    ids = model.tokenize("The capital of France is")
    logits = model.logits(ids)
    assert logits.shape == (len(ids), model.n_vocab) and logits.dtype == np.float32
    first = model.detokenize([int(np.argmax(logits[-1]))])
    model.reset()
    assert model.generate("The capital of France is", max_tokens=1).text() == first


def test_perplexity_of_a_license(model):
    text = open("/usr/share/common-licenses/GPL-3").read()[:6000]
    ppl = model.perplexity(text, n_ctx=256)
    assert 1.0 < ppl < 100.0


def test_errors_are_exceptions():
    with pytest.raises(tinynn.TinynnError, match="nonexistent"):
        tinynn.Model("/nonexistent/model.gguf")
    with pytest.raises(ValueError):
        tinynn.Model(threads=0)


def test_generation_releases_the_gil(model):
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    text = open("/usr/share/common-licenses/GPL-3").read()[:12000]
    t = threading.Thread(target=tick)
    t.start()
    start = time.monotonic()
    model.perplexity(text, n_ctx=256)
    elapsed = time.monotonic() - start
    stop.set()
    t.join()
    # The other thread kept ticking while the engine computed (a held GIL would allow one).
    assert elapsed > 0.1 and len(ticks) > elapsed / 0.005 / 4, (elapsed, len(ticks))


def test_ctrl_c_stops_a_generation():
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys, tinynn\n"
        "m = tinynn.Model(n_ctx=2048)\n"
        "g = m.generate('Write a very long story.', max_tokens=1500)\n"
        "next(g); print('started', flush=True)\n"
        "try:\n"
        "    for _ in g: pass\n"
        "    print('finished', flush=True)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', g.finish_reason, flush=True)\n"
    )
    # Run outside python/, whose tinynn/ source folder would shadow the installed package.
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd="/")
    assert p.stdout.readline().strip() == "started"
    time.sleep(0.2)
    start = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    # Raised inside the iterator's wait ("cancelled": the worker stopped) or between pieces
    # (None: the generation is left as it was); either way the process ends at once.
    assert out.strip() in ("interrupted cancelled", "interrupted None"), out
    assert time.monotonic() - start < 5
