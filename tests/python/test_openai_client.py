"""The official `openai` Python client against `tnn serve` on the default model.

`scripts/test-openai-client.sh` starts the server and passes its address in TINYNN_SERVER.
"""

import base64
import json
import os
import struct
import urllib.request

import openai
import pytest

BASE = os.environ["TINYNN_SERVER"]


def post(path, body):
    req = urllib.request.Request(
        BASE + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer test-key"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def client():
    return openai.OpenAI(base_url=f"{BASE}/v1", api_key="test-key", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    models = client.models.list().data
    assert len(models) == 1
    return models[0].id


def chat(client, model, **kw):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name three colors."}],
        temperature=0,
        max_tokens=16,
        **kw,
    )


def test_models_lists_the_served_file(model):
    assert model.endswith(".gguf")


def test_chat_streaming_equals_non_streaming(client, model):
    whole = chat(client, model)
    text = whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant"
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    pieces = []
    usage = None
    for chunk in chat(client, model, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
    assert "".join(pieces) == text
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_completions_usage_and_length(client, model):
    r = client.completions.create(model=model, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.usage.completion_tokens <= 5
    assert r.choices[0].text
    tok = post("/tokenize", {"content": "The capital of France is", "add_special": True})
    assert r.usage.prompt_tokens == len(tok["tokens"])


def test_stop_string_is_not_output(client, model):
    full = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert " 6" in full, full
    r = client.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[" 6"])
    assert r.choices[0].text == full[: full.index(" 6")]
    assert r.choices[0].finish_reason == "stop"


def test_seed_reproduces_and_n_gives_choices(client, model):
    kw = dict(model=model, prompt="My favourite food is", max_tokens=10, temperature=1.0, seed=7, n=2)
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len(a.choices) == 2


def test_chat_logprobs(client, model):
    r = chat(client, model, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5  # greedy takes the best


def test_embeddings_float_and_base64(client, model):
    r = client.embeddings.create(model=model, input=["hello world", "a cat"], encoding_format="float")
    assert [d.index for d in r.data] == [0, 1]
    v = r.data[0].embedding
    assert abs(sum(x * x for x in v) - 1.0) < 1e-3
    raw = client.post(
        "/embeddings", body={"model": model, "input": "hello world", "encoding_format": "base64"}, cast_to=object
    )
    b = base64.b64decode(raw["data"][0]["embedding"])
    w = struct.unpack(f"<{len(b) // 4}f", b)
    assert max(abs(x - y) for x, y in zip(v, w)) < 1e-6
    assert r.usage.prompt_tokens > 0


def test_errors_are_openai_errors(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="x", top_p=2.0)
    assert "top_p" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="no-such-model", prompt="x")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="word " * 5000, max_tokens=1)
    assert "context" in str(e.value)
    bad = openai.OpenAI(base_url=f"{BASE}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
