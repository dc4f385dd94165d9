"""The graph API with numpy: an MLP trained to a loss threshold, ops against numpy, a model's
tensor as a leaf, misuse as errors."""
import numpy as np
import pytest

import tinynn


def test_mlp_learns_two_rings():
    rng = np.random.default_rng(0)
    n, h = 128, 16
    angle = rng.uniform(0, 2 * np.pi, n)
    label = (np.arange(n) % 2).astype(np.int32)
    radius = np.where(label == 1, 1.5, 0.5)
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).astype(np.float32)

    g = tinynn.Graph()
    xi = g.input("x", [n, 2])
    yi = g.input("y", [n], "i32")
    w1, b1 = g.param("w1", [h, 2]), g.param("b1", [h])
    w2, b2 = g.param("w2", [2, h]), g.param("b2", [2])
    hidden = g.act("tanh", g.add(g.matmul(w1, xi), b1))
    logits = g.add(g.matmul(w2, hidden), b2)
    loss = g.cross_entropy(logits, yi)
    g.output(loss)
    g.output(logits)
    params = [w1, b1, w2, b2]
    grads = g.backward(loss, params)
    g.optimizer("adamw", params, grads, lr=0.05)
    g.compile(threads=2)
    assert g.shape(logits) == [n, 2]
    g.write(xi, x)
    g.write(yi, label)
    g.write(w1, rng.normal(0, 1, (h, 2)).astype(np.float32))
    g.write(w2, rng.normal(0, 0.5, (2, h)).astype(np.float32))
    losses = []
    for _ in range(500):
        g.compute()
        losses.append(float(g.read(loss)[0]))
        if losses[-1] < 0.05:
            break
    assert losses[-1] < 0.05 < losses[0], (losses[0], losses[-1], len(losses))
    pred = np.argmax(g.read(logits), axis=1)
    assert (pred == label).mean() > 0.98
    assert g.read(grads[0]).shape == (h, 2)


def test_forward_ops_match_numpy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    g = tinynn.Graph()
    ai = g.input("a", [3, 4])
    outs = {
        "softmax": g.softmax(ai),
        "rms": g.rms_norm(ai, eps=0.0),
        "sum": g.sum(ai),
        "rows": g.sum_rows(ai),
        "t": g.cont(g.transpose(ai)),
        "cat": g.concat(ai, ai, axis=0),
        "cat1": g.concat(ai, ai, axis=-1),
        "silu": g.act("silu", ai),
        "scaled": g.scale(ai, 3.0),
    }
    for t in outs.values():
        g.output(t)
    g.compile(threads=1)
    g.write(ai, a)
    g.compute()
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(g.read(outs["softmax"]), e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    np.testing.assert_allclose(g.read(outs["rms"]), a / np.sqrt((a * a).mean(axis=1, keepdims=True)), rtol=1e-5)
    np.testing.assert_allclose(g.read(outs["sum"]), [a.sum()], rtol=1e-5)
    np.testing.assert_allclose(g.read(outs["rows"]).reshape(-1), a.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(g.read(outs["t"]), a.T)
    np.testing.assert_allclose(g.read(outs["cat"]), np.concatenate([a, a], axis=0))
    np.testing.assert_allclose(g.read(outs["cat1"]), np.concatenate([a, a], axis=1))
    np.testing.assert_allclose(g.read(outs["silu"]), a / (1 + np.exp(-a)), rtol=1e-5)
    np.testing.assert_allclose(g.read(outs["scaled"]), 3 * a, rtol=1e-6)


def test_model_tensor_rows(model):
    g = tinynn.Graph()
    table = g.model_tensor(model, "token_embd.weight")
    ids = g.input("ids", [3], "i32")
    rows = g.get_rows(table, ids)
    g.output(rows)
    g.compile()
    g.write(ids, np.array([5, 77, 5], dtype=np.int32))
    g.compute()
    r = g.read(rows)
    assert r.shape == (3, model.n_embd)
    np.testing.assert_array_equal(r[0], r[2])
    assert not np.array_equal(r[0], r[1])


def test_misuse_is_an_error():
    g = tinynn.Graph()
    a = g.input("a", [2, 3])
    with pytest.raises(ValueError):
        g.act("nope", a)
    with pytest.raises(ValueError):
        g.matmul(a, g.input("i", [3], "i32"))
    with pytest.raises(tinynn.TinynnError, match="not compiled"):
        g.compute()
    g.output(a)
    g.compile()
    with pytest.raises(tinynn.TinynnError, match="compiled"):
        g.scale(a, 2.0)
    with pytest.raises(ValueError):
        g.write(a, np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(ValueError):
        g.write(a, np.zeros((2, 3), dtype=np.int32))
