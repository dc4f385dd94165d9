//! GGUF parsing (versions 2 and 3) over an untrusted byte slice.
//!
//! Layout: magic "GGUF", u32 version, u64 n_tensors, u64 n_kv, then n_kv key/value pairs, then
//! n_tensors tensor infos (name, n_dims, dims, type, offset), padding to the alignment, and the
//! data section. Every count is checked against the bytes left before anything is allocated,
//! every size is computed with overflow checks, and tensor ranges must be aligned, inside the
//! data section and disjoint.

use std::collections::{HashMap, HashSet};

use super::keys::Key;
use super::value::{Array, GgufString, Value, ValueType};
use crate::cursor::Cursor;
use crate::error::{GgufError, GgufErrorKind};
use crate::ggml_type::{GgmlType, TypeId};

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
pub const MAX_ALIGNMENT: u64 = 1 << 20;
pub const MAX_DIMS: usize = 4;
/// ggml keeps names in 64-byte buffers with a terminating NUL.
pub const MAX_NAME_LEN: u64 = 63;
/// Deepest nesting of arrays we accept (real files use at most 2).
pub const MAX_ARRAY_DEPTH: usize = 8;
/// Smallest tensor info: name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;
/// Smallest key/value pair: key length (8) + value type (4) + a one-byte value.
const MIN_KV_BYTES: u64 = 13;

/// One metadata entry and the byte offset where its value starts.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    pub key: String,
    pub value: Value,
    pub value_offset: u64,
}

/// Where and what a tensor is. `dims` are in ggml order: `dims[0]` is the row length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

/// `split.*` keys of a model sharded over several files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    pub index: u64,
    pub count: u64,
    pub total_tensors: Option<u64>,
}

/// The parsed header of a GGUF file: metadata, tensor infos and the data section's position.
#[derive(Debug, Clone)]
pub struct Gguf {
    version: u32,
    metadata: Vec<KeyValue>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
    data_len: u64,
}

type FieldFn<'f> = &'f dyn Fn() -> String;

impl Gguf {
    /// Parses and validates a whole GGUF file held in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut c = Cursor::new(bytes);
        let magic: [u8; 4] = c.array(|| "header.magic".into())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::new(
                0,
                "header.magic",
                GgufErrorKind::BadMagic { found: magic },
            ));
        }
        let version = c.u32(|| "header.version".into())?;
        match version {
            2 | 3 => {}
            v if (1..=3).contains(&v.swap_bytes()) => {
                return Err(GgufError::new(
                    4,
                    "header.version",
                    GgufErrorKind::BigEndian,
                ));
            }
            v => {
                return Err(GgufError::new(
                    4,
                    "header.version",
                    GgufErrorKind::UnsupportedVersion(v),
                ));
            }
        }
        let n_tensors = c.count(MIN_TENSOR_INFO_BYTES, || "header.n_tensors".into())?;
        let n_kv = c.count(MIN_KV_BYTES, || "header.n_kv".into())?;

        let metadata = read_metadata(&mut c, n_kv)?;
        let mut key_index = HashMap::with_capacity(metadata.len());
        for (i, kv) in metadata.iter().enumerate() {
            key_index.insert(kv.key.clone(), i);
        }
        let alignment = read_alignment(&metadata, &key_index)?;

        let (tensors, offset_fields) = read_tensor_infos(&mut c, n_tensors)?;
        let tensor_index: HashMap<String, usize> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();

        let file_len = bytes.len() as u64;
        let infos_end = c.pos();
        let data_offset = infos_end.div_ceil(alignment) * alignment;
        let data_len = if data_offset <= file_len {
            file_len - data_offset
        } else if tensors.is_empty() {
            0
        } else {
            return Err(GgufError::new(
                infos_end,
                "data section",
                GgufErrorKind::DataSectionPastEnd {
                    start: data_offset,
                    file_len,
                },
            ));
        };
        check_tensor_ranges(&tensors, &offset_fields, alignment, data_len)?;

        Ok(Gguf {
            version,
            metadata,
            key_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
            data_len,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Bytes from the start of the data section to the end of the file.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[KeyValue] {
        &self.metadata
    }

    /// A metadata value by its exact key string.
    pub fn get_raw(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].value)
    }

    fn entry(&self, key: Key) -> Option<&KeyValue> {
        let name = match (key.is_arch_scoped(), self.architecture()) {
            (true, Some(arch)) => key.resolve(arch),
            (true, None) => return None,
            (false, _) => key.resolve(""),
        };
        self.key_index
            .get(name.as_ref())
            .map(|&i| &self.metadata[i])
    }

    /// A well-known metadata value; architecture-scoped keys use `general.architecture`.
    pub fn get(&self, key: Key) -> Option<&Value> {
        self.entry(key).map(|kv| &kv.value)
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.get_raw(Key::GeneralArchitecture.pattern())
            .and_then(Value::as_str)
    }

    fn typed<'s, T>(
        &'s self,
        key: Key,
        expected: &'static str,
        convert: impl Fn(&'s Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        let Some(kv) = self.entry(key) else {
            return Ok(None);
        };
        match convert(&kv.value) {
            Some(v) => Ok(Some(v)),
            None => Err(GgufError::new(
                kv.value_offset,
                kv.key.clone(),
                GgufErrorKind::WrongValueType {
                    expected,
                    found: kv.value.value_type().name(),
                },
            )),
        }
    }

    /// A non-negative integer value (any integer type), or an error naming the key if it has
    /// another type.
    pub fn get_u64(&self, key: Key) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// A number (float or integer type).
    pub fn get_f64(&self, key: Key) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub fn get_bool(&self, key: Key) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn get_str(&self, key: Key) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a UTF-8 string", Value::as_str)
    }

    pub fn get_array(&self, key: Key) -> Result<Option<&Array>, GgufError> {
        self.typed(key, "an array", Value::as_array)
    }

    /// `split.*` information, when the file is one shard of a split model.
    pub fn split(&self) -> Result<Option<SplitInfo>, GgufError> {
        let Some(count) = self.get_u64(Key::SplitCount)? else {
            return Ok(None);
        };
        Ok(Some(SplitInfo {
            index: self.get_u64(Key::SplitNo)?.unwrap_or(0),
            count,
            total_tensors: self.get_u64(Key::SplitTensorsCount)?,
        }))
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of `info` inside `file_bytes` (the same bytes this header was parsed from).
    /// Returns `None` if `file_bytes` is not that file (too short).
    pub fn tensor_data<'b>(&self, file_bytes: &'b [u8], info: &TensorInfo) -> Option<&'b [u8]> {
        let start = self.data_offset.checked_add(info.offset)?;
        let end = start.checked_add(info.n_bytes)?;
        file_bytes.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }
}

