//! Hostile GGUF files for tests and fuzz seeds: every truncation of a small valid file, the
//! shapes of known ggml GGUF CVEs (huge counts and lengths, overflowing dims, wrapping offsets,
//! bad type ids, bad alignment), and corrupted counts, types and offsets.
//!
//! Each case says which error it must produce (`expect`, an error code from
//! [`GgufErrorKind::code`](crate::GgufErrorKind::code)), or `None` when any typed error will do.

use crate::ggml_type::GgmlType;
use crate::gguf::{Array, GgufString, GgufWriter, Value};

/// One malformed file.
pub struct Case {
    pub name: String,
    pub bytes: Vec<u8>,
    pub expect: Option<&'static str>,
}

/// Builds GGUF bytes field by field, with no checks, to express any malformation.
#[derive(Clone, Default)]
pub struct RawGguf {
    pub buf: Vec<u8>,
}

impl RawGguf {
    /// Magic, version and the two counts.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> RawGguf {
        RawGguf::default()
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }

    pub fn bytes(mut self, b: &[u8]) -> Self {
        self.buf.extend_from_slice(b);
        self
    }

    pub fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn string(self, s: &[u8]) -> Self {
        self.u64(s.len() as u64).bytes(s)
    }

    /// A key followed by a value type id (the value itself comes next).
    pub fn key(self, key: &str, value_type: u32) -> Self {
        self.string(key.as_bytes()).u32(value_type)
    }

    pub fn kv_u32(self, key: &str, v: u32) -> Self {
        self.key(key, 4).u32(v)
    }

    /// A tensor info: name, n_dims, dims, type id, offset.
    pub fn tensor(self, name: &[u8], dims: &[u64], type_id: u32, offset: u64) -> Self {
        let mut r = self.string(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }

    /// Zero padding up to a multiple of `alignment`, then `data_len` zero bytes of data.
    pub fn data(mut self, alignment: usize, data_len: usize) -> Self {
        let pad = self.buf.len().next_multiple_of(alignment) - self.buf.len();
        self.buf.resize(self.buf.len() + pad + data_len, 0);
        self
    }

    pub fn done(self) -> Vec<u8> {
        self.buf
    }
}

/// A small valid file using every value type, nested arrays and three tensors. Its last tensor
/// ends exactly at the end of the file, so every strict truncation of it is invalid.
pub fn valid_small_file() -> Vec<u8> {
    static A: [u8; 32] = [1; 32];
    static B: [u8; 36] = [2; 36];
    static C: [u8; 32] = [3; 32];
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.set("general.alignment", Value::U32(32));
    w.set("test.u8", Value::U8(7));
    w.set("test.i8", Value::I8(-7));
    w.set("test.u16", Value::U16(700));
    w.set("test.i16", Value::I16(-700));
    w.set("test.u32", Value::U32(70_000));
    w.set("test.i32", Value::I32(-70_000));
    w.set("test.f32", Value::F32(0.5));
    w.set("test.bool", Value::Bool(true));
    w.set_str("test.string", "héllo");
    w.set("test.u64", Value::U64(1 << 40));
    w.set("test.i64", Value::I64(-(1 << 40)));
    w.set("test.f64", Value::F64(-0.25));
    w.set(
        "test.strings",
        Value::Array(Array::String(vec![
            GgufString::from("a"),
            GgufString::from("bc"),
        ])),
    );
    w.set(
        "test.nested",
        Value::Array(Array::Array(vec![
            Array::I32(vec![1, 2]),
            Array::I32(vec![3]),
            Array::F32(vec![]),
        ])),
    );
    w.set("test.bools", Value::Array(Array::Bool(vec![true, false])));
    // The data is static and sized for each type, so these adds cannot fail.
    let added = [
        w.add_tensor("t.alpha", GgmlType::F32, &[8], &A),
        w.add_tensor("t.beta", GgmlType::Q4_0, &[32, 2], &B[..36]),
        w.add_tensor("t.gamma", GgmlType::F16, &[16], &C),
    ];
    debug_assert!(added.iter().all(Result::is_ok));
    let mut out = Vec::new();
    let _ = w.write_to(&mut out);
    out
}

fn case(name: impl Into<String>, bytes: Vec<u8>, expect: &'static str) -> Case {
    Case {
        name: name.into(),
        bytes,
        expect: Some(expect),
    }
}

/// One tensor info after an empty metadata section, with `data_len` bytes of data.
fn one_tensor(name: &[u8], dims: &[u64], type_id: u32, offset: u64, data_len: usize) -> Vec<u8> {
    RawGguf::header(3, 1, 0)
        .tensor(name, dims, type_id, offset)
        .data(32, data_len)
        .done()
}

