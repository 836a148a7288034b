//! A serde deserializer reading Python data directly (dicts, lists, tuples, str, int, float,
//! bool, None, and other mappings and sequences), for the per-call paths.
//!
//! Compared with a generic Python-object deserializer it skips the dataclass probe (a raised and
//! swallowed `AttributeError` per struct) and the key and value lists built per dict; compared
//! with reading into a `serde_json::Value` first it skips that intermediate tree.

use std::fmt;

use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyMapping, PySequence, PyString, PyTuple,
};
use serde::de::{self, DeserializeOwned, Visitor};

/// Nesting deeper than this is refused (documents are a few levels deep; a dict that contains
/// itself would otherwise recurse without end).
const MAX_DEPTH: usize = 128;

/// An error of [`from_py`]: the first value that did not fit, in serde's words.
#[derive(Debug)]
pub struct DeError(String);

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError(msg.to_string())
    }
}

impl From<PyErr> for DeError {
    fn from(e: PyErr) -> Self {
        DeError(e.to_string())
    }
}

/// Deserializes `T` from Python data.
///
/// # Errors
/// The first value that does not fit `T` (unknown key, wrong type, missing field), or a value
/// with no JSON/YAML form (a non-string key, a `set`, `nan`).
pub fn from_py<T: DeserializeOwned>(obj: &Bound<'_, PyAny>) -> Result<T, DeError> {
    T::deserialize(De { obj, depth: 0 })
}

struct De<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    depth: usize,
}

impl De<'_, '_> {
    fn deeper(&self) -> Result<usize, DeError> {
        if self.depth >= MAX_DEPTH {
            return Err(DeError(format!("nested more than {MAX_DEPTH} levels deep")));
        }
        Ok(self.depth + 1)
    }
}

fn text(s: &Bound<'_, PyString>) -> Result<String, DeError> {
    Ok(s.to_cow()?.into_owned())
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "object".to_owned(), |n| n.to_string())
}

/// A dict's or mapping's entries, read in order.
struct MapDe<'py> {
    items: std::vec::IntoIter<(Bound<'py, PyAny>, Bound<'py, PyAny>)>,
    value: Option<Bound<'py, PyAny>>,
    depth: usize,
}

impl<'de> de::MapAccess<'de> for MapDe<'_> {
    type Error = DeError;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((k, v)) = self.items.next() else {
            return Ok(None);
        };
        self.value = Some(v);
        let Ok(k) = k.cast::<PyString>() else {
            return Err(DeError(format!("keys must be strings, not {k}")));
        };
        seed.deserialize(de::value::StringDeserializer::<DeError>::new(text(k)?))
            .map(Some)
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, DeError> {
        let Some(v) = self.value.take() else {
            return Err(DeError("a map value was read before its key".into()));
        };
        seed.deserialize(De {
            obj: &v,
            depth: self.depth,
        })
    }
}

/// A list's, tuple's or sequence's items.
struct SeqDe<'py> {
    items: std::vec::IntoIter<Bound<'py, PyAny>>,
    depth: usize,
}

impl<'de> de::SeqAccess<'de> for SeqDe<'_> {
    type Error = DeError;

    fn next_element_seed<T: de::DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            None => Ok(None),
            Some(v) => seed
                .deserialize(De {
                    obj: &v,
                    depth: self.depth,
                })
                .map(Some),
        }
    }
}

/// An enum given as `"variant"` or `{"variant": value}`.
struct EnumDe<'py> {
    variant: String,
    value: Option<Bound<'py, PyAny>>,
    depth: usize,
}

impl<'de, 'py> de::EnumAccess<'de> for EnumDe<'py> {
    type Error = DeError;
    type Variant = VariantDe<'py>;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, VariantDe<'py>), DeError> {
        let v = seed.deserialize(de::value::StringDeserializer::<DeError>::new(self.variant))?;
        Ok((
            v,
            VariantDe {
                value: self.value,
                depth: self.depth,
            },
        ))
    }
}

struct VariantDe<'py> {
    value: Option<Bound<'py, PyAny>>,
    depth: usize,
}