fn read_metadata(c: &mut Cursor<'_>, n_kv: u64) -> Result<Vec<KeyValue>, GgufError> {
    // n_kv was checked against the bytes left, so this capacity is bounded by the file size.
    let mut out = Vec::with_capacity(n_kv as usize);
    let mut seen = HashSet::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_at = c.pos();
        let key_field = || format!("kv[{i}].key");
        let raw = c.string(key_field)?;
        let key = std::str::from_utf8(raw)
            .map_err(|_| GgufError::new(key_at, key_field(), GgufErrorKind::InvalidUtf8))?;
        if key.is_empty() {
            return Err(GgufError::new(
                key_at,
                key_field(),
                GgufErrorKind::EmptyName,
            ));
        }
        if !seen.insert(key) {
            return Err(GgufError::new(
                key_at,
                format!("kv[{i}] '{key}'"),
                GgufErrorKind::DuplicateKey,
            ));
        }
        let field = || format!("kv[{i}] '{key}'");
        let type_at = c.pos();
        let type_id = c.u32(|| format!("{} type", field()))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| {
            GgufError::new(
                type_at,
                format!("{} type", field()),
                GgufErrorKind::UnknownValueType(type_id),
            )
        })?;
        let value_offset = c.pos();
        let value = read_value(c, ty, &field, 0)?;
        out.push(KeyValue {
            key: key.to_string(),
            value,
            value_offset,
        });
    }
    Ok(out)
}

fn read_value(
    c: &mut Cursor<'_>,
    ty: ValueType,
    field: FieldFn<'_>,
    depth: usize,
) -> Result<Value, GgufError> {
    let at = c.pos();
    Ok(match ty {
        ValueType::U8 => Value::U8(u8::from_le_bytes(c.array(field)?)),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array(field)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(field)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(field)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(field)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(field)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(field)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(field)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(field)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(field)?)),
        ValueType::Bool => {
            let [b] = c.array(field)?;
            Value::Bool(parse_bool(b).map_err(|k| GgufError::new(at, field(), k))?)
        }
        ValueType::String => Value::String(GgufString(c.string(field)?.to_vec())),
        ValueType::Array => Value::Array(read_array(c, field, depth)?),
    })
}

fn parse_bool(b: u8) -> Result<bool, GgufErrorKind> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(GgufErrorKind::InvalidBool(other)),
    }
}

/// Decodes `n` fixed-size little-endian values from exactly `n * N` bytes.
fn le_vec<T, const N: usize>(bytes: &[u8], decode: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            decode(a)
        })
        .collect()
}

