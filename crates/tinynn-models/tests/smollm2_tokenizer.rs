//! The SmolLM2 tokenizer built from GGUF metadata: the reference ids (llama.cpp's),
//! special tokens, and exact round trips. `scripts/make-real-model-constants.py` recomputes every
//! id list here with llama.cpp and says whether they still match.

use tinynn_format::gguf::GgufFile;
use tinynn_format::model_cache::require_default_model;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;

fn tokenizer() -> (GgufFile, Tokenizer) {
    let file = GgufFile::open(require_default_model().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    (file, tok)
}

#[test]
fn reference_ids() {
    let (_, tok) = tokenizer();
    let cases: [(&str, &[u32]); 2] = [
        (
            "Hello world! The quick brown fox jumps over the lazy dog.",
            &[
                19556, 905, 17, 378, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30,
            ],
        ),
        ("The capital of France is", &[504, 3575, 282, 4649, 314]),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), ids, "{text:?}");
    }
    // Digits are split one by one (the smollm pre-tokenizer).
    let digits = tok.encode("311", false).unwrap();
    assert_eq!(digits.len(), 3);
    // Control tokens are matched whole.
    let chat = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!((chat[0], *chat.last().unwrap()), (1, 2));
    assert!(tok.is_end(2) || tok.is_end(0));
}

/// Ids from llama.cpp's own tokenizer (commit 0c1e570, `llama_tokenize` with add_special and
/// parse_special false, on this GGUF): the `smollm` pre-tokenizer splits every `\p{N}` off first,
/// then applies GPT-2's pattern to each stretch between digits. So a whitespace run in front of a
/// digit stays one piece ("\n\n  " is one token, 39892) where plain GPT-2 splitting would give
/// "\n\n " + " " + "0" (transformers' GGUF loader does that: 8866, 216, 32); and whitespace
/// runs, CRLF, contractions, non-ASCII digits and spaces, marks, emoji and control bytes.
const LLAMA_CPP_IDS: [(&str, &[u32]); 25] = [
    ("\n\n  0. Definitions.", &[39892, 32, 30, 39331, 30]),
    ("a\n\n\n  b", &[81, 1116, 3805, 278]),
    ("a \n b", &[81, 3717, 278]),
    ("  \t  \n\t x", &[256, 197, 256, 3354, 1792]),
    ("trailing   ", &[4861, 4966, 333]),
    ("   leading", &[256, 2899]),
    ("line\r\nCRLF\r\n", &[1311, 201, 198, 9088, 60, 54, 2738]),
    ("a  1  b  2", &[81, 256, 33, 216, 278, 256, 34]),
    ("1 2  3   4", &[33, 216, 34, 256, 35, 333, 36]),
    (
        "3.14159 and 1,000,000",
        &[
            35, 30, 33, 36, 33, 37, 41, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32,
        ],
    ),
    (
        "don't I'M we'LL they'Re it's 'S ''s",
        &[
            12420, 982, 339, 23, 61, 392, 23, 16421, 502, 23, 3733, 357, 506, 637, 67, 10922, 99,
        ],
    ),
    ("’s curly’d", &[417, 99, 46204, 417, 84]),
    (
        "٣٤٥ arabic-indic",
        &[164, 113, 164, 114, 164, 115, 46179, 286, 29, 526, 286],
    ),
    (
        "x²+y³ ½ ¼",
        &[104, 19133, 27, 105, 39050, 216, 16738, 216, 28151],
    ),
    ("Ⅻ roman ⅻ", &[173, 223, 121, 41800, 216, 173, 223, 136]),
    (
        "１２３ fullwidth",
        &[8083, 235, 8083, 236, 8083, 237, 2073, 6930],
    ),
    (
        "nbsp\u{a0}here \u{a0} x",
        &[94, 32093, 15442, 1531, 3351, 250, 1792],
    ),
    ("ideo\u{3000}space", &[8496, 12109, 218, 11602]),
    ("nel\u{85}x", &[5824, 141, 223, 104]),
    ("zw\u{200b}sp", &[106, 103, 321, 229, 2401]),
    (
        "e\u{301} combining cafe\u{301}",
        &[85, 151, 219, 9301, 1020, 4565, 151, 219],
    ),
    (
        "naïve café — 東京 🦀",
        &[
            3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 15107, 116, 218,
        ],
    ),
    (
        "👍🏽🇺🇸 ❤\u{fe0f} 👨\u{200d}👩\u{200d}👧",
        &[
            10813, 235, 231, 10813, 233, 138, 10813, 225, 135, 10813, 225, 133, 4636, 247, 114,
            31752, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117,
        ],
    ),
    ("ctrl\u{0}\u{1b}[0m x", &[39673, 190, 212, 75, 32, 93, 1792]),
    (
        "unassigned\u{378} pua\u{e000}",
        &[419, 520, 8539, 152, 133, 5154, 81, 185, 218, 218],
    ),
];

