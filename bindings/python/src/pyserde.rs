//! A serde serializer writing Python objects directly, for the per-call paths.
//!
//! `place` is called at scheduler rates, so converting its result should cost less than the
//! placement itself. A generic serializer creates a fresh Python string for every key of every
//! dict; here dict keys (the model's camelCase field names) are created once and reused.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString};
use serde::ser::{self, Serialize};

/// An error of [`to_py`].
#[derive(Debug)]
pub struct SerError(String);

impl fmt::Display for SerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SerError {}

impl ser::Error for SerError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        SerError(msg.to_string())
    }
}

impl From<PyErr> for SerError {
    fn from(e: PyErr) -> Self {
        SerError(e.to_string())
    }
}

/// Serializes a value straight into Python objects: structs and maps become dicts, sequences
/// lists, enums their serde form (unit variants as strings, others as one-key dicts).
///
/// # Errors
/// A serializer error (a map key that is not a string or number), which the model never raises.
pub fn to_py<'py, T: Serialize + ?Sized>(
    py: Python<'py>,
    value: &T,
) -> Result<Bound<'py, PyAny>, SerError> {
    value.serialize(Ser { py })
}

/// Dict keys are the model's field names: a small set, each created once per thread and reused
/// (the GIL is held whenever these run, and a thread-local cache needs no lock). Field names are
/// `&'static str` and found by address; map keys taken from data (template names) are found by
/// content, in a bounded cache so they cannot grow it without end.
const KEY_CACHE_MAX: usize = 1024;

/// FNV-1a, with a cheap path for the addresses of field names: SipHash's setup would dominate
/// lookups of such short keys.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Cache<K> = RefCell<HashMap<K, Py<PyString>, BuildHasherDefault<Fnv>>>;

thread_local! {
    static FIELDS: Cache<(usize, usize)> = RefCell::new(HashMap::default());
    static NAMES: Cache<Box<str>> = RefCell::new(HashMap::default());
}

/// The Python string of a field or variant name.
fn field_key<'py>(py: Python<'py>, k: &'static str) -> Bound<'py, PyString> {
    let id = (k.as_ptr() as usize, k.len());
    FIELDS
        .try_with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(s) = cache.get(&id) {
                return s.bind(py).clone();
            }
            let s = PyString::new(py, k);
            cache.insert(id, s.clone().unbind());
            s
        })
        .unwrap_or_else(|_| PyString::new(py, k))
}

/// The Python string of a map key.
fn name_key<'py>(py: Python<'py>, k: &str) -> Bound<'py, PyString> {
    NAMES
        .try_with(|cache| {
            let mut cache = cache.borrow_mut();
            if let Some(s) = cache.get(k) {
                return s.bind(py).clone();
            }
            let s = PyString::new(py, k);
            if cache.len() < KEY_CACHE_MAX && k.len() <= 64 {
                cache.insert(k.into(), s.clone().unbind());
            }
            s
        })
        .unwrap_or_else(|_| PyString::new(py, k))
}

#[derive(Clone, Copy)]
struct Ser<'py> {
    py: Python<'py>,
}

type R<'py> = Result<Bound<'py, PyAny>, SerError>;

fn int<'py>(py: Python<'py>, v: impl IntoPyObject<'py>) -> R<'py> {
    v.into_bound_py_any(py).map_err(SerError::from)
}

/// A dict under construction, optionally wrapped as `{variant: dict}`.
struct DictSer<'py> {
    py: Python<'py>,
    dict: Bound<'py, PyDict>,
    variant: Option<&'static str>,
    key: Option<Bound<'py, PyAny>>,
}

/// A list under construction, optionally wrapped as `{variant: list}`.
struct ListSer<'py> {
    py: Python<'py>,
    items: Vec<Bound<'py, PyAny>>,
    variant: Option<&'static str>,
}

fn wrap<'py>(py: Python<'py>, variant: Option<&'static str>, v: Bound<'py, PyAny>) -> R<'py> {
    match variant {
        None => Ok(v),
        Some(name) => {
            let d = PyDict::new(py);
            d.set_item(field_key(py, name), v)?;
            Ok(d.into_any())
        }
    }
}

