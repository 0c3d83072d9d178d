//! JSON as the Python client holds it: objects keep their keys in the
//! order written (a `dict`), and text is made of values as Python makes it
//! (`str(value)`, and `json.dumps(value, separators=(",", ":"),
//! ensure_ascii=False)` for the compact JSON of a tool's input or a tool
//! call). [`super::request_json`] reads a request into this, so that the
//! text it sends to be counted is byte for byte the Python client's.
//!
//! Integers beyond 64 bits are read as floats (Python would keep them
//! exact): the only place the two may differ.

use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value whose objects keep their order (a duplicate key keeps its
/// first place and its last value, as `json.loads` does).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// Parses JSON text.
    pub(crate) fn parse(text: &str) -> Result<Json, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// `value.get(key)`: the value of an object's `key`; `None` when absent
    /// or when this is no object.
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(fields) => fields
                .iter()
                .find(|(name, _)| name == key)
                .map(|(_, value)| value),
            _ => None,
        }
    }

    /// `value.get(key)` with JSON `null` as absent (Python's `None`).
    pub(crate) fn field(&self, key: &str) -> Option<&Json> {
        self.get(key).filter(|value| !matches!(value, Json::Null))
    }

    /// The string, if this is one.
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(text) => Some(text),
            _ => None,
        }
    }

    /// Python's truth value: `None`, `False`, `0`, `0.0`, `""`, `[]` and
    /// `{}` are false.
    pub(crate) fn truthy(&self) -> bool {
        match self {
            Json::Null => false,
            Json::Bool(value) => *value,
            Json::Int(value) => *value != 0,
            Json::Float(value) => *value != 0.0,
            Json::Str(text) => !text.is_empty(),
            Json::Array(items) => !items.is_empty(),
            Json::Object(fields) => !fields.is_empty(),
        }
    }

    /// A short description for an error message: the value's JSON, cut.
    pub(crate) fn shown(&self) -> String {
        let text = self.compact();
        if text.chars().count() <= 60 {
            return text;
        }
        let cut: String = text.chars().take(57).collect();
        format!("{cut}...")
    }

    /// `json.dumps(value, separators=(",", ":"), ensure_ascii=False)`.
    pub(crate) fn compact(&self) -> String {
        let mut out = String::new();
        self.write_compact(&mut out);
        out
    }

    fn write_compact(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Int(value) => out.push_str(&value.to_string()),
            Json::Float(value) => out.push_str(&float_json(*value)),
            Json::Str(text) => push_string(out, text),
            Json::Array(items) => {
                out.push('[');
                for (index, item) in items.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    item.write_compact(out);
                }
                out.push(']');
            }
            Json::Object(fields) => {
                out.push('{');
                for (index, (name, value)) in fields.iter().enumerate() {
                    if index > 0 {
                        out.push(',');
                    }
                    push_string(out, name);
                    out.push(':');
                    value.write_compact(out);
                }
                out.push('}');
            }
        }
    }

    /// The client's `compact_json(value)`: a string as it is, anything else
    /// as compact JSON.
    pub(crate) fn compact_text(&self) -> String {
        match self {
            Json::Str(text) => text.clone(),
            other => other.compact(),
        }
    }

    /// Python's `str(value)` of a scalar; `None` for a list or an object,
    /// whose Python text (a `repr`) is not JSON's.
    pub(crate) fn py_str(&self) -> Option<String> {
        Some(match self {
            Json::Null => "None".into(),
            Json::Bool(true) => "True".into(),
            Json::Bool(false) => "False".into(),
            Json::Int(value) => value.to_string(),
            Json::Float(value) => float_repr(*value),
            Json::Str(text) => text.clone(),
            Json::Array(_) | Json::Object(_) => return None,
        })
    }

    /// Python's `str(value or "")`: the empty string for a false value.
    pub(crate) fn py_str_or_empty(value: Option<&Json>) -> Option<String> {
        match value {
            Some(value) if value.truthy() => value.py_str(),
            _ => Some(String::new()),
        }
    }
}

