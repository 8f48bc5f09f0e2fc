//! A step arena's layout as the spec publishes it (`spec.arenas.<name>`: buffer addresses, and per
//! field its offset, shape, dtype and size), and typed writes and reads of one of its buffers.

use std::collections::HashMap;

use serde_json::Value;

use crate::sched::config::{get, int, string};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Bool,
    U8,
    I16,
    I32,
    I64,
    F32,
}

impl DType {
    fn parse(name: &str) -> Result<DType, String> {
        Ok(match name {
            "bool" => DType::Bool,
            "uint8" => DType::U8,
            "int16" => DType::I16,
            "int32" => DType::I32,
            "int64" => DType::I64,
            "float32" => DType::F32,
            other => return Err(format!("dtype {other:?} is not one a step arena holds")),
        })
    }

    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 => 1,
            DType::I16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 => 8,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub offset: usize,
    pub nbytes: usize,
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl Field {
    /// Elements per entry of the first dimension.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    pub fn len(&self) -> usize {
        self.nbytes / self.dtype.size()
    }

    pub fn is_empty(&self) -> bool {
        self.nbytes == 0
    }

    pub fn end(&self) -> usize {
        self.offset + self.nbytes
    }
}

#[derive(Debug, Clone)]
pub struct ArenaLayout {
    pub name: String,
    pub nbytes: usize,
    pub device_ptr: u64,
    pub host_ptrs: Vec<u64>,
    pub fields: HashMap<String, Field>,
}

impl ArenaLayout {
    pub fn from_json(a: &Value, path: &str) -> Result<ArenaLayout, String> {
        let host_ptrs = get(a, path, "host_ptrs")?.as_array().ok_or(format!("{path}host_ptrs is not a list"))?
            .iter().map(|p| p.as_u64().ok_or(format!("{path}host_ptrs holds a non-address")))
            .collect::<Result<Vec<_>, _>>()?;
        if host_ptrs.is_empty() {
            return Err(format!("{path}host_ptrs is empty"));
        }
        let nbytes = int(a, path, "nbytes")? as usize;
        let mut fields = HashMap::new();
        let items = get(a, path, "fields")?.as_array().ok_or(format!("{path}fields is not a list"))?;
        for f in items {
            let fp = format!("{path}fields[].");
            let shape = get(f, &fp, "shape")?.as_array().ok_or(format!("{fp}shape is not a list"))?
                .iter().map(|d| d.as_u64().map(|d| d as usize).ok_or(format!("{fp}shape holds a non-size")))
                .collect::<Result<Vec<_>, _>>()?;
            let field = Field { offset: int(f, &fp, "offset")? as usize, nbytes: int(f, &fp, "nbytes")? as usize, shape,
                                dtype: DType::parse(&string(f, &fp, "dtype")?)? };
            if field.end() > nbytes || field.shape.iter().product::<usize>() * field.dtype.size() != field.nbytes {
                return Err(format!("{path}fields: {} does not fit its shape or the arena", string(f, &fp, "name")?));
            }
            fields.insert(string(f, &fp, "name")?, field);
        }
        Ok(ArenaLayout { name: string(a, path, "name")?, nbytes, device_ptr: get(a, path, "device_ptr")?.as_u64()
                             .ok_or(format!("{path}device_ptr is not an address"))?, host_ptrs, fields })
    }

    pub fn field(&self, name: &str) -> Result<&Field, String> {
        self.fields.get(name).ok_or_else(|| format!("the {} arena has no field {name}", self.name))
    }

    pub fn has(&self, name: &str) -> bool {
        self.fields.contains_key(name)
    }

    pub fn end_of(&self, name: &str) -> Result<usize, String> {
        Ok(self.field(name)?.end())
    }
}

/// One host buffer of an arena. The spec's addresses stay valid for the life of the process (the
/// engine registry keeps every buffer alive); writes stay inside the field they name.
#[derive(Debug, Clone, Copy)]
pub struct HostBuf {
    pub base: *mut u8,
}

// The buffer belongs to one scheduler thread at a time: the engine loop that owns the worker.
unsafe impl Send for HostBuf {}

impl HostBuf {
    /// Write `value` as element `index` of `field` (converted to the field's dtype).
    #[inline]
    pub fn set(&self, field: &Field, index: usize, value: f64) {
        assert!(index < field.len(), "element {index} past a field of {}", field.len());
        // SAFETY: in bounds of the field (checked above), which lies inside the buffer.
        unsafe {
            let p = self.base.add(field.offset + index * field.dtype.size());
            match field.dtype {
                DType::Bool => *p = u8::from(value != 0.0),
                DType::U8 => *p = value as u8,
                DType::I16 => (p as *mut i16).write_unaligned(value as i16),
                DType::I32 => (p as *mut i32).write_unaligned(value as i32),
                DType::I64 => (p as *mut i64).write_unaligned(value as i64),
                DType::F32 => (p as *mut f32).write_unaligned(value as f32),
            }
        }
    }

    #[inline]
    pub fn set_i(&self, field: &Field, index: usize, value: i64) {
        match field.dtype {
            DType::I32 | DType::I64 | DType::I16 | DType::U8 | DType::Bool => {
                assert!(index < field.len(), "element {index} past a field of {}", field.len());
                // SAFETY: as in `set`.
                unsafe {
                    let p = self.base.add(field.offset + index * field.dtype.size());
                    match field.dtype {
                        DType::I32 => (p as *mut i32).write_unaligned(value as i32),
                        DType::I64 => (p as *mut i64).write_unaligned(value),
                        DType::I16 => (p as *mut i16).write_unaligned(value as i16),
                        _ => *p = value as u8,
                    }
                }
            }
            DType::F32 => self.set(field, index, value as f64),
        }
    }

    /// `field[..n] = values; field[n..end] = pad` (a launch's rows, then its padded rows).
    pub fn put_i32(&self, field: &Field, values: &[i32], end: usize, pad: i64) {
        for (i, &v) in values.iter().enumerate() {
            self.set_i(field, i, i64::from(v));
        }
        for i in values.len()..end {
            self.set_i(field, i, pad);
        }
    }

    pub fn get_i(&self, field: &Field, index: usize) -> i64 {
        assert!(index < field.len(), "element {index} past a field of {}", field.len());
        // SAFETY: as in `set`.
        unsafe {
            let p = self.base.add(field.offset + index * field.dtype.size());
            match field.dtype {
                DType::Bool | DType::U8 => i64::from(*p),
                DType::I16 => i64::from((p as *const i16).read_unaligned()),
                DType::I32 => i64::from((p as *const i32).read_unaligned()),
                DType::I64 => (p as *const i64).read_unaligned(),
                DType::F32 => (p as *const f32).read_unaligned() as i64,
            }
        }
    }

    /// `nbytes` bytes of `field` from byte `start` within it.
    pub fn bytes(&self, field: &Field, start: usize, nbytes: usize) -> Vec<u8> {
        assert!(start + nbytes <= field.nbytes, "bytes past the end of a field");
        // SAFETY: in bounds of the field.
        unsafe { std::slice::from_raw_parts(self.base.add(field.offset + start), nbytes).to_vec() }
    }
}
