//! The `json_schema` verifier: a documented subset of JSON Schema, checked in Rust (the
//! `jsonschema` crate brings ~40 crates — regex engines, URL and e-mail parsers, a resolver
//! for remote `$ref`s — for what this verifier needs).
//!
//! Supported keywords: `type` (one name or a list; `integer` accepts a number with no
//! fraction), `enum`, `const`, `properties`, `required`, `additionalProperties` (`false` or a
//! schema), `items` (one schema), `minItems`, `maxItems`, `minLength`, `maxLength` (in
//! characters), `minimum`, `maximum`. Annotations (`$schema`, `$id`, `title`,
//! `description`, `default`, `examples`) are ignored. Any other keyword (`$ref`, `oneOf`,
//! `pattern`, `format`, ...) is refused when the environment is built, so nothing is silently
//! unchecked.

use serde_json::{Map, Value};

/// The help line of a refused schema.
pub const SUPPORTED_HELP: &str = "supported keywords: type, enum, const, properties, required, \
additionalProperties, items, minItems, maxItems, minLength, maxLength, minimum, maximum";

const CHECKED: &[&str] = &[
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
];
const IGNORED: &[&str] = &[
    "$schema",
    "$id",
    "title",
    "description",
    "default",
    "examples",
];
const TYPES: &[&str] = &[
    "null", "boolean", "object", "array", "number", "string", "integer",
];

/// A schema checked at build time to use only the supported keywords.
#[derive(Debug, Clone)]
pub struct Schema(Value);

fn check(schema: &Value, at: &str) -> Result<(), String> {
    let Value::Object(map) = schema else {
        return match schema {
            Value::Bool(_) => Ok(()),
            _ => Err(format!("{at}: a schema must be a table")),
        };
    };
    for (k, v) in map {
        if IGNORED.contains(&k.as_str()) {
            continue;
        }
        if !CHECKED.contains(&k.as_str()) {
            return Err(format!("{at}: the keyword `{k}` is not supported"));
        }
        match k.as_str() {
            "type" => {
                let names: Vec<&Value> = match v {
                    Value::Array(a) => a.iter().collect(),
                    other => vec![other],
                };
                if let Some(bad) = names
                    .iter()
                    .find(|n| !n.as_str().is_some_and(|n| TYPES.contains(&n)))
                {
                    return Err(format!("{at}.type: {bad} is not a JSON Schema type"));
                }
            }
            "properties" => {
                let props = v
                    .as_object()
                    .ok_or(format!("{at}.properties must be a table"))?;
                for (name, s) in props {
                    check(s, &format!("{at}.properties.{name}"))?;
                }
            }
            "additionalProperties" | "items" => check(v, &format!("{at}.{k}"))?,
            "required" | "enum" if !v.is_array() => return Err(format!("{at}.{k} must be a list")),
            "minItems" | "maxItems" | "minLength" | "maxLength" if !v.is_u64() => {
                return Err(format!("{at}.{k} must be a non-negative integer"));
            }
            "minimum" | "maximum" if !v.is_number() => {
                return Err(format!("{at}.{k} must be a number"));
            }
            _ => {}
        }
    }
    Ok(())
}

fn is_type(v: &Value, name: &str) -> bool {
    match name {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

fn numbers_equal(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    }
}

fn valid(schema: &Value, v: &Value) -> bool {
    let map: &Map<String, Value> = match schema {
        Value::Bool(b) => return *b,
        Value::Object(m) => m,
        _ => return false,
    };
    let limit = |k: &str| map.get(k).and_then(Value::as_u64).map(|n| n as usize);
    let num = |k: &str| map.get(k).and_then(Value::as_f64);
    map.iter().all(|(k, s)| match k.as_str() {
        "type" => match s {
            Value::Array(names) => names
                .iter()
                .any(|n| n.as_str().is_some_and(|n| is_type(v, n))),
            n => n.as_str().is_some_and(|n| is_type(v, n)),
        },
        "enum" => s
            .as_array()
            .is_some_and(|a| a.iter().any(|e| numbers_equal(e, v))),
        "const" => numbers_equal(s, v),
        "required" => match v {
            Value::Object(o) => s.as_array().is_some_and(|r| {
                r.iter()
                    .all(|n| n.as_str().is_some_and(|n| o.contains_key(n)))
            }),
            _ => true,
        },
        "properties" => match (v, s) {
            (Value::Object(o), Value::Object(props)) => props
                .iter()
                .all(|(n, ps)| o.get(n).is_none_or(|x| valid(ps, x))),
            _ => true,
        },
        "additionalProperties" => match v {
            Value::Object(o) => {
                let props = map.get("properties").and_then(Value::as_object);
                o.iter()
                    .filter(|(n, _)| props.is_none_or(|p| !p.contains_key(*n)))
                    .all(|(_, x)| valid(s, x))
            }
            _ => true,
        },
        "items" => v.as_array().is_none_or(|a| a.iter().all(|x| valid(s, x))),
        "minItems" => v
            .as_array()
            .is_none_or(|a| limit(k).is_none_or(|n| a.len() >= n)),
        "maxItems" => v
            .as_array()
            .is_none_or(|a| limit(k).is_none_or(|n| a.len() <= n)),
        "minLength" => v
            .as_str()
            .is_none_or(|t| limit(k).is_none_or(|n| t.chars().count() >= n)),
        "maxLength" => v
            .as_str()
            .is_none_or(|t| limit(k).is_none_or(|n| t.chars().count() <= n)),
        "minimum" => v.as_f64().is_none_or(|x| num(k).is_none_or(|m| x >= m)),
        "maximum" => v.as_f64().is_none_or(|x| num(k).is_none_or(|m| x <= m)),
        _ => true,
    })
}

/// The JSON a completion holds: the whole trimmed text, or the content of its first fenced
/// block (```` ```json ... ``` ````).
pub fn completion_json(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    let start = t.find("```")? + 3;
    let body = &t[start..];
    let body = body.strip_prefix("json").unwrap_or(body);
    let end = body.find("```")?;
    serde_json::from_str(body[..end].trim()).ok()
}

impl Schema {
    /// The schema, or which keyword (and where) is not supported.
    pub fn new(schema: Value) -> Result<Schema, String> {
        check(&schema, "schema")?;
        Ok(Schema(schema))
    }

    /// Whether `value` validates.
    pub fn accepts(&self, value: &Value) -> bool {
        valid(&self.0, value)
    }

    /// Whether the completion holds JSON ([`completion_json`]) that validates.
    pub fn accepts_completion(&self, text: &str) -> bool {
        completion_json(text).is_some_and(|v| self.accepts(&v))
    }
}