fn header_cases(out: &mut Vec<Case>) {
    out.push(case("empty_file", vec![], "UnexpectedEof"));
    out.push(case("magic_only", b"GGUF".to_vec(), "UnexpectedEof"));
    out.push(case(
        "bad_magic",
        RawGguf::default()
            .bytes(b"GGML")
            .u32(3)
            .u64(0)
            .u64(0)
            .done(),
        "BadMagic",
    ));
    for v in [0u32, 1, 4, 0xFFFF_FFFF] {
        out.push(case(
            format!("version_{v}"),
            RawGguf::header(v, 0, 0).done(),
            "UnsupportedVersion",
        ));
    }
    out.push(case(
        "big_endian_v3",
        RawGguf::header(3u32.swap_bytes(), 0, 0).done(),
        "BigEndian",
    ));
    for (label, n) in [
        ("u64_max", u64::MAX),
        ("2e62", 1 << 62),
        ("2e59_times_min_wraps", 1 << 59),
        ("2e32", 1 << 32),
        ("1000", 1000),
    ] {
        let pad = vec![0u8; 64];
        out.push(case(
            format!("n_tensors_{label}"),
            RawGguf::header(3, n, 0).bytes(&pad).done(),
            "CountTooLarge",
        ));
        out.push(case(
            format!("n_kv_{label}"),
            RawGguf::header(3, 0, n).bytes(&pad).done(),
            "CountTooLarge",
        ));
    }
}

fn metadata_cases(out: &mut Vec<Case>) {
    let kv = |tail: RawGguf| RawGguf::header(3, 0, 1).bytes(&tail.buf).done();
    for (label, n) in [("u64_max", u64::MAX), ("2e63", 1 << 63), ("past_end", 100)] {
        let key = RawGguf::default().u64(n).bytes(&[b'k'; 16]);
        out.push(case(format!("key_len_{label}"), kv(key), "LengthTooLarge"));
        let s = RawGguf::default().key("k", 8).u64(n).bytes(b"abc");
        out.push(case(
            format!("string_value_len_{label}"),
            kv(s),
            "LengthTooLarge",
        ));
    }
    // Arrays: element type, then count.
    for (label, ty, n) in [
        ("u8_u64_max", 0, u64::MAX),
        ("u64_2e62_bytes_wrap", 10, 1 << 62),
        ("f32_2e61", 6, 1 << 61),
        ("strings_2e60", 8, 1 << 60),
        ("strings_1000", 8, 1000),
        ("arrays_2e59", 9, 1 << 59),
        ("bool_u64_max", 7, u64::MAX),
    ] {
        let a = RawGguf::default()
            .key("arr", 9)
            .u32(ty)
            .u64(n)
            .bytes(&[0; 16]);
        out.push(case(format!("array_len_{label}"), kv(a), "CountTooLarge"));
    }
    let bad_elem = RawGguf::default().key("arr", 9).u32(13).u64(1).u32(0);
    out.push(case(
        "array_element_type_13",
        kv(bad_elem),
        "UnknownValueType",
    ));
    let mut deep = RawGguf::default().key("deep", 9);
    for _ in 0..100 {
        deep = deep.u32(9).u64(1);
    }
    out.push(case(
        "array_nesting_100",
        kv(deep.u32(0).u64(0)),
        "NestingTooDeep",
    ));
    for (label, ty) in [("13", 13u32), ("u32_max", u32::MAX)] {
        out.push(case(
            format!("value_type_{label}"),
            kv(RawGguf::default().key("k", ty).u32(0)),
            "UnknownValueType",
        ));
    }
    out.push(case(
        "bool_value_2",
        kv(RawGguf::default().key("b", 7).bytes(&[2])),
        "InvalidBool",
    ));
    out.push(case(
        "bool_array_value_9",
        kv(RawGguf::default().key("b", 9).u32(7).u64(2).bytes(&[1, 9])),
        "InvalidBool",
    ));
    out.push(case(
        "key_invalid_utf8",
        kv(RawGguf::default().string(&[0xff, 0xfe]).u32(0).bytes(&[0])),
        "InvalidUtf8",
    ));
    out.push(case(
        "key_empty",
        kv(RawGguf::default().string(b"").u32(0).bytes(&[0])),
        "EmptyName",
    ));
    let dup = RawGguf::header(3, 0, 2)
        .key("k", 0)
        .bytes(&[1])
        .key("k", 0)
        .bytes(&[2])
        .done();
    out.push(case("duplicate_key", dup, "DuplicateKey"));
    for (label, a) in [
        ("0", 0u32),
        ("2e31", 1 << 31),
        ("3", 3),
        ("2e21", 1 << 21),
        ("u32_max", u32::MAX),
    ] {
        let bytes = RawGguf::header(3, 0, 1)
            .kv_u32("general.alignment", a)
            .done();
        out.push(case(format!("alignment_{label}"), bytes, "BadAlignment"));
    }
    let a64 = RawGguf::header(3, 0, 1)
        .key("general.alignment", 10)
        .u64(32)
        .done();
    out.push(case("alignment_as_u64", a64, "WrongValueType"));
    let astr = RawGguf::header(3, 0, 1)
        .key("general.alignment", 8)
        .string(b"32")
        .done();
    out.push(case("alignment_as_string", astr, "WrongValueType"));
}

