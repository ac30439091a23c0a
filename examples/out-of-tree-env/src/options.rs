//! The environment's options (`[environment.options]`): how many numbers a problem gives and
//! the largest target. Unknown keys and out-of-range values are refused at their key.

use tandem_plugin_api::ConfigProblem;
use tandem_plugin_api::sdk::parse_options;
use tandem_plugin_api::serde::Deserialize;

/// `[environment.options]` of `countdown`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(crate = "tandem_plugin_api::serde", deny_unknown_fields, default)]
pub struct Options {
    /// Numbers given per problem (2 to 6; default 4).
    pub numbers: u32,
    /// Largest target (10 to 100000; default 200).
    pub max_target: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            numbers: 4,
            max_target: 200,
        }
    }
}

impl Options {
    /// Parses and checks the options JSON.
    pub fn parse(json: &str) -> Result<Options, ConfigProblem> {
        let o: Options = parse_options(json)?;
        if !(2..=6).contains(&o.numbers) {
            return Err(ConfigProblem::new("numbers", "must be between 2 and 6"));
        }
        if !(10..=100_000).contains(&o.max_target) {
            return Err(ConfigProblem::new(
                "max_target",
                "must be between 10 and 100000",
            ));
        }
        Ok(o)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals_at_their_key() {
        assert_eq!(Options::parse("").unwrap(), Options::default());
        assert_eq!(Options::parse(r#"{"numbers": 6}"#).unwrap().numbers, 6);
        for (json, key) in [
            (r#"{"numbers": 1}"#, "numbers"),
            (r#"{"max_target": 5}"#, "max_target"),
            (r#"{"numbers": "x"}"#, "numbers"),
            (r#"{"zip": true}"#, "zip"),
        ] {
            assert_eq!(
                Options::parse(json).unwrap_err().key.as_str(),
                key,
                "{json}"
            );
        }
    }
}
