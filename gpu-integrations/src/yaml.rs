//! YAML output that every YAML reader takes the same way.
//!
//! serde_yaml_ng writes `0000:08:00.0` unquoted, which YAML 1.1 readers (PyYAML, and so
//! `kubernetes-validate`) parse as a base-60 integer, and would write `on` or `y` where a 1.1
//! reader sees a boolean. This emitter keeps field order and block style but quotes every string
//! that is not a plain word, so an address, a quantity or a CEL expression stays a string.

use serde::Serialize;
use serde_yaml_ng::Value;

/// Words YAML 1.1 or 1.2 reads as something other than a string.
const RESERVED: [&str; 22] = [
    "y", "yes", "n", "no", "true", "false", "on", "off", "null", "~", "Y", "Yes", "YES", "N", "No",
    "NO", "True", "TRUE", "False", "FALSE", "On", "Off",
];

fn plain_ok(s: &str) -> bool {
    let mut chars = s.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    first.is_ascii_alphabetic()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !RESERVED.contains(&s)
        && !RESERVED.iter().any(|r| r.eq_ignore_ascii_case(s))
}

fn quoted(s: &str) -> String {
    // A JSON string literal is a valid YAML double-quoted scalar.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if plain_ok(s) => Some(s.clone()),
        Value::String(s) if is_block(s) => None,
        Value::String(s) => Some(quoted(s)),
        Value::Sequence(q) if q.is_empty() => Some("[]".into()),
        Value::Mapping(m) if m.is_empty() => Some("{}".into()),
        Value::Tagged(t) => scalar(&t.value),
        _ => None,
    }
}

/// Multi-line text that reads well as a `|` block.
fn is_block(s: &str) -> bool {
    s.ends_with('\n')
        && s.trim_end_matches('\n').contains('\n')
        && !s.starts_with(' ')
        && s.chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{feff}'))
        && !s.lines().any(|l| l.starts_with(' ') || l.ends_with(' '))
        && !s.trim_end_matches('\n').contains("\n\n\n")
}

fn key(k: &Value) -> String {
    match k {
        Value::String(s) if plain_ok(s) => s.clone(),
        Value::String(s) => quoted(s),
        other => scalar(other).unwrap_or_else(|| "\"?\"".into()),
    }
}

fn emit(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Mapping(m) if !m.is_empty() => {
            for (k, val) in m {
                out.push_str(&pad);
                out.push_str(&key(k));
                out.push(':');
                emit_value(val, indent, out);
            }
        }
        Value::Sequence(q) if !q.is_empty() => {
            for item in q {
                let mut inner = String::new();
                match scalar(item) {
                    Some(s) => {
                        out.push_str(&pad);
                        out.push_str("- ");
                        out.push_str(&s);
                        out.push('\n');
                        continue;
                    }
                    None => emit(item, indent + 2, &mut inner),
                }
                // The first line of the nested block moves up behind the dash.
                let body = inner.get(indent + 2..).unwrap_or("");
                out.push_str(&pad);
                out.push_str("- ");
                out.push_str(body);
            }
        }
        Value::Tagged(t) => emit(&t.value, indent, out),
        other => {
            if let Value::String(s) = other {
                if is_block(s) {
                    for line in s.trim_end_matches('\n').split('\n') {
                        if !line.is_empty() {
                            out.push_str(&pad);
                        }
                        out.push_str(line);
                        out.push('\n');
                    }
                    return;
                }
            }
            out.push_str(&pad);
            out.push_str(&scalar(other).unwrap_or_default());
            out.push('\n');
        }
    }
}

fn emit_value(val: &Value, indent: usize, out: &mut String) {
    match scalar(val) {
        Some(s) => {
            out.push(' ');
            out.push_str(&s);
            out.push('\n');
        }
        None => match val {
            Value::String(_) => {
                out.push_str(" |\n");
                emit(val, indent + 2, out);
            }
            Value::Sequence(_) => {
                out.push('\n');
                emit(val, indent, out);
            }
            _ => {
                out.push('\n');
                emit(val, indent + 2, out);
            }
        },
    }
}

/// `value` as pretty JSON, with a final newline.
///
/// # Errors
/// When `value` cannot be represented.
pub fn json<T: Serialize>(value: &T) -> crate::Result<String> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| crate::IntegrationError::render("JSON", e))?;
    Ok(text + "\n")
}

/// Kubernetes objects as a YAML stream (`---` before each document) or, with `json`, one JSON
/// `List` of them.
///
/// # Errors
/// When an object cannot be represented.
pub fn objects<T: Serialize>(objects: &[T], json: bool) -> crate::Result<String> {
    if json {
        let items = serde_json::to_value(objects)
            .map_err(|e| crate::IntegrationError::render("JSON", e))?;
        let mut list = std::collections::BTreeMap::new();
        list.insert("apiVersion", serde_json::json!("v1"));
        list.insert("kind", serde_json::json!("List"));
        list.insert("items", items);
        return self::json(&list);
    }
    let mut out = String::new();
    for o in objects {
        out.push_str("---\n");
        out.push_str(&to_string(o)?);
    }
    Ok(out)
}

/// Serializes `value` as one YAML document (no `---`).
///
/// # Errors
/// When `value` cannot be represented (a map with non-string keys of a complex kind).
pub fn to_string<T: Serialize>(value: &T) -> crate::Result<String> {
    let v =
        serde_yaml_ng::to_value(value).map_err(|e| crate::IntegrationError::render("YAML", e))?;
    let mut out = String::new();
    match scalar(&v) {
        Some(s) if !matches!(v, Value::Mapping(_) | Value::Sequence(_)) => {
            out.push_str(&s);
            out.push('\n');
        }
        _ => emit(&v, 0, &mut out),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn addresses_and_reserved_words_stay_strings() {
        let y = to_string(&json!({"a": "0000:08:00.0", "b": "on", "c": "1", "d": "gpu", "e": 3}))
            .unwrap();
        assert_eq!(
            y,
            "a: \"0000:08:00.0\"\nb: \"on\"\nc: \"1\"\nd: gpu\ne: 3\n"
        );
        let back: serde_json::Value = serde_yaml_ng::from_str(&y).unwrap();
        assert_eq!(back["a"], "0000:08:00.0");
    }

    #[test]
    fn nested_lists_of_maps_are_block_style() {
        let y =
            to_string(&json!({"items": [{"name": "x", "v": [1, 2]}, "s"], "empty": []})).unwrap();
        let back: serde_json::Value = serde_yaml_ng::from_str(&y).unwrap();
        assert_eq!(
            back,
            json!({"items": [{"name": "x", "v": [1, 2]}, "s"], "empty": []})
        );
        assert!(y.contains("- name: x\n"), "{y}");
    }

    #[test]
    fn multi_line_text_is_a_literal_block() {
        let y = to_string(&json!({"content": "a=1\nb=2\n"})).unwrap();
        assert_eq!(y, "content: |\n  a=1\n  b=2\n");
        let back: serde_json::Value = serde_yaml_ng::from_str(&y).unwrap();
        assert_eq!(back["content"], "a=1\nb=2\n");
    }
}