fn read_array(c: &mut Cursor<'_>, field: FieldFn<'_>, depth: usize) -> Result<Array, GgufError> {
    let at = c.pos();
    if depth >= MAX_ARRAY_DEPTH {
        return Err(GgufError::new(
            at,
            field(),
            GgufErrorKind::NestingTooDeep {
                max: MAX_ARRAY_DEPTH,
            },
        ));
    }
    let type_id = c.u32(|| format!("{} element type", field()))?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| {
        GgufError::new(
            at,
            format!("{} element type", field()),
            GgufErrorKind::UnknownValueType(type_id),
        )
    })?;
    let count_field = || format!("{} length", field());
    let n = c.count(ty.min_bytes(), count_field)?;
    // For fixed-size elements `n * size` was just checked against the bytes left.
    let mut fixed = |size: u64| c.take(n * size, field);
    Ok(match ty {
        ValueType::U8 => Array::U8(fixed(1)?.to_vec()),
        ValueType::I8 => Array::I8(le_vec(fixed(1)?, i8::from_le_bytes)),
        ValueType::U16 => Array::U16(le_vec(fixed(2)?, u16::from_le_bytes)),
        ValueType::I16 => Array::I16(le_vec(fixed(2)?, i16::from_le_bytes)),
        ValueType::U32 => Array::U32(le_vec(fixed(4)?, u32::from_le_bytes)),
        ValueType::I32 => Array::I32(le_vec(fixed(4)?, i32::from_le_bytes)),
        ValueType::F32 => Array::F32(le_vec(fixed(4)?, f32::from_le_bytes)),
        ValueType::U64 => Array::U64(le_vec(fixed(8)?, u64::from_le_bytes)),
        ValueType::I64 => Array::I64(le_vec(fixed(8)?, i64::from_le_bytes)),
        ValueType::F64 => Array::F64(le_vec(fixed(8)?, f64::from_le_bytes)),
        ValueType::Bool => {
            let start = c.pos();
            let bytes = c.take(n, field)?;
            let mut out = Vec::with_capacity(bytes.len());
            for (j, &b) in bytes.iter().enumerate() {
                let v = parse_bool(b).map_err(|k| {
                    GgufError::new(start + j as u64, format!("{}[{j}]", field()), k)
                })?;
                out.push(v);
            }
            Array::Bool(out)
        }
        ValueType::String => {
            let mut out = Vec::with_capacity(n as usize);
            for j in 0..n {
                let s = c.string(|| format!("{}[{j}]", field()))?;
                out.push(GgufString(s.to_vec()));
            }
            Array::String(out)
        }
        ValueType::Array => {
            let mut out = Vec::with_capacity(n as usize);
            for j in 0..n {
                let inner = || format!("{}[{j}]", field());
                out.push(read_array(c, &inner, depth + 1)?);
            }
            Array::Array(out)
        }
    })
}

fn read_alignment(metadata: &[KeyValue], index: &HashMap<String, usize>) -> Result<u64, GgufError> {
    let Some(&i) = index.get(Key::GeneralAlignment.pattern()) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let kv = &metadata[i];
    let Value::U32(a) = kv.value else {
        return Err(GgufError::new(
            kv.value_offset,
            kv.key.clone(),
            GgufErrorKind::WrongValueType {
                expected: "u32",
                found: kv.value.value_type().name(),
            },
        ));
    };
    let a = u64::from(a);
    if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
        return Err(GgufError::new(
            kv.value_offset,
            kv.key.clone(),
            GgufErrorKind::BadAlignment(a),
        ));
    }
    Ok(a)
}

