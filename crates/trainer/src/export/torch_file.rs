//! PyTorch's checkpoint file (the zip format `torch.save` has written since 1.6) holding
//! `{top_key: OrderedDict(name -> float32 tensor), ...}` and any plain values beside it,
//! what `torch.load(weights_only=True)` reads: Kool's `{"model": state_dict}`, rl4co's
//! `{"state_dict": ..., "hyper_parameters": {"policy_kwargs": {...}}}`.
//!
//! The archive: `archive/data.pkl` (a protocol-2 pickle whose tensors are
//! `torch._utils._rebuild_tensor_v2` calls on persistent storages `('storage',
//! torch.FloatStorage, key, 'cpu', numel)`), each storage's little-endian bytes in
//! `archive/data/{key}` aligned to 64 bytes as `torch.save` aligns them (so `torch.load(...,
//! mmap=True)` works too), and the format records `version`, `byteorder`,
//! `.format_version` and `.storage_alignment`. Entries are stored uncompressed with a fixed
//! timestamp: the same weights give the same bytes.

use std::io::{Cursor, Write};

use serde_json::Value;
use zip::write::SimpleFileOptions;
use zip::{CompressionMethod, DateTime, ZipWriter};

/// A float32 tensor for the file: its name in the state dict, shape and values (row-major).
pub(crate) struct NamedTensor {
    pub(crate) name: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) values: Vec<f32>,
}

/// PyTorch's storage alignment (`torch.serialization`'s default).
const STORAGE_ALIGNMENT: u16 = 64;

/// The bytes of a `.pt` file holding `{top_key: OrderedDict(tensors), **extra}`, in order;
/// `extra`'s JSON values become Python's (objects dicts, arrays lists).
pub(crate) fn state_dict_file(
    top_key: &str,
    tensors: &[NamedTensor],
    extra: &[(&str, Value)],
) -> zip::result::ZipResult<Vec<u8>> {
    let mut zip = ZipWriter::new(Cursor::new(Vec::new()));
    let stored = SimpleFileOptions::default()
        .compression_method(CompressionMethod::Stored)
        .last_modified_time(DateTime::default());
    let mut record = |name: &str, bytes: &[u8], aligned: bool| -> zip::result::ZipResult<()> {
        let options = if aligned {
            stored.with_alignment(STORAGE_ALIGNMENT)
        } else {
            stored
        };
        zip.start_file(format!("archive/{name}"), options)?;
        zip.write_all(bytes)?;
        Ok(())
    };
    record("data.pkl", &pickle(top_key, tensors, extra), false)?;
    record(".format_version", b"1", false)?;
    record(
        ".storage_alignment",
        STORAGE_ALIGNMENT.to_string().as_bytes(),
        false,
    )?;
    record("byteorder", b"little", false)?;
    for (key, t) in tensors.iter().enumerate() {
        let bytes: Vec<u8> = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        record(&format!("data/{key}"), &bytes, true)?;
    }
    record("version", b"3\n", false)?;
    Ok(zip.finish()?.into_inner())
}

/// `data.pkl`: the dict, the ordered dict, and per tensor its rebuild call on storage `key`
/// (the tensor's index), offset 0, contiguous row-major strides; then `extra`.
fn pickle(top_key: &str, tensors: &[NamedTensor], extra: &[(&str, Value)]) -> Vec<u8> {
    let mut p = Pickle(vec![PROTO, 2]);
    p.op(EMPTY_DICT);
    p.op(MARK);
    p.string(top_key);
    p.empty_ordered_dict();
    p.op(MARK);
    for (key, t) in tensors.iter().enumerate() {
        p.string(&t.name);
        p.global("torch._utils", "_rebuild_tensor_v2");
        p.op(MARK);
        p.op(MARK);
        p.string("storage");
        p.global("torch", "FloatStorage");
        p.string(&key.to_string());
        p.string("cpu");
        p.int(t.values.len() as i64);
        p.op(TUPLE);
        p.op(BINPERSID);
        p.int(0);
        p.ints(&t.shape);
        p.ints(&row_major_strides(&t.shape));
        p.op(NEWFALSE);
        // backward_hooks: an empty OrderedDict, as torch.save writes it.
        p.empty_ordered_dict();
        p.op(TUPLE);
        p.op(REDUCE);
    }
    p.op(SETITEMS);
    for (key, value) in extra {
        p.string(key);
        p.value(value);
    }
    p.op(SETITEMS);
    p.op(STOP);
    p.0
}

fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

// Pickle opcodes (Python's `pickle.py`).
const PROTO: u8 = 0x80;
const EMPTY_DICT: u8 = b'}';
const EMPTY_TUPLE: u8 = b')';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const SETITEMS: u8 = b'u';
const BINUNICODE: u8 = b'X';
const GLOBAL: u8 = b'c';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const NONE: u8 = b'N';
const BINFLOAT: u8 = b'G';
const EMPTY_LIST: u8 = b']';
const APPENDS: u8 = b'e';
const BINPERSID: u8 = b'Q';
const REDUCE: u8 = b'R';
const STOP: u8 = b'.';

/// A pickle being written, without a memo (nothing is referenced twice).
struct Pickle(Vec<u8>);

impl Pickle {
    fn op(&mut self, op: u8) {
        self.0.push(op);
    }

    fn string(&mut self, s: &str) {
        self.op(BINUNICODE);
        self.0.extend((s.len() as u32).to_le_bytes());
        self.0.extend(s.as_bytes());
    }