/// A string as JSON: `"`, `\` and control characters escaped (the short
/// forms where JSON has them), nothing else; `ensure_ascii=False`.
fn push_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::to_string(text).unwrap_or_default());
}

/// A float as `json.dumps` writes it: its `repr`, and `NaN` / `Infinity`.
fn float_json(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "Infinity" } else { "-Infinity" }.into()
    } else {
        float_repr(value)
    }
}

/// Python's `repr(float)`: the shortest digits that read back the same,
/// positional for decimal exponents from -4 to 15 (`1e-05`, `0.0001`,
/// `1000000000000000.0`, `1e+16`).
fn float_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` has the same shortest round-trip digits: "-1.5e-7".
    let scientific = format!("{value:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exponent) {
        let point = exponent + 1;
        if point <= 0 {
            let zeros = "0".repeat((-point) as usize);
            return format!("{sign}0.{zeros}{digits}");
        }
        let point = point as usize;
        if digits.len() <= point {
            let zeros = "0".repeat(point - digits.len());
            return format!("{sign}{digits}{zeros}.0");
        }
        return format!("{sign}{}.{}", &digits[..point], &digits[point..]);
    }
    let (first, rest) = digits.split_at(1);
    let fraction = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    let exponent_sign = if exponent < 0 { '-' } else { '+' };
    format!(
        "{sign}{first}{fraction}e{exponent_sign}{:02}",
        exponent.abs()
    )
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Json, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json, D::Error> {
        Json::deserialize(deserializer)
    }

    fn visit_bool<E>(self, value: bool) -> Result<Json, E> {
        Ok(Json::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Json, E> {
        Ok(Json::Int(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Json, E> {
        Ok(Json::Int(value.into()))
    }

    fn visit_f64<E>(self, value: f64) -> Result<Json, E> {
        Ok(Json::Float(value))
    }

    fn visit_str<E>(self, value: &str) -> Result<Json, E> {
        Ok(Json::Str(value.to_string()))
    }

    fn visit_string<E>(self, value: String) -> Result<Json, E> {
        Ok(Json::Str(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut fields: Vec<(String, Json)> = Vec::new();
        while let Some((name, value)) = map.next_entry::<String, Json>()? {
            match fields.iter_mut().find(|(known, _)| *known == name) {
                Some(field) => field.1 = value,
                None => fields.push((name, value)),
            }
        }
        Ok(Json::Object(fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_keeps_the_order_and_pythons_numbers() {
        let value = Json::parse(
            r#"{"b": 1, "a": [1.0, 1e-7, 1e16, 123456789012345.5, -0.0001, 2.5e300],
                "c": "é\n\"", "b": true}"#,
        )
        .unwrap();
        assert_eq!(
            value.compact(),
            r#"{"b":true,"a":[1.0,1e-07,1e+16,123456789012345.5,-0.0001,2.5e+300],"c":"é\n\""}"#
        );
    }

    #[test]
    fn python_str_and_truth() {
        let value = Json::parse(r#"[null, true, 0, 1.5, "", [], {"a": 1}, 100000.0]"#).unwrap();
        let Json::Array(items) = value else { panic!() };
        let strs: Vec<_> = items.iter().map(Json::py_str).collect();
        assert_eq!(
            strs,
            [
                Some("None".into()),
                Some("True".into()),
                Some("0".into()),
                Some("1.5".into()),
                Some(String::new()),
                None,
                None,
                Some("100000.0".into()),
            ]
        );
        let truth: Vec<_> = items.iter().map(Json::truthy).collect();
        assert_eq!(truth, [false, true, false, true, false, false, true, true]);
        assert_eq!(float_repr(1e-5), "1e-05");
        assert_eq!(float_repr(0.0001), "0.0001");
        assert_eq!(float_repr(1e15), "1000000000000000.0");
        assert_eq!(float_repr(-0.0), "-0.0");
    }
}