fn tensor_cases(out: &mut Vec<Case>) {
    let f32_id = GgmlType::F32.id();
    for (label, n) in [("5", 5u32), ("u32_max", u32::MAX)] {
        let bytes = RawGguf::header(3, 1, 0)
            .string(b"t")
            .u32(n)
            .bytes(&[1; 48])
            .done();
        out.push(case(format!("n_dims_{label}"), bytes, "TooManyDims"));
    }
    let zero_dims = RawGguf::header(3, 1, 0)
        .string(b"t")
        .u32(0)
        .u32(0)
        .u64(0)
        .data(32, 4)
        .done();
    out.push(case("n_dims_0", zero_dims, "NoDims"));
    for (label, dims) in [
        ("dim_zero", vec![4, 0]),
        ("dim_u64_max_negative", vec![u64::MAX]),
        ("dim_2e63", vec![1 << 63]),
    ] {
        out.push(case(
            label,
            one_tensor(b"t", &dims, f32_id, 0, 64),
            "BadDim",
        ));
    }
    for (label, dims) in [
        ("dims_product_wraps_2e96", vec![1 << 32, 1 << 32, 1 << 32]),
        ("dims_product_wraps_to_small", vec![1 << 62, 4, 1]),
        ("dims_product_2e63", vec![1 << 40, 1 << 23]),
        (
            "dims_product_four_way",
            vec![1 << 16, 1 << 16, 1 << 16, 1 << 16],
        ),
    ] {
        out.push(case(
            label,
            one_tensor(b"t", &dims, f32_id, 0, 64),
            "SizeOverflow",
        ));
    }
    // The element count fits in i64, the byte count (8 bytes each) does not fit in u64.
    let f64_id = GgmlType::F64.id();
    out.push(case(
        "f64_bytes_overflow",
        one_tensor(b"t", &[1 << 62], f64_id, 0, 64),
        "SizeOverflow",
    ));
    for (label, id, expect) in [
        ("type_removed_q4_2", 4u32, "RemovedTensorType"),
        ("type_removed_q4_0_4_4", 31, "RemovedTensorType"),
        ("type_unknown_1000", 1000, "UnknownTensorType"),
        ("type_unknown_u32_max", u32::MAX, "UnknownTensorType"),
    ] {
        out.push(case(label, one_tensor(b"t", &[32], id, 0, 256), expect));
    }
    out.push(case(
        "row_not_block_multiple",
        one_tensor(b"t", &[33], GgmlType::Q4_0.id(), 0, 64),
        "NotBlockMultiple",
    ));
    // Offsets: 8 f32 = 32 bytes of data present.
    for (label, off, expect) in [
        (
            "offset_u64_max_aligned_wraps",
            u64::MAX - 31,
            "TensorOutOfBounds",
        ),
        (
            "offset_padded_sum_wraps",
            (u64::MAX / 32) * 32,
            "TensorOutOfBounds",
        ),
        ("offset_2e63", 1 << 63, "TensorOutOfBounds"),
        ("offset_past_end", 64, "TensorOutOfBounds"),
        ("offset_misaligned", 1, "MisalignedOffset"),
        ("offset_u64_max", u64::MAX, "MisalignedOffset"),
    ] {
        out.push(case(label, one_tensor(b"t", &[8], f32_id, off, 32), expect));
    }
    let overlap = RawGguf::header(3, 2, 0)
        .tensor(b"x", &[16], f32_id, 0)
        .tensor(b"y", &[8], f32_id, 32)
        .data(32, 96)
        .done();
    out.push(case("tensors_overlap", overlap, "TensorsOverlap"));
    let dup = RawGguf::header(3, 2, 0)
        .tensor(b"x", &[8], f32_id, 0)
        .tensor(b"x", &[8], f32_id, 32)
        .data(32, 64)
        .done();
    out.push(case("duplicate_tensor_name", dup, "DuplicateTensor"));
    out.push(case(
        "name_64_bytes",
        one_tensor(&[b'n'; 64], &[8], f32_id, 0, 32),
        "NameTooLong",
    ));
    out.push(case(
        "name_empty",
        one_tensor(b"", &[8], f32_id, 0, 32),
        "EmptyName",
    ));
    out.push(case(
        "name_invalid_utf8",
        one_tensor(&[0xc3, 0x28], &[8], f32_id, 0, 32),
        "InvalidUtf8",
    ));
    let huge_name = RawGguf::header(3, 1, 0)
        .u64(u64::MAX)
        .bytes(&[0; 40])
        .done();
    out.push(case("name_len_u64_max", huge_name, "LengthTooLarge"));
    let mut past_end = RawGguf::header(3, 1, 0)
        .tensor(b"t", &[8], f32_id, 0)
        .done();
    past_end.push(0); // data section would start at 64, the file ends at 58
    out.push(case(
        "data_section_past_end",
        past_end,
        "DataSectionPastEnd",
    ));
}

