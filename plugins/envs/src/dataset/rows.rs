//! Column mapping: which columns hold the prompt, answer, data source and id, and each row as
//! an [`EnvItem`] (every column not used goes to `metadata_json`).

use super::options::DatasetOptions;
use super::read::{at_key, file_error, type_name};
use serde_json::{Map, Value};
use std::path::Path;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{ChatMessage, EnvItem, RString, RVec};

/// Default answer columns, first present wins.
const ANSWERS: &[&str] = &["answer", "ground_truth", "reward_model.ground_truth"];

/// A row and the item made of it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The item (`id` is the id column's value or the row number within its file).
    pub item: EnvItem,
    /// The whole row, as read.
    pub row: Value,
}

/// The columns in use (answer and source may be absent).
#[derive(Debug, Clone)]
pub struct Columns {
    prompt: String,
    answer: Option<String>,
    source: Option<String>,
    id: Option<String>,
}

/// The value at a column or a dotted path (`reward_model.ground_truth`; a column whose name
/// has the dot itself wins).
pub fn lookup<'a>(row: &'a Value, path: &str) -> Option<&'a Value> {
    if let Some(v) = row.get(path) {
        return Some(v);
    }
    path.split('.').try_fold(row, |v, key| v.get(key))
}

fn columns_of(row: &Value) -> String {
    row.as_object()
        .map(|m| m.keys().map(String::as_str).collect::<Vec<_>>().join(", "))
        .unwrap_or_default()
}

impl Columns {
    /// Resolves the options' column names against the first row of `path`.
    pub fn resolve(
        options: &DatasetOptions,
        first: &Value,
        path: &Path,
        needs_answer: bool,
    ) -> Result<Columns> {
        let missing = |key: &str, column: &str| {
            let message = format!(
                "has no column `{column}`; its columns are: {}",
                columns_of(first)
            );
            let help = format!("set options.{key} to one of its columns");
            at_key(key, file_error(path, message, &help))
        };
        let prompt = match &options.prompt {
            Some(c) if lookup(first, c).is_none() => return Err(missing("prompt", c)),
            Some(c) => c.clone(),
            None if first.get("prompt").is_some() => "prompt".into(),
            None if first.get("messages").is_some() => "messages".into(),
            None => return Err(missing("prompt", "prompt` or `messages")),
        };
        let answer = match &options.answer {
            Some(c) if lookup(first, c).is_none() => return Err(missing("answer", c)),
            Some(c) => Some(c.clone()),
            None => ANSWERS
                .iter()
                .find(|c| lookup(first, c).is_some())
                .map(|c| (*c).to_owned()),
        };
        if answer.is_none() && needs_answer {
            return Err(missing(
                "answer",
                "answer`, `ground_truth` or `reward_model.ground_truth",
            ));
        }
        let source = match &options.source {
            Some(c) if lookup(first, c).is_none() => return Err(missing("source", c)),
            Some(c) => Some(c.clone()),
            None => first.get("data_source").map(|_| "data_source".to_owned()),
        };
        let id = match &options.id {
            Some(c) if lookup(first, c).is_none() => return Err(missing("id", c)),
            other => other.clone(),
        };
        Ok(Columns {
            prompt,
            answer,
            source,
            id,
        })
    }

    /// The top-level columns this mapping uses.
    fn used(&self) -> Vec<&str> {
        [
            Some(&self.prompt),
            self.answer.as_ref(),
            self.source.as_ref(),
            self.id.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|c| c.split('.').next().unwrap_or(c))
        .collect()
    }

    /// Row `n` (0-based within the file `path`) as an entry.
    pub fn entry(&self, row: Value, n: usize, path: &Path) -> Result<Entry> {
        let at = |column: &str, what: String, help: &str| {
            file_error(path, format!("row {n}: column `{column}` {what}"), help)
        };
        let get = |column: &str| {
            lookup(&row, column).ok_or_else(|| {
                at(
                    column,
                    "is missing".into(),
                    "give every row the column, or choose another in the options",
                )
            })
        };
        let (prompt, messages) = match get(&self.prompt)? {
            Value::String(s) => (s.clone(), Vec::new()),
            Value::Array(list) => {
                let messages = list.iter().map(message).collect::<Option<Vec<_>>>().ok_or_else(|| {
                    at(&self.prompt, "is a list that is not chat messages".into(), "write the prompt as text or as a list of {\"role\", \"content\"} objects with string values")
                })?;
                (String::new(), messages)
            }
            other => {
                return Err(at(
                    &self.prompt,
                    format!("is a {}", type_name(other)),
                    "write the prompt as text or as a list of {\"role\", \"content\"} objects",
                ));
            }
        };
        if prompt.is_empty() && messages.is_empty() {
            return Err(at(
                &self.prompt,
                "is empty".into(),
                "give every row a prompt",
            ));
        }
        let scalar = |column: &str, what: &str| -> Result<String> {
            match get(column)? {
                Value::String(s) => Ok(s.clone()),
                Value::Number(x) => Ok(x.to_string()),
                Value::Bool(b) if what == "answer" => Ok(b.to_string()),
                v @ (Value::Array(_) | Value::Object(_)) if what == "answer" => Ok(v.to_string()),
                other => Err(at(
                    column,
                    format!("is a {}, not a {what}", type_name(other)),
                    &format!("give every row a {what} text"),
                )),
            }
        };
        let answer = self
            .answer
            .as_deref()
            .map(|c| scalar(c, "answer"))
            .transpose()?
            .unwrap_or_default();
        let source = self
            .source
            .as_deref()
            .map(|c| scalar(c, "data source"))
            .transpose()?
            .unwrap_or_default();
        let id = match &self.id {
            Some(c) => scalar(c, "id")?,
            None => n.to_string(),
        };
        let used = self.used();
        let metadata: Map<String, Value> = row
            .as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !used.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let item = EnvItem {
            id: RString::from(id),
            prompt: RString::from(prompt),
            messages: RVec::from(messages),
            answer: RString::from(answer),
            source: RString::from(source),
            metadata_json: RString::from(Value::Object(metadata).to_string()),
        };
        Ok(Entry { item, row })
    }
}

fn message(v: &Value) -> Option<ChatMessage> {
    Some(ChatMessage {
        role: RString::from(v.get("role")?.as_str()?),
        content: RString::from(v.get("content")?.as_str()?),
    })
}

/// What makes two prompts the same (the held-out overlap check): the text, or the messages.
pub fn prompt_key(item: &EnvItem) -> String {
    if item.messages.is_empty() {
        return item.prompt.to_string();
    }
    item.messages
        .iter()
        .map(|m| format!("{}\u{1}{}", m.role, m.content))
        .collect::<Vec<_>>()
        .join("\u{2}")
}
