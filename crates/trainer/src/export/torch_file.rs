//! PyTorch's checkpoint file (the zip format `torch.save` has written since 1.6) holding
//! `{top_key: OrderedDict(name -> float32 tensor)}`, what `torch.load(weights_only=True)`
//! reads and what Kool's code expects under `"model"`.
//!
//! The archive: `archive/data.pkl` (a protocol-2 pickle whose tensors are
//! `torch._utils._rebuild_tensor_v2` calls on persistent storages `('storage',
//! torch.FloatStorage, key, 'cpu', numel)`), each storage's little-endian bytes in
//! `archive/data/{key}` aligned to 64 bytes as `torch.save` aligns them (so `torch.load(...,
//! mmap=True)` works too), and the format records `version`, `byteorder`,
//! `.format_version` and `.storage_alignment`. Entries are stored uncompressed with a fixed
//! timestamp: the same weights give the same bytes.

use std::io::{Cursor, Write};

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

/// The bytes of a `.pt` file holding `{top_key: OrderedDict(tensors)}`, in order.
pub(crate) fn state_dict_file(
    top_key: &str,
    tensors: &[NamedTensor],
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
    record("data.pkl", &pickle(top_key, tensors), false)?;
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
/// (the tensor's index), offset 0, contiguous row-major strides.
fn pickle(top_key: &str, tensors: &[NamedTensor]) -> Vec<u8> {
    let mut p = Pickle(vec![PROTO, 2]);
    p.op(EMPTY_DICT);
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
        p.int(t.values.len());
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
    p.op(SETITEM);
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
const SETITEM: u8 = b's';
const SETITEMS: u8 = b'u';
const BINUNICODE: u8 = b'X';
const GLOBAL: u8 = b'c';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const NEWFALSE: u8 = 0x89;
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

    /// A non-negative int in the shortest of pickle's encodings.
    fn int(&mut self, v: usize) {
        if let Ok(v) = u8::try_from(v) {
            self.0.extend([BININT1, v]);
        } else if let Ok(v) = u16::try_from(v) {
            self.op(BININT2);
            self.0.extend(v.to_le_bytes());
        } else if let Ok(v) = i32::try_from(v) {
            self.op(BININT);
            self.0.extend(v.to_le_bytes());
        } else {
            // Two's complement, little-endian, with a zero byte where the top bit is set.
            let mut bytes = (v as u64).to_le_bytes().to_vec();
            while bytes.len() > 1 && bytes[bytes.len() - 1] == 0 && bytes[bytes.len() - 2] < 0x80 {
                bytes.pop();
            }
            self.0.extend([LONG1, bytes.len() as u8]);
            self.0.extend(bytes);
        }
    }

    /// A tuple of ints.
    fn ints(&mut self, values: &[usize]) {
        self.op(MARK);
        for &v in values {
            self.int(v);
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
        let encoded = |v: usize| {
            let mut p = Pickle(vec![]);
            p.int(v);
            p.0
        };
        assert_eq!(encoded(6), b"K\x06");
        assert_eq!(encoded(300), b"M\x2c\x01");
        assert_eq!(encoded(70_000), b"J\x70\x11\x01\x00");
        assert_eq!(encoded(1 << 31), b"\x8a\x05\x00\x00\x00\x80\x00");
        assert_eq!(encoded(1 << 32), b"\x8a\x05\x00\x00\x00\x00\x01");
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
        let bytes = state_dict_file("model", &tensors).unwrap();
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
        assert_eq!(state_dict_file("model", &tensors).unwrap(), bytes);
    }
}