impl<'py> ser::Serializer for Ser<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = SerError;
    type SerializeSeq = ListSer<'py>;
    type SerializeTuple = ListSer<'py>;
    type SerializeTupleStruct = ListSer<'py>;
    type SerializeTupleVariant = ListSer<'py>;
    type SerializeMap = DictSer<'py>;
    type SerializeStruct = DictSer<'py>;
    type SerializeStructVariant = DictSer<'py>;

    fn serialize_bool(self, v: bool) -> R<'py> {
        Ok(PyBool::new(self.py, v).to_owned().into_any())
    }
    fn serialize_i8(self, v: i8) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_i16(self, v: i16) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_i32(self, v: i32) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_i64(self, v: i64) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_i128(self, v: i128) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_u8(self, v: u8) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_u16(self, v: u16) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_u32(self, v: u32) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_u64(self, v: u64) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_u128(self, v: u128) -> R<'py> {
        int(self.py, v)
    }
    fn serialize_f32(self, v: f32) -> R<'py> {
        Ok(PyFloat::new(self.py, f64::from(v)).into_any())
    }
    fn serialize_f64(self, v: f64) -> R<'py> {
        Ok(PyFloat::new(self.py, v).into_any())
    }
    fn serialize_char(self, v: char) -> R<'py> {
        let mut buf = [0u8; 4];
        Ok(PyString::new(self.py, v.encode_utf8(&mut buf)).into_any())
    }
    fn serialize_str(self, v: &str) -> R<'py> {
        Ok(PyString::new(self.py, v).into_any())
    }
    fn collect_str<T: fmt::Display + ?Sized>(self, value: &T) -> R<'py> {
        // Addresses and UUIDs are written through `Display`: format into one reused buffer
        // rather than a new `String` each time.
        thread_local! {
            static BUF: RefCell<String> = const { RefCell::new(String::new()) };
        }
        BUF.try_with(|buf| {
            let mut buf = buf.borrow_mut();
            buf.clear();
            fmt::write(&mut *buf, format_args!("{value}"))
                .map_err(|_| SerError("a value could not be formatted".into()))?;
            Ok(PyString::new(self.py, &buf).into_any())
        })
        .unwrap_or_else(|_| Ok(PyString::new(self.py, &value.to_string()).into_any()))
    }
    fn serialize_bytes(self, v: &[u8]) -> R<'py> {
        Ok(PyBytes::new(self.py, v).into_any())
    }
    fn serialize_none(self) -> R<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> R<'py> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> R<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R<'py> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(self, _name: &'static str, _i: u32, variant: &'static str) -> R<'py> {
        Ok(field_key(self.py, variant).into_any())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> R<'py> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        value: &T,
    ) -> R<'py> {
        let inner = value.serialize(self)?;
        wrap(self.py, Some(variant), inner)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<ListSer<'py>, SerError> {
        Ok(ListSer {
            py: self.py,
            items: Vec::with_capacity(len.unwrap_or(0)),
            variant: None,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<ListSer<'py>, SerError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<ListSer<'py>, SerError> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<ListSer<'py>, SerError> {
        let mut l = self.serialize_seq(Some(len))?;
        l.variant = Some(variant);
        Ok(l)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<DictSer<'py>, SerError> {
        Ok(DictSer {
            py: self.py,
            dict: PyDict::new(self.py),
            variant: None,
            key: None,
        })
    }
    fn serialize_struct(self, _name: &'static str, len: usize) -> Result<DictSer<'py>, SerError> {
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _i: u32,
        variant: &'static str,
        len: usize,
    ) -> Result<DictSer<'py>, SerError> {
        let mut d = self.serialize_map(Some(len))?;
        d.variant = Some(variant);
        Ok(d)
    }
}

macro_rules! list_ser {
    ($trait:ident, $method:ident) => {
        impl<'py> ser::$trait for ListSer<'py> {
            type Ok = Bound<'py, PyAny>;
            type Error = SerError;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
                self.items.push(value.serialize(Ser { py: self.py })?);
                Ok(())
            }
            fn end(self) -> R<'py> {
                let list = PyList::new(self.py, self.items)?;
                wrap(self.py, self.variant, list.into_any())
            }
        }
    };
}
list_ser!(SerializeSeq, serialize_element);
list_ser!(SerializeTuple, serialize_element);
list_ser!(SerializeTupleStruct, serialize_field);
list_ser!(SerializeTupleVariant, serialize_field);

