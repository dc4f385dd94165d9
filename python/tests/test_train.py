"""Training from Python: LoRA steps lower the loss, a checkpoint resumes bit for bit, the
adapter exports; finetune runs the loop with a progress callback; full fine-tuning of a tiny
model exports a model that opens."""
import os
import subprocess

import pytest

import tinynn

SEQ = 32


def windows(model, n):
    ids = model.tokenize(open("/usr/share/common-licenses/GPL-3").read()[:8000], add_special=False)
    return [ids[i * SEQ:(i + 1) * SEQ] for i in range(n)]


def test_lora_steps_resume_and_export(model, tmp_path):
    batches = windows(model, 8)
    t = tinynn.Trainer(model, rank=4, seq=SEQ, batch=1, lr=3e-3, targets="q,k,v,o", seed=3)
    before = t.eval_loss(batches[7])
    losses = [t.step(b) for b in batches[:4]]
    path = t.save(tmp_path / "ckpt")
    assert path.endswith("checkpoint-4.gguf")
    losses += [t.step(b) for b in batches[4:]]
    assert t.steps == 8 and t.eval_loss(batches[7]) < before
    t.export(tmp_path / "adapter.gguf")
    assert (tmp_path / "adapter.gguf").stat().st_size > 0

    t2 = tinynn.Trainer(model, rank=4, seq=SEQ, batch=1, lr=1.0, targets="q,k,v,o", seed=3)
    t2.resume(tmp_path / "ckpt")
    assert t2.lr == pytest.approx(3e-3)
    assert [t2.step(b) for b in batches[4:]] == losses[4:]
    with pytest.raises(tinynn.TinynnError, match="a step takes"):
        t2.step(batches[0][:5])
    other = tinynn.Trainer(model, rank=2, seq=SEQ, batch=1, targets="q,k,v,o")
    with pytest.raises(tinynn.TinynnError, match="other settings"):
        other.resume(tmp_path / "ckpt")
    with pytest.raises(tinynn.TinynnError):
        tinynn.Trainer(model, targets="nope")
    with pytest.raises(ValueError):
        tinynn.Trainer(model, optimizer="adam9")


def test_schedules(model):
    ids = windows(model, 4)
    t = tinynn.Trainer(model, rank=2, seq=SEQ, batch=1, lr=1e-2, schedule="cosine", warmup=2,
                       total_steps=4, min_lr=1e-3)
    rates = []
    for b in ids:
        rates.append(t.lr)
        t.step(b)
    rates.append(t.lr)
    assert rates[0] == pytest.approx(5e-3) and rates[2] == pytest.approx(1e-2)
    assert rates[1] == pytest.approx(1e-2) and rates[4] == pytest.approx(1e-3) and rates[3] < rates[2]
    t.lr = 2e-3
    assert t.lr == pytest.approx(2e-3)
    with pytest.raises(ValueError):
        tinynn.Trainer(model, schedule="cosine", warmup=9, total_steps=4)
    with pytest.raises(ValueError):
        tinynn.Trainer(model, schedule="exponential")


def test_finetune_with_progress(model, tmp_path):
    seen = []
    text = tmp_path / "data.txt"
    text.write_text(open("/usr/share/common-licenses/GPL-3").read()[:12000])
    result = tinynn.finetune(model, str(text), tmp_path / "run", steps=3, seq=SEQ, batch=2,
                             lr=1e-3, progress=seen.append)
    assert result["steps"] == 3 and [m["step"] for m in seen] == [1, 2, 3]
    assert all(m["loss"] > 0 for m in seen)
    assert os.path.isfile(tmp_path / "run" / "adapter.gguf")

    def boom(m):
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        tinynn.finetune(model, str(text), tmp_path / "run2", steps=3, seq=SEQ, batch=2, progress=boom)


def test_full_fine_tuning_of_a_tiny_model(tmp_path):
    fixtures = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "tinynn-models",
                            "tests", "fixtures", "tiny-llama")
    gguf = tmp_path / "tiny.gguf"
    subprocess.run([os.environ.get("TINYNN_TNN", "tnn"), "convert", fixtures, str(gguf), "F32"],
                   check=True, capture_output=True)
    tiny = tinynn.Model(str(gguf), n_ctx=64)
    t = tinynn.Trainer(tiny, lora=False, optimizer="sgd", seq=16, batch=2, lr=0.05)
    ids = [(i * 7 + 3) % 200 for i in range(32)]
    first = t.step(ids)
    for _ in range(5):
        last = t.step(ids)
    assert last < first
    t.export(tmp_path / "tuned.gguf")
    tuned = tinynn.Model(str(tmp_path / "tuned.gguf"), n_ctx=64)
    assert tuned.logits(ids[:8]).shape == (8, tuned.n_vocab)


def test_f32_backward_keeps_the_f32_gradient_products(model):
    # QLoRA on the Q4_1 model: int8 gradient products through the base by default, f32 with
    # f32_backward. The first step's loss (before any update) is the same; later ones differ
    # a little (the int8 products need AVX2).
    batches = windows(model, 3)
    kw = dict(rank=4, seq=SEQ, batch=1, lr=3e-3, targets="q,v", seed=3)
    int8 = tinynn.Trainer(model, **kw)
    f32 = tinynn.Trainer(model, f32_backward=True, **kw)
    a = [int8.step(x) for x in batches]
    b = [f32.step(x) for x in batches]
    assert a[0] == b[0]
    assert a[1:] != b[1:]
    assert all(abs(x - y) < 0.02 * y for x, y in zip(a, b))