/// Byte position right after the first occurrence of the string field `name` (its length + bytes).
fn after_string(file: &[u8], name: &[u8]) -> Option<usize> {
    let mut field = (name.len() as u64).to_le_bytes().to_vec();
    field.extend_from_slice(name);
    file.windows(field.len())
        .position(|w| w == field)
        .map(|p| p + field.len())
}

fn patched(file: &[u8], at: usize, bytes: &[u8]) -> Vec<u8> {
    let mut f = file.to_vec();
    f[at..at + bytes.len()].copy_from_slice(bytes);
    f
}

/// Corrupted counts, types and offsets of the valid small file.
fn corruption_cases(valid: &[u8], out: &mut Vec<Case>) {
    let n_tensors = u64::from_le_bytes(valid[8..16].try_into().unwrap_or_default());
    let n_kv = u64::from_le_bytes(valid[16..24].try_into().unwrap_or_default());
    out.push(Case {
        name: "corrupt_n_tensors_plus_one".into(),
        bytes: patched(valid, 8, &(n_tensors + 1).to_le_bytes()),
        expect: None,
    });
    out.push(Case {
        name: "corrupt_n_kv_plus_one".into(),
        bytes: patched(valid, 16, &(n_kv + 1).to_le_bytes()),
        expect: None,
    });
    out.push(Case {
        name: "corrupt_n_kv_minus_one".into(),
        bytes: patched(valid, 16, &(n_kv - 1).to_le_bytes()),
        expect: None,
    });
    // Tensor infos: name, n_dims (u32), dims (u64 each), type (u32), offset (u64).
    for (name, n_dims) in [(&b"t.alpha"[..], 1usize), (b"t.beta", 2), (b"t.gamma", 1)] {
        let Some(p) = after_string(valid, name) else {
            continue;
        };
        let label = String::from_utf8_lossy(name);
        let type_at = p + 4 + 8 * n_dims;
        let offset_at = type_at + 4;
        out.push(case(
            format!("corrupt_{label}_n_dims_9"),
            patched(valid, p, &9u32.to_le_bytes()),
            "TooManyDims",
        ));
        out.push(case(
            format!("corrupt_{label}_dim0_zero"),
            patched(valid, p + 4, &0u64.to_le_bytes()),
            "BadDim",
        ));
        out.push(case(
            format!("corrupt_{label}_type_1000"),
            patched(valid, type_at, &1000u32.to_le_bytes()),
            "UnknownTensorType",
        ));
        out.push(case(
            format!("corrupt_{label}_type_removed"),
            patched(valid, type_at, &5u32.to_le_bytes()),
            "RemovedTensorType",
        ));
        let off = u64::from_le_bytes(
            valid[offset_at..offset_at + 8]
                .try_into()
                .unwrap_or_default(),
        );
        out.push(case(
            format!("corrupt_{label}_offset_plus_1"),
            patched(valid, offset_at, &(off + 1).to_le_bytes()),
            "MisalignedOffset",
        ));
        out.push(case(
            format!("corrupt_{label}_offset_plus_2e40"),
            patched(valid, offset_at, &(off + (1 << 40)).to_le_bytes()),
            "TensorOutOfBounds",
        ));
    }
}

/// The whole corpus: CVE shapes, corruptions, then every truncation of [`valid_small_file`].
pub fn cases() -> Vec<Case> {
    let valid = valid_small_file();
    let mut out = Vec::new();
    header_cases(&mut out);
    metadata_cases(&mut out);
    tensor_cases(&mut out);
    corruption_cases(&valid, &mut out);
    for len in 0..valid.len() {
        out.push(Case {
            name: format!("truncated_at_{len:04}"),
            bytes: valid[..len].to_vec(),
            expect: None,
        });
    }
    out
}

/// The files of the committed fuzz corpus `fuzz/corpus/NAME` (the seeds and what `cargo fuzz`
/// kept), as (path, bytes), sorted by path, for the tests that replay them. Panics when the
/// folder is missing or empty: a replay of nothing would pass without testing anything.
pub fn fuzz_corpus(name: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .path()
        })
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no files in {}", dir.display());
    files
}