#[test]
fn smollm_pre_tokenizer_matches_llama_cpp() {
    let (_, tok) = tokenizer();
    for (text, ids) in LLAMA_CPP_IDS {
        assert_eq!(tok.encode(text, false).unwrap(), ids, "{text:?}");
        assert_eq!(tok.decode(ids).unwrap(), text);
    }
}

/// The GPL-3 text (no BOS) as llama.cpp 0c1e570 tokenizes it: 7639 tokens (transformers' GGUF
/// loader, which drops the digit split, gives 7658), its first 16 ids, and a hash of all of them
/// (h = h·1000003 + id, wrapping) so any single differing id shows.
#[test]
fn gpl3_matches_llama_cpp() {
    let (_, tok) = tokenizer();
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3")
        .expect("the GPL-3 text (Debian's base-files) is part of the test data");
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(ids.len(), 7639);
    assert_eq!(
        ids[..16],
        [
            42185, 28807, 35185, 49126, 35696, 45581, 41026, 16997, 13867, 216, 35, 28, 216, 34,
            41, 4019
        ]
    );
    // Position 795 is the first where the plain GPT-2 split would differ ("\n\n  0.").
    assert_eq!(ids[795..800], [39892, 32, 30, 39331, 30]);
    let hash = ids.iter().fold(0u64, |h, &id| {
        h.wrapping_mul(1_000_003).wrapping_add(id as u64)
    });
    assert_eq!(hash, 3_431_049_110_681_978_250);
}

#[test]
fn round_trips_exactly() {
    let (file, tok) = tokenizer();
    let vocab = Vocab::from_gguf(file.gguf()).unwrap();
    let texts = [
        std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap_or_default(),
        "naïve café — 東京 🦀 \t\n  spaces   and\r\nCRLF 12345".to_string(),
    ];
    assert!(
        texts[0].len() > 30_000,
        "the GPL-3 text is part of the test data (Debian's base-files)"
    );
    for text in &texts {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(&tok.decode(&ids).unwrap(), text);
        // Our own byte-level detokenizer agrees, and streaming never splits a character.
        assert_eq!(String::from_utf8(vocab.decode(&ids)).unwrap(), *text);
        let mut stream = tok.text_stream(&[]);
        let mut out = String::new();
        for &id in &ids {
            let piece = stream.step(&tok, id).unwrap();
            assert!(!piece.contains('\u{FFFD}'), "{text:?}: {piece:?}");
            out.push_str(&piece);
        }
        out.push_str(&stream.finish(&tok).unwrap());
        assert_eq!(&out, text);
    }
}

#[test]
fn text_stream_holds_partial_characters() {
    let (_, tok) = tokenizer();
    // Byte-level pieces of "🦀" (four bytes over several tokens), then "a" and a lone lead
    // byte that never completes.
    let crab = tok.encode("🦀", false).unwrap();
    assert!(crab.len() > 1, "{crab:?}");
    let mut s = tok.text_stream(&[]);
    let (last, first) = crab.split_last().unwrap();
    for &id in first {
        assert_eq!(s.step(&tok, id).unwrap(), "");
    }
    assert_eq!(s.step(&tok, *last).unwrap(), "🦀");
    let a = tok.encode("a", false).unwrap();
    assert_eq!(s.step(&tok, a[0]).unwrap(), "a");
    let lead = tok.encode("我", false).unwrap()[0];
    assert_eq!(s.step(&tok, lead).unwrap(), "");
    assert_eq!(s.finish(&tok).unwrap(), "\u{FFFD}");
}
