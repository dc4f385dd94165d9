#!/usr/bin/env python3
"""A SentencePiece (Llama-2 style) vocabulary in a GGUF file, with the ids sentencepiece gives for
a few texts, for tinynn's `tokenizer.ggml.model = llama` tokenizer tests.

    pip install sentencepiece gguf numpy
    python3 scripts/make-spm-fixture.py crates/tinynn-models/tests/fixtures

Trains a 400-piece BPE model with byte fallback on Debian's GPL-3 text, writes
`spm-vocab.gguf` (tokens, scores, token types, BOS/EOS/UNK, no tensors) and `spm-ids.json`.
"""
import json
import os
import sys
import tempfile

import sentencepiece as spm
from gguf import GGUFWriter

out = sys.argv[1]
with tempfile.TemporaryDirectory() as tmp:
    prefix = os.path.join(tmp, "m")
    spm.SentencePieceTrainer.train(
        input="/usr/share/common-licenses/GPL-3", model_prefix=prefix, vocab_size=400,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, bos_id=1, eos_id=2,
        unk_id=0, pad_id=-1, minloglevel=2,
        # As Llama's tokenizer: no normalization, whitespace kept.
        normalization_rule_name="identity", remove_extra_whitespaces=False)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")

tokens, scores, types = [], [], []
for i in range(sp.get_piece_size()):
    tokens.append(sp.id_to_piece(i))
    scores.append(sp.get_score(i))
    types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1)

w = GGUFWriter(os.path.join(out, "spm-vocab.gguf"), arch="llama")
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)
w.add_add_bos_token(True)
w.add_add_space_prefix(True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

texts = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "the GNU General Public License, version 3",
    "  leading spaces, tabs\tand\nnewlines",
    "naïve café 東京 🦀 12345",
]
with open(os.path.join(out, "spm-ids.json"), "w") as f:
    json.dump([{"text": t, "ids": sp.encode(t)} for t in texts], f, ensure_ascii=False, indent=1)
print(len(tokens), [sp.encode(t)[:8] for t in texts])