impl<'py> ser::SerializeMap for DictSer<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = SerError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), SerError> {
        self.key = Some(key.serialize(KeySer { py: self.py })?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), SerError> {
        let Some(k) = self.key.take() else {
            return Err(SerError("a map value came without its key".into()));
        };
        self.dict
            .set_item(k, value.serialize(Ser { py: self.py })?)?;
        Ok(())
    }
    fn end(self) -> R<'py> {
        wrap(self.py, self.variant, self.dict.into_any())
    }
}

impl<'py> ser::SerializeStruct for DictSer<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = SerError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        let v = value.serialize(Ser { py: self.py })?;
        self.dict.set_item(field_key(self.py, key), v)?;
        Ok(())
    }
    fn end(self) -> R<'py> {
        wrap(self.py, self.variant, self.dict.into_any())
    }
}

impl<'py> ser::SerializeStructVariant for DictSer<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = SerError;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), SerError> {
        ser::SerializeStruct::serialize_field(self, key, value)
    }
    fn end(self) -> R<'py> {
        wrap(self.py, self.variant, self.dict.into_any())
    }
}

/// Map keys: strings (cached) and numbers (as their decimal text, as JSON
/// writes them).
struct KeySer<'py> {
    py: Python<'py>,
}

impl<'py> KeySer<'py> {
    fn number(self, n: impl fmt::Display) -> R<'py> {
        Ok(PyString::new(self.py, &n.to_string()).into_any())
    }
}

fn key_error<'py>() -> R<'py> {
    Err(SerError("map keys must be strings or numbers".into()))
}

impl<'py> ser::Serializer for KeySer<'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = SerError;
    type SerializeSeq = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeTuple = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeTupleStruct = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeTupleVariant = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeMap = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeStruct = ser::Impossible<Bound<'py, PyAny>, SerError>;
    type SerializeStructVariant = ser::Impossible<Bound<'py, PyAny>, SerError>;

    fn serialize_str(self, v: &str) -> R<'py> {
        Ok(name_key(self.py, v).into_any())
    }
    fn serialize_char(self, v: char) -> R<'py> {
        self.number(v)
    }
    fn serialize_bool(self, v: bool) -> R<'py> {
        self.number(v)
    }
    fn serialize_i8(self, v: i8) -> R<'py> {
        self.number(v)
    }
    fn serialize_i16(self, v: i16) -> R<'py> {
        self.number(v)
    }
    fn serialize_i32(self, v: i32) -> R<'py> {
        self.number(v)
    }
    fn serialize_i64(self, v: i64) -> R<'py> {
        self.number(v)
    }
    fn serialize_u8(self, v: u8) -> R<'py> {
        self.number(v)
    }
    fn serialize_u16(self, v: u16) -> R<'py> {
        self.number(v)
    }
    fn serialize_u32(self, v: u32) -> R<'py> {
        self.number(v)
    }
    fn serialize_u64(self, v: u64) -> R<'py> {
        self.number(v)
    }
    fn serialize_f32(self, _v: f32) -> R<'py> {
        key_error()
    }
    fn serialize_f64(self, _v: f64) -> R<'py> {
        key_error()
    }
    fn serialize_bytes(self, _v: &[u8]) -> R<'py> {
        key_error()
    }
    fn serialize_none(self) -> R<'py> {
        key_error()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> R<'py> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> R<'py> {
        key_error()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> R<'py> {
        key_error()
    }
    fn serialize_unit_variant(self, _n: &'static str, _i: u32, variant: &'static str) -> R<'py> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> R<'py> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _value: &T,
    ) -> R<'py> {
        key_error()
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_tuple_struct(
        self,
        _n: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_tuple_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_struct(
        self,
        _n: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
    fn serialize_struct_variant(
        self,
        _n: &'static str,
        _i: u32,
        _v: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, SerError> {
        Err(SerError("map keys must be strings or numbers".into()))
    }
}