    fn global(&mut self, module: &str, name: &str) {
        self.op(GLOBAL);
        self.0.extend(format!("{module}\n{name}\n").bytes());
    }

    /// `collections.OrderedDict()`.
    fn empty_ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.op(EMPTY_TUPLE);
        self.op(REDUCE);
    }

    /// An int in the shortest of pickle's encodings.
    fn int(&mut self, v: i64) {
        if let Ok(v) = u8::try_from(v) {
            self.0.extend([BININT1, v]);
        } else if let Ok(v) = u16::try_from(v) {
            self.op(BININT2);
            self.0.extend(v.to_le_bytes());
        } else if let Ok(v) = i32::try_from(v) {
            self.op(BININT);
            self.0.extend(v.to_le_bytes());
        } else {
            // Two's complement, little-endian, in the fewest bytes that keep the sign.
            let mut bytes = v.to_le_bytes().to_vec();
            while let [.., second, last] = bytes[..] {
                let redundant = (last == 0 && second < 0x80) || (last == 0xff && second >= 0x80);
                if !redundant {
                    break;
                }
                bytes.pop();
            }
            self.0.extend([LONG1, bytes.len() as u8]);
            self.0.extend(bytes);
        }
    }

    /// A JSON value as the Python value `json.loads` gives.
    fn value(&mut self, v: &Value) {
        match v {
            Value::Null => self.op(NONE),
            Value::Bool(b) => self.op(if *b { NEWTRUE } else { NEWFALSE }),
            Value::Number(n) => match n.as_i64() {
                Some(i) => self.int(i),
                None => {
                    self.op(BINFLOAT);
                    self.0.extend(n.as_f64().unwrap_or(f64::NAN).to_be_bytes());
                }
            },
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                self.op(EMPTY_LIST);
                self.op(MARK);
                items.iter().for_each(|i| self.value(i));
                self.op(APPENDS);
            }
            Value::Object(map) => {
                self.op(EMPTY_DICT);
                self.op(MARK);
                for (k, v) in map {
                    self.string(k);
                    self.value(v);
                }
                self.op(SETITEMS);
            }
        }
    }

    /// A tuple of ints.
    fn ints(&mut self, values: &[usize]) {
        self.op(MARK);
        for &v in values {
            self.int(v as i64);
        }
        self.op(TUPLE);
    }
}

#[cfg(test)]
mod tests {
    use burn::store::pytorch::PytorchReader;
    use burn::store::pytorch_reader::DType;

    use super::*;

    #[test]
    fn strides_are_row_major() {
        assert_eq!(row_major_strides(&[8, 128, 16]), vec![2048, 16, 1]);
        assert_eq!(row_major_strides(&[5]), vec![1]);
        assert!(row_major_strides(&[]).is_empty());
    }

    /// Ints as Python's pickler writes them (`pickle.dumps(v, 2)` minus framing).
    #[test]
    fn ints_take_the_shortest_encoding() {
        let encoded = |v: i64| {
            let mut p = Pickle(vec![]);
            p.int(v);
            p.0
        };
        assert_eq!(encoded(6), b"K\x06");
        assert_eq!(encoded(300), b"M\x2c\x01");
        assert_eq!(encoded(70_000), b"J\x70\x11\x01\x00");
        assert_eq!(encoded(1 << 31), b"\x8a\x05\x00\x00\x00\x80\x00");
        assert_eq!(encoded(1 << 32), b"\x8a\x05\x00\x00\x00\x00\x01");
        assert_eq!(encoded(-1), b"J\xff\xff\xff\xff");
        assert_eq!(encoded(-(1 << 31) - 1), b"\x8a\x05\xff\xff\xff\x7f\xff");
        assert_eq!(encoded(-(1 << 40)), b"\x8a\x06\x00\x00\x00\x00\x00\xff");
    }

    /// What burn-store's PyTorch reader (written against `torch.save`'s files) finds in
    /// the file: every tensor under the top key, by name, with its shape and values.
    #[test]
    fn burn_stores_reader_reads_the_file_back() {
        let tensors = vec![
            NamedTensor {
                name: "a.weight".into(),
                shape: vec![2, 3],
                values: vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.5],
            },
            NamedTensor {
                name: "layers.0.W_query".into(),
                shape: vec![2, 1, 2],
                values: vec![-1.0, 1e-8, f32::MAX, 7.0],
            },
            NamedTensor {
                name: "b".into(),
                shape: vec![300],
                values: (0..300).map(|i| i as f32 / 3.0).collect(),
            },
        ];
        let bytes = state_dict_file("model", &tensors, &[]).unwrap();
        let path =
            std::env::temp_dir().join(format!("routeburn-torch-file-{}.pt", std::process::id()));
        std::fs::write(&path, &bytes).unwrap();
        let read = PytorchReader::with_top_level_key(&path, "model").unwrap();
        let mut found = read.into_tensors();
        std::fs::remove_file(&path).ok();
        assert_eq!(found.len(), tensors.len());
        for t in &tensors {
            let f = found
                .remove(&t.name)
                .unwrap_or_else(|| panic!("{} missing", t.name));
            assert_eq!(f.dtype(), DType::F32);
            assert_eq!(f.shape(), &t.shape[..]);
            let expected: Vec<u8> = t.values.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert_eq!(f.read().unwrap(), expected, "{}", t.name);
        }
        // The same tensors give the same bytes.
        assert_eq!(state_dict_file("model", &tensors, &[]).unwrap(), bytes);
    }
}
