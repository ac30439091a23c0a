//! Reward specs: the verifier table of one component (parsed with unknown keys refused), the
//! built verifier, and the weighted sum of components that scores samples.

use super::{ScoreInput, Scorer, choice, math, option_error, schema, text};
use serde::Deserialize;
use serde_json::Value;
use tandem_plugin_api::sdk::Result;
use tandem_plugin_api::{CompletionText, Reward};

/// The built-in verifier names, for help lines.
pub const VERIFIERS: &str = "exact, last_integer, boxed, math, regex, choice, json_schema, length";

/// One component's table as written (`weight` and `name` taken out first).
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "verifier", rename_all = "snake_case", deny_unknown_fields)]
enum VerifierSpec {
    Exact {},
    LastInteger {},
    Boxed {},
    Math {},
    Regex { pattern: String },
    Choice {},
    JsonSchema { schema: Value },
    Length { target: u32 },
}

/// A built verifier: a pure function of the completion (and the row's answer) to a value in
/// its [`range`](Verifier::range), or the reason the sample cannot be scored.
#[derive(Debug, Clone)]
pub enum Verifier {
    /// 1 when the trimmed completion equals the trimmed answer.
    Exact,
    /// 1 when the completion's last integer ([`crate::tasks::last_integer`]) is the answer's.
    LastInteger,
    /// 1 when the last `\boxed{...}` of the completion is equivalent to the answer
    /// ([`math::equivalent`], which also accepts equal normalised text).
    Boxed,
    /// 1 when the completion's final answer ([`math::final_answer`]) is equivalent to the
    /// answer ([`math::equivalent`]).
    Math,
    /// 1 when the capture (group `answer`, else group 1) of the pattern's last match in the
    /// completion equals the answer, both trimmed.
    Regex(regex::Regex),
    /// 1 when the multiple-choice letter of the completion ([`choice::extract`]) is the
    /// answer's.
    Choice,
    /// 1 when the completion (or its fenced JSON block) parses as JSON and validates against
    /// the schema ([`schema::Schema`]).
    JsonSchema(schema::Schema),
    /// The length penalty: `-min(1, max(0, tokens - target) / target)`, where `tokens` is the
    /// number of completion tokens; 0 up to `target` tokens, -1 at twice `target` and beyond.
    Length {
        /// Tokens allowed without penalty.
        target: u32,
    },
}

impl Verifier {
    /// The name components of this verifier take by default.
    pub fn name(&self) -> &'static str {
        match self {
            Verifier::Exact => "exact",
            Verifier::LastInteger => "last_integer",
            Verifier::Boxed => "boxed",
            Verifier::Math => "math",
            Verifier::Regex(_) => "regex",
            Verifier::Choice => "choice",
            Verifier::JsonSchema(_) => "json_schema",
            Verifier::Length { .. } => "length",
        }
    }

    /// Smallest and largest value.
    pub fn range(&self) -> (f64, f64) {
        match self {
            Verifier::Length { .. } => (-1.0, 0.0),
            _ => (0.0, 1.0),
        }
    }

    /// Whether the verifier compares with the answer.
    pub fn needs_answer(&self) -> bool {
        !matches!(self, Verifier::JsonSchema(_) | Verifier::Length { .. })
    }

    /// The value of `completion` against `answer`, or why it cannot be scored.
    pub fn score(
        &self,
        answer: &str,
        completion: &CompletionText,
    ) -> std::result::Result<f64, String> {
        let text = completion.text.as_str();
        let hit = |yes: bool| if yes { 1.0 } else { 0.0 };
        Ok(match self {
            Verifier::Exact => hit(text.trim() == answer.trim()),
            Verifier::LastInteger => {
                let want = crate::tasks::last_integer(answer)
                    .ok_or_else(|| format!("the answer `{answer}` has no integer"))?;
                hit(crate::tasks::last_integer(text) == Some(want))
            }
            Verifier::Boxed => {
                hit(text::last_boxed(text).is_some_and(|b| math::equivalent(b, answer)))
            }
            Verifier::Math => {
                hit(math::final_answer(text).is_some_and(|a| math::equivalent(a, answer)))
            }
            Verifier::Regex(re) => {
                hit(text::regex_capture(re, text).is_some_and(|c| c.trim() == answer.trim()))
            }
            Verifier::Choice => {
                let want = choice::answer_letter(answer)
                    .ok_or_else(|| format!("the answer `{answer}` is not a choice letter A-J"))?;
                hit(choice::extract(text) == Some(want))
            }
            Verifier::JsonSchema(schema) => hit(schema.accepts_completion(text)),
            Verifier::Length { target } => {
                let tokens = completion.token_ids.len() as f64;
                let target = f64::from(*target);
                -((tokens - target).max(0.0) / target).min(1.0)
            }
        })
    }

    fn build(spec: VerifierSpec, key: &str) -> Result<Verifier> {
        Ok(match spec {
            VerifierSpec::Exact {} => Verifier::Exact,
            VerifierSpec::LastInteger {} => Verifier::LastInteger,
            VerifierSpec::Boxed {} => Verifier::Boxed,
            VerifierSpec::Math {} => Verifier::Math,
            VerifierSpec::Choice {} => Verifier::Choice,
            VerifierSpec::Regex { pattern } => {
                Verifier::Regex(text::compile(&pattern).map_err(|e| {
                    option_error(
                        &format!("{key}.pattern"),
                        e,
                        "write a pattern with one capture group, e.g. \"Answer: (\\\\S+)\"",
                    )
                })?)
            }
            VerifierSpec::JsonSchema { schema } => {
                Verifier::JsonSchema(schema::Schema::new(schema).map_err(|e| {
                    option_error(&format!("{key}.schema"), e, schema::SUPPORTED_HELP)
                })?)
            }
            VerifierSpec::Length { target: 0 } => {
                return Err(option_error(
                    &format!("{key}.target"),
                    "must be at least 1",
                    "set target to the number of completion tokens allowed without penalty",
                ));
            }
            VerifierSpec::Length { target } => Verifier::Length { target },
        })
    }
}