impl VariantDe<'_> {
    fn value(&self) -> Result<De<'_, '_>, DeError> {
        match &self.value {
            Some(obj) => Ok(De {
                obj,
                depth: self.depth,
            }),
            None => Err(DeError("this variant needs a value".into())),
        }
    }
}

impl<'de> de::VariantAccess<'de> for VariantDe<'_> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        match &self.value {
            None => Ok(()),
            Some(v) if v.is_none() => Ok(()),
            Some(_) => Err(DeError("this variant takes no value".into())),
        }
    }
    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, DeError> {
        seed.deserialize(self.value()?)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self.value()?, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_map(self.value()?, visitor)
    }
}

impl<'de> de::Deserializer<'de> for De<'_, '_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let obj = self.obj;
        if obj.is_none() {
            return visitor.visit_unit();
        }
        if let Ok(d) = obj.cast::<PyDict>() {
            let depth = self.deeper()?;
            let items: Vec<_> = d.iter().collect();
            return visitor.visit_map(MapDe {
                items: items.into_iter(),
                value: None,
                depth,
            });
        }
        if let Ok(s) = obj.cast::<PyString>() {
            return visitor.visit_string(text(s)?);
        }
        // `bool` is a subclass of `int`: test it first.
        if let Ok(b) = obj.cast::<PyBool>() {
            return visitor.visit_bool(b.is_true());
        }
        if let Ok(i) = obj.cast::<PyInt>() {
            if let Ok(n) = i.extract::<i64>() {
                return visitor.visit_i64(n);
            }
            return match i.extract::<u64>() {
                Ok(n) => visitor.visit_u64(n),
                Err(_) => Err(DeError(format!("integer {i} is out of range"))),
            };
        }
        if let Ok(f) = obj.cast::<PyFloat>() {
            let v = f.value();
            if !v.is_finite() {
                return Err(DeError(format!("{v} is not a finite number")));
            }
            return visitor.visit_f64(v);
        }
        if let Ok(l) = obj.cast::<PyList>() {
            let depth = self.deeper()?;
            let items: Vec<_> = l.iter().collect();
            return visitor.visit_seq(SeqDe {
                items: items.into_iter(),
                depth,
            });
        }
        if let Ok(t) = obj.cast::<PyTuple>() {
            let depth = self.deeper()?;
            let items: Vec<_> = t.iter().collect();
            return visitor.visit_seq(SeqDe {
                items: items.into_iter(),
                depth,
            });
        }
        if let Ok(m) = obj.cast::<PyMapping>() {
            let depth = self.deeper()?;
            let mut items = Vec::new();
            for item in m.items()?.iter() {
                items.push((item.get_item(0)?, item.get_item(1)?));
            }
            return visitor.visit_map(MapDe {
                items: items.into_iter(),
                value: None,
                depth,
            });
        }
        if !obj.is_instance_of::<PyBytes>() {
            if let Ok(seq) = obj.cast::<PySequence>() {
                let depth = self.deeper()?;
                let mut items = Vec::new();
                for v in seq.try_iter()? {
                    items.push(v?);
                }
                return visitor.visit_seq(SeqDe {
                    items: items.into_iter(),
                    depth,
                });
            }
        }
        Err(DeError(format!(
            "a value of type {} has no JSON/YAML form",
            type_name(obj)
        )))
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if self.obj.is_none() {
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if let Ok(s) = self.obj.cast::<PyString>() {
            return visitor.visit_enum(EnumDe {
                variant: text(s)?,
                value: None,
                depth: self.depth,
            });
        }
        if let Ok(d) = self.obj.cast::<PyDict>() {
            if d.len() == 1 {
                if let Some((k, v)) = d.iter().next() {
                    let Ok(k) = k.cast::<PyString>() else {
                        return Err(DeError(format!("keys must be strings, not {k}")));
                    };
                    return visitor.visit_enum(EnumDe {
                        variant: text(k)?,
                        value: Some(v),
                        depth: self.deeper()?,
                    });
                }
            }
        }
        Err(DeError(format!(
            "expected a variant name or a one-key dict, not a {}",
            type_name(self.obj)
        )))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct identifier
        ignored_any
    }
}
