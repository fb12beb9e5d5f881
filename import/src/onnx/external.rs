//! Decoding `TensorProto` payloads: inline typed fields, `raw_data`, and external data files.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use super::proto::{TensorProto, data_location, data_type as dt};
use super::value::{Const, Elem, checked_numel};
use crate::ImportError;

/// Reads tensor payloads for one model file; external data files are opened relative to it.
#[derive(Debug)]
pub struct TensorReader {
    model: PathBuf,
    dir: PathBuf,
    /// Whole external files, read once: models keep all weights in one or a few files.
    files: HashMap<String, Rc<Vec<u8>>>,
}

impl TensorReader {
    pub fn new(model: &Path) -> TensorReader {
        TensorReader {
            model: model.to_path_buf(),
            dir: model.parent().map(Path::to_path_buf).unwrap_or_default(),
            files: HashMap::new(),
        }
    }

    fn bad(&self, tensor: &str, reason: impl Into<String>) -> ImportError {
        ImportError::BadTensor {
            file: self.model.clone(),
            tensor: tensor.into(),
            reason: reason.into(),
        }
    }

    /// Decodes a tensor into a constant.
    pub fn read(&mut self, t: &TensorProto) -> Result<Const, ImportError> {
        let name = t.name.clone().unwrap_or_default();
        let code = t.data_type.unwrap_or(0);
        let elem = Elem::from_onnx(code)
            .ok_or_else(|| self.bad(&name, format!("element type {code} is not supported")))?;
        let shape = t
            .dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| self.bad(&name, format!("negative dimension in {:?}", t.dims)))?;
        let numel = checked_numel(&shape)
            .ok_or_else(|| self.bad(&name, format!("shape {:?} overflows", t.dims)))?;
        let data = if t.data_location == Some(data_location::EXTERNAL) {
            let bytes = self.external_bytes(t, &name, numel, code)?;
            from_raw(&bytes, code, numel)
        } else if let Some(raw) = &t.raw_data {
            from_raw(raw, code, numel)
        } else {
            from_typed(t, code)
        };
        let data = data.ok_or_else(|| self.bad(&name, "unreadable payload"))?;
        if data.len() != numel {
            return Err(self.bad(
                &name,
                format!(
                    "holds {} elements, its shape {shape:?} needs {numel}",
                    data.len()
                ),
            ));
        }
        Ok(Const::new(elem, shape, data))
    }

    fn external_bytes(
        &mut self,
        t: &TensorProto,
        name: &str,
        numel: usize,
        code: i32,
    ) -> Result<Vec<u8>, ImportError> {
        let key = |k: &str| {
            t.external_data
                .iter()
                .find(|e| e.key.as_deref() == Some(k))
                .and_then(|e| e.value.clone())
        };
        let location = key("location")
            .ok_or_else(|| self.bad(name, "external data without a 'location' key"))?;
        let data_file = self.dir.join(&location);
        let ext_err = |reason: String| ImportError::ExternalData {
            file: self.model.clone(),
            data_file: data_file.clone(),
            tensor: name.into(),
            reason,
        };
        // The ONNX spec requires locations relative to the model and inside its directory.
        let rel = Path::new(&location);
        if rel.is_absolute() || rel.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(ext_err("a location outside the model's directory".into()));
        }
        let parse = |k: &str| -> Result<Option<usize>, ImportError> {
            key(k)
                .map(|v| v.trim().parse::<usize>())
                .transpose()
                .map_err(|_| ext_err(format!("an invalid '{k}'")))
        };
        let offset = parse("offset")?.unwrap_or(0);
        let want = elem_size(code)
            .and_then(|s| s.checked_mul(numel))
            .ok_or_else(|| ext_err("an element type that cannot be stored externally".into()))?;
        let length = parse("length")?.unwrap_or(want);
        if length != want {
            return Err(ext_err(format!(
                "a length of {length} bytes where its shape needs {want}"
            )));
        }
        let bytes = match self.files.get(&location) {
            Some(b) => Rc::clone(b),
            None => {
                let mut f = std::fs::File::open(&data_file).map_err(|e| {
                    ext_err(if e.kind() == std::io::ErrorKind::NotFound {
                        "which does not exist; keep the data file next to the model".into()
                    } else {
                        format!("which cannot be read ({e})")
                    })
                })?;
                let mut buf = Vec::new();
                f.seek(SeekFrom::Start(0))
                    .and_then(|_| f.read_to_end(&mut buf))
                    .map_err(|e| ext_err(format!("which cannot be read ({e})")))?;
                let b = Rc::new(buf);
                self.files.insert(location.clone(), Rc::clone(&b));
                b
            }
        };
        let end = offset.saturating_add(length);
        bytes.get(offset..end).map(<[u8]>::to_vec).ok_or_else(|| {
            ext_err(format!(
                "which is too short: the tensor needs bytes {offset}..{end}, the file has {}; the data file is incomplete, copy it again",
                bytes.len()
            ))
        })
    }
}