/// One component of a reward: a verifier, its name and its weight.
#[derive(Debug, Clone)]
pub struct Component {
    /// Reported name (the verifier's unless `name` is set).
    pub name: String,
    /// Weight in the sum.
    pub weight: f64,
    /// The verifier.
    pub verifier: Verifier,
}

impl Component {
    /// Parses one component table at `key`.
    pub fn parse(value: &Value, key: &str) -> Result<Component> {
        let Value::Object(map) = value else {
            return Err(option_error(
                key,
                "must be a table",
                &format!("write e.g. {{ verifier = \"math\" }} (verifiers: {VERIFIERS})"),
            ));
        };
        let mut map = map.clone();
        let weight = match map.remove("weight") {
            None => 1.0,
            Some(w) => w.as_f64().filter(|w| w.is_finite()).ok_or_else(|| {
                option_error(
                    &format!("{key}.weight"),
                    format!("{w} is not a finite number"),
                    "write a number, e.g. weight = 0.5",
                )
            })?,
        };
        let name = match map.remove("name") {
            None => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            Some(other) => {
                return Err(option_error(
                    &format!("{key}.name"),
                    format!("{other} is not a non-empty string"),
                    "write a name, e.g. name = \"format\"",
                ));
            }
        };
        let spec: VerifierSpec =
            serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| {
                let path = e.path().to_string();
                let at = if path == "." {
                    key.to_owned()
                } else {
                    format!("{key}.{path}")
                };
                option_error(
                    &at,
                    e.inner(),
                    &format!("the built-in verifiers are {VERIFIERS}"),
                )
            })?;
        let verifier = Verifier::build(spec, key)?;
        Ok(Component {
            name: name.unwrap_or_else(|| verifier.name().to_owned()),
            weight,
            verifier,
        })
    }
}

/// A reward spec of built-in verifiers: the weighted sum of its components.
#[derive(Debug, Clone)]
pub struct WeightedSum {
    components: Vec<Component>,
}

impl WeightedSum {
    /// Parses a spec at `key`: one component table, or `{ components = [...] }`.
    pub fn parse(spec: &Value, key: &str) -> Result<WeightedSum> {
        let list = match spec.as_object().and_then(|m| m.get("components")) {
            None => vec![Component::parse(spec, key)?],
            Some(list) => {
                if let Some(other) = spec
                    .as_object()
                    .and_then(|m| m.keys().find(|k| *k != "components"))
                {
                    return Err(option_error(
                        &format!("{key}.{other}"),
                        "unknown key beside `components`",
                        "put verifier settings inside each component",
                    ));
                }
                let items = list.as_array().filter(|l| !l.is_empty()).ok_or_else(|| {
                    option_error(
                        &format!("{key}.components"),
                        "must be a non-empty list of components",
                        "write e.g. components = [{ verifier = \"math\" }]",
                    )
                })?;
                items
                    .iter()
                    .enumerate()
                    .map(|(i, c)| Component::parse(c, &format!("{key}.components[{i}]")))
                    .collect::<Result<Vec<_>>>()?
            }
        };
        for (i, c) in list.iter().enumerate() {
            if list[..i].iter().any(|d| d.name == c.name) {
                return Err(option_error(
                    &format!("{key}.components[{i}]"),
                    format!("a second component named `{}`", c.name),
                    "give one of them a `name`",
                ));
            }
        }
        Ok(WeightedSum { components: list })
    }

    /// The components.
    #[cfg(test)]
    pub fn components(&self) -> &[Component] {
        &self.components
    }

    fn score_one(&self, input: &ScoreInput<'_>) -> Reward {
        let item = &input.sample.item;
        let mut reward = Reward::ok(0.0);
        let mut sum = 0.0;
        for c in &self.components {
            let (lo, hi) = c.verifier.range();
            match c
                .verifier
                .score(item.answer.as_str(), &input.sample.completion)
            {
                Err(reason) => return Reward::failed(format!("{}: {reason}", c.name)),
                Ok(v) if !v.is_finite() || v < lo || v > hi => {
                    return Reward::failed(format!(
                        "{}: the value {v} is outside [{lo}, {hi}]",
                        c.name
                    ));
                }
                Ok(v) => {
                    sum += c.weight * v;
                    reward = reward.with_component(&c.name, v);
                }
            }
        }
        reward.value = sum as f32;
        reward
    }
}

impl Scorer for WeightedSum {
    fn components(&self) -> Vec<String> {
        self.components.iter().map(|c| c.name.clone()).collect()
    }

    fn range(&self) -> (f64, f64) {
        self.components.iter().fold((0.0, 0.0), |(lo, hi), c| {
            let (a, b) = c.verifier.range();
            let (a, b) = (c.weight * a, c.weight * b);
            (lo + a.min(b), hi + a.max(b))
        })
    }

    fn needs_answer(&self) -> bool {
        self.components.iter().any(|c| c.verifier.needs_answer())
    }

    fn score(&self, inputs: &[ScoreInput<'_>]) -> Vec<Reward> {
        inputs
            .iter()
            .map(|i| super::checked(self.score_one(i), self.range()))
            .collect()
    }
}
