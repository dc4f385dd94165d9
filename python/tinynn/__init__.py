"""tinynn: run, fine-tune and build transformer language models on the CPU.

    import tinynn
    model = tinynn.Model()                 # the default model (tnn pull smollm2), or a path
    for piece in model.generate("The capital of France is", max_tokens=32):
        print(piece, end="", flush=True)

- ``Model``: generation and chat (streamed), tokens, embeddings and logits (numpy),
  perplexity.
- ``Trainer`` (step by step) and ``finetune`` (the training loop, with a progress callback):
  full fine-tuning or LoRA / QLoRA.
- ``Graph``: build a model from ops, backward, an AdamW / SGD step, numpy in and out.
"""

from ._tinynn import (  # noqa: F401
    Generation,
    Graph,
    Model,
    Trainer,
    TinynnError,
    __version__,
    default_model,
    finetune,
)

__all__ = [
    "Generation",
    "Graph",
    "Model",
    "Trainer",
    "TinynnError",
    "__version__",
    "default_model",
    "finetune",
]