/// The tensor infos, and for each the file position of its `offset` field (for error reports).
fn read_tensor_infos(
    c: &mut Cursor<'_>,
    n_tensors: u64,
) -> Result<(Vec<TensorInfo>, Vec<u64>), GgufError> {
    // n_tensors was checked against the bytes left, so this capacity is bounded by the file size.
    let mut out: Vec<TensorInfo> = Vec::with_capacity(n_tensors as usize);
    let mut offset_fields = Vec::with_capacity(n_tensors as usize);
    let mut seen = HashSet::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name_at = c.pos();
        let name_field = || format!("tensor[{i}].name");
        let raw = c.string(name_field)?;
        let name = std::str::from_utf8(raw)
            .map_err(|_| GgufError::new(name_at, name_field(), GgufErrorKind::InvalidUtf8))?;
        let len = raw.len() as u64;
        if len > MAX_NAME_LEN {
            let kind = GgufErrorKind::NameTooLong {
                len,
                max: MAX_NAME_LEN,
            };
            return Err(GgufError::new(name_at, name_field(), kind));
        }
        if name.is_empty() {
            return Err(GgufError::new(
                name_at,
                name_field(),
                GgufErrorKind::EmptyName,
            ));
        }
        if !seen.insert(name) {
            return Err(GgufError::new(
                name_at,
                format!("tensor[{i}] '{name}'"),
                GgufErrorKind::DuplicateTensor,
            ));
        }
        let field = |what: &str| format!("tensor[{i}] '{name}' {what}");

        let n_dims_at = c.pos();
        let n_dims = c.u32(|| field("n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::new(
                n_dims_at,
                field("n_dims"),
                GgufErrorKind::TooManyDims(n_dims),
            ));
        }
        if n_dims == 0 {
            return Err(GgufError::new(
                n_dims_at,
                field("n_dims"),
                GgufErrorKind::NoDims(n_dims),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        let mut n_elements: u64 = 1;
        for d in 0..n_dims as usize {
            let at = c.pos();
            let v = c.u64(|| field(&format!("dims[{d}]")))?;
            if v == 0 || v > i64::MAX as u64 {
                let kind = GgufErrorKind::BadDim { index: d, value: v };
                return Err(GgufError::new(at, field(&format!("dims[{d}]")), kind));
            }
            n_elements = n_elements.checked_mul(v).ok_or_else(|| {
                GgufError::new(
                    at,
                    field(&format!("dims[{d}]")),
                    GgufErrorKind::SizeOverflow,
                )
            })?;
            dims.push(v);
        }
        if n_elements > i64::MAX as u64 {
            return Err(GgufError::new(
                n_dims_at,
                field("dims"),
                GgufErrorKind::SizeOverflow,
            ));
        }

        let type_at = c.pos();
        let type_id = c.u32(|| field("type"))?;
        let ggml_type = match GgmlType::from_id(type_id) {
            TypeId::Known(t) => t,
            TypeId::Removed(name) => {
                let kind = GgufErrorKind::RemovedTensorType { id: type_id, name };
                return Err(GgufError::new(type_at, field("type"), kind));
            }
            TypeId::Unknown(id) => {
                return Err(GgufError::new(
                    type_at,
                    field("type"),
                    GgufErrorKind::UnknownTensorType(id),
                ));
            }
        };
        let layout = ggml_type.layout();
        if dims[0] % layout.block_elems != 0 {
            let kind = GgufErrorKind::NotBlockMultiple {
                ne0: dims[0],
                type_name: ggml_type.name(),
                block: layout.block_elems,
            };
            return Err(GgufError::new(n_dims_at, field("dims[0]"), kind));
        }
        let n_bytes = ggml_type
            .bytes_for(dims[0], n_elements)
            .ok_or_else(|| GgufError::new(type_at, field("size"), GgufErrorKind::SizeOverflow))?;

        offset_fields.push(c.pos());
        let offset = c.u64(|| field("offset"))?;
        out.push(TensorInfo {
            name: name.to_string(),
            dims,
            ggml_type,
            offset,
            n_elements,
            n_bytes,
        });
    }
    Ok((out, offset_fields))
}

/// Every tensor aligned, inside the data section, and not overlapping another.
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    offset_fields: &[u64],
    alignment: u64,
    data_len: u64,
) -> Result<(), GgufError> {
    let field = |t: &TensorInfo| format!("tensor '{}' offset", t.name);
    for (t, &at) in tensors.iter().zip(offset_fields) {
        if t.offset % alignment != 0 {
            let kind = GgufErrorKind::MisalignedOffset {
                offset: t.offset,
                alignment,
            };
            return Err(GgufError::new(at, field(t), kind));
        }
        let fits = t
            .offset
            .checked_add(t.n_bytes)
            .is_some_and(|end| end <= data_len);
        if !fits {
            let kind = GgufErrorKind::TensorOutOfBounds {
                start: t.offset,
                len: t.n_bytes,
                data_len,
            };
            return Err(GgufError::new(at, field(t), kind));
        }
    }
    let mut order: Vec<(&TensorInfo, u64)> =
        tensors.iter().zip(offset_fields.iter().copied()).collect();
    order.sort_by_key(|(t, _)| t.offset);
    for pair in order.windows(2) {
        let ((a, _), (b, b_at)) = (pair[0], pair[1]);
        // Both ranges were checked to fit in data_len, so this add cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            let kind = GgufErrorKind::TensorsOverlap {
                other: a.name.clone(),
            };
            return Err(GgufError::new(b_at, field(b), kind));
        }
    }
    Ok(())
}
