"""A character-level transformer built, trained and sampled with tinynn's graph API:

    python python/examples/char_transformer.py [TEXT_FILE] [STEPS]

One pre-norm block (causal multi-head attention and a GELU MLP) over learned token and
position embeddings, trained with AdamW on random windows of the text (default: the GPL-3
license), then sampled character by character from a second graph that takes the trained
weights. numpy shapes throughout; `Graph.matmul(w, x)` is `x @ w.T`.
"""
import math
import sys

import numpy as np

import tinynn

T, D, H, B = 32, 64, 4, 16  # context, width, heads, sequences per step
HD = D // H


def build(g, vocab, batch, params=None):
    """The model's graph for `batch` sequences of T characters: (inputs, params, logits)."""
    n = batch * T
    tokens = g.input("tokens", [n], "i32")
    pos = g.input("pos", [n], "i32")
    mask = g.input("mask", [T, T])
    shapes = {"emb": [vocab, D], "pos_emb": [T, D], "wq": [D, D], "wk": [D, D], "wv": [D, D],
              "wo": [D, D], "w1": [4 * D, D], "w2": [D, 4 * D], "out": [vocab, D]}
    p = {name: g.param(name, shape) for name, shape in shapes.items()}
    x = g.add(g.get_rows(p["emb"], tokens), g.get_rows(p["pos_emb"], pos))  # [n, D]

    def heads(t):
        # [n, D] = [B, T, H, HD] → the attention's [B, H, T, HD] (a view).
        return g.permute(g.reshape(t, [batch, T, H, HD]), [0, 2, 1, 3])

    h = g.rms_norm(x)
    q, k, v = (heads(g.matmul(p[w], h)) for w in ("wq", "wk", "wv"))
    att = g.attention(q, k, v, mask=mask, scale=1.0 / math.sqrt(HD))  # [B, T, H, HD]
    x = g.add(x, g.matmul(p["wo"], g.reshape(att, [n, D])))
    h = g.rms_norm(x)
    x = g.add(x, g.matmul(p["w2"], g.act("gelu", g.matmul(p["w1"], h))))
    logits = g.matmul(p["out"], g.rms_norm(x))  # [n, vocab]
    return (tokens, pos, mask), p, logits


def causal_mask():
    m = np.zeros((T, T), dtype=np.float32)
    m[np.triu_indices(T, k=1)] = -np.inf
    return m


def train(text, steps=300, seed=0, log=print):
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = np.array([index[c] for c in text], dtype=np.int32)
    rng = np.random.default_rng(seed)

    g = tinynn.Graph()
    (tokens, pos, mask), params, logits = build(g, len(chars), B)
    targets = g.input("targets", [B * T], "i32")
    loss = g.cross_entropy(logits, targets)
    g.output(loss)
    names = list(params)
    grads = g.backward(loss, [params[k] for k in names])
    g.optimizer("adamw", [params[k] for k in names], grads, lr=3e-3, weight_decay=0.01)
    g.compile(threads=2)
    g.write(pos, np.tile(np.arange(T, dtype=np.int32), B))
    g.write(mask, causal_mask())
    for name, pid in params.items():
        shape = g.shape(pid)
        scale = 0.02 if name in ("emb", "pos_emb") else 1.0 / math.sqrt(shape[-1])
        g.write(pid, (rng.normal(0, 1, shape) * scale).astype(np.float32))

    losses = []
    for step in range(1, steps + 1):
        starts = rng.integers(0, len(data) - T - 1, B)
        g.write(tokens, np.concatenate([data[s:s + T] for s in starts]))
        g.write(targets, np.concatenate([data[s + 1:s + T + 1] for s in starts]))
        g.compute()
        losses.append(float(g.read(loss)[0]))
        if step % 50 == 0 or step == 1:
            log(f"step {step}: loss {np.mean(losses[-50:]):.3f}")
    weights = {k: g.read(params[k]) for k in names}
    return chars, weights, losses


def sample(chars, weights, prompt, n=200, temperature=0.8, seed=1):
    g = tinynn.Graph()
    (tokens, pos, mask), params, logits = build(g, len(chars), 1)
    g.output(logits)
    g.compile(threads=2)
    for name, pid in params.items():
        g.write(pid, weights[name])
    g.write(pos, np.arange(T, dtype=np.int32))
    g.write(mask, causal_mask())
    index = {c: i for i, c in enumerate(chars)}
    ids = [index.get(c, 0) for c in prompt]
    rng = np.random.default_rng(seed)
    for _ in range(n):
        window = ids[-T:]
        # Left-pad short contexts with the first character; the last real one is read.
        g.write(tokens, np.array([window[0]] * (T - len(window)) + window, dtype=np.int32))
        g.compute()
        z = g.read(logits)[-1] / temperature
        p = np.exp(z - z.max())
        ids.append(int(rng.choice(len(chars), p=p / p.sum())))
    return "".join(chars[i] for i in ids)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/common-licenses/GPL-3"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    text = open(path, encoding="utf-8").read()
    chars, weights, losses = train(text, steps)
    print(f"loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f} over {steps} steps")
    print(sample(chars, weights, "The GNU General Public License "))


if __name__ == "__main__":
    main()