fn elem_size(code: i32) -> Option<usize> {
    Some(match code {
        dt::BOOL | dt::UINT8 | dt::INT8 => 1,
        dt::UINT16 | dt::INT16 | dt::FLOAT16 | dt::BFLOAT16 => 2,
        dt::FLOAT | dt::INT32 | dt::UINT32 => 4,
        dt::DOUBLE | dt::INT64 | dt::UINT64 => 8,
        _ => return None,
    })
}

/// Little-endian raw bytes to f64 values; `None` when the byte count does not fit the shape.
fn from_raw(raw: &[u8], code: i32, numel: usize) -> Option<Vec<f64>> {
    let size = elem_size(code)?;
    if raw.len() != size.checked_mul(numel)? {
        return None;
    }
    let out = raw
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            let (b2, b4) = ([b[0], b[1]], [b[0], b[1], b[2], b[3]]);
            match code {
                dt::BOOL | dt::UINT8 => f64::from(b[0]),
                dt::INT8 => f64::from(b[0] as i8),
                dt::UINT16 => f64::from(u16::from_le_bytes(b2)),
                dt::INT16 => f64::from(i16::from_le_bytes(b2)),
                dt::FLOAT16 => f16_to_f64(u16::from_le_bytes(b2)),
                dt::BFLOAT16 => f64::from(f32::from_bits(u32::from(u16::from_le_bytes(b2)) << 16)),
                dt::FLOAT => f64::from(f32::from_le_bytes(b4)),
                dt::INT32 => f64::from(i32::from_le_bytes(b4)),
                dt::UINT32 => f64::from(u32::from_le_bytes(b4)),
                dt::DOUBLE => f64::from_le_bytes(b),
                dt::INT64 => i64::from_le_bytes(b) as f64,
                _ => u64::from_le_bytes(b) as f64,
            }
        })
        .collect();
    Some(out)
}

/// The typed repeated fields; which one holds the data depends on the element type.
fn from_typed(t: &TensorProto, code: i32) -> Option<Vec<f64>> {
    Some(match code {
        dt::FLOAT => t.float_data.iter().map(|&x| f64::from(x)).collect(),
        dt::DOUBLE => t.double_data.clone(),
        dt::INT64 => t.int64_data.iter().map(|&x| x as f64).collect(),
        dt::UINT32 | dt::UINT64 => t.uint64_data.iter().map(|&x| x as f64).collect(),
        // Half floats travel as their bit patterns in int32_data.
        dt::FLOAT16 => t.int32_data.iter().map(|&x| f16_to_f64(x as u16)).collect(),
        dt::BFLOAT16 => t
            .int32_data
            .iter()
            .map(|&x| f64::from(f32::from_bits((x as u32 & 0xffff) << 16)))
            .collect(),
        dt::INT32 | dt::INT16 | dt::INT8 | dt::UINT16 | dt::UINT8 | dt::BOOL => {
            t.int32_data.iter().map(|&x| f64::from(x)).collect()
        }
        _ => return None,
    })
}

/// IEEE 754 binary16 to f64.
fn f16_to_f64(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((bits >> 10) & 0x1f);
    let frac = f64::from(bits & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_floats() {
        assert_eq!(f16_to_f64(0x3c00), 1.0);
        assert_eq!(f16_to_f64(0xc000), -2.0);
        assert_eq!(f16_to_f64(0x0001), 2f64.powi(-24));
    }
}
