"""examples/char_transformer.py: its graph computes what numpy computes for the same weights
(embeddings, RMS norms, causal multi-head attention, GELU MLP), and a short run lowers the
loss."""
import importlib.util
import math
import os

import numpy as np

import tinynn

spec = importlib.util.spec_from_file_location(
    "char_transformer", os.path.join(os.path.dirname(__file__), "..", "examples", "char_transformer.py"))
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def reference(w, ids, batch):
    T, D, H, HD = ct.T, ct.D, ct.H, ct.HD
    rms = lambda a: a / np.sqrt((a * a).mean(-1, keepdims=True))
    gelu = lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))
    x = w["emb"][ids] + np.tile(w["pos_emb"], (batch, 1))
    h = rms(x)
    q, k, v = (h @ w[n].T for n in ("wq", "wk", "wv"))
    split = lambda t: t.reshape(batch, T, H, HD).transpose(0, 2, 1, 3)
    s = split(q) @ split(k).transpose(0, 1, 3, 2) / math.sqrt(HD) + ct.causal_mask()
    p = np.exp(s - s.max(-1, keepdims=True))
    att = (p / p.sum(-1, keepdims=True)) @ split(v)  # [B, H, T, HD]
    x = x + att.transpose(0, 2, 1, 3).reshape(batch * T, D) @ w["wo"].T
    x = x + gelu(rms(x) @ w["w1"].T) @ w["w2"].T
    return rms(x) @ w["out"].T


def test_the_graph_computes_the_reference_transformer():
    vocab, batch = 11, 2
    rng = np.random.default_rng(5)
    g = tinynn.Graph()
    (tokens, pos, mask), params, logits = ct.build(g, vocab, batch)
    g.output(logits)
    g.compile(threads=2)
    w = {}
    for name, pid in params.items():
        w[name] = (rng.normal(0, 1, g.shape(pid)) * 0.3).astype(np.float32)
        g.write(pid, w[name])
    ids = rng.integers(0, vocab, batch * ct.T).astype(np.int32)
    g.write(tokens, ids)
    g.write(pos, np.tile(np.arange(ct.T, dtype=np.int32), batch))
    g.write(mask, ct.causal_mask())
    g.compute()
    want = reference({k: v.astype(np.float64) for k, v in w.items()}, ids, batch)
    got = g.read(logits)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_a_short_run_learns():
    text = open("/usr/share/common-licenses/GPL-3").read()[:20000]
    chars, weights, losses = ct.train(text, steps=60, log=lambda _: None)
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3
    out = ct.sample(chars, weights, "The ", n=20)
    assert out.startswith("The ") and len(out) == 24
