//! Options: a component's `options` table reaches the plugin as JSON; [`parse_options`] turns
//! it into the plugin's own type or one [`ConfigProblem`] at the exact key path.

use crate::types::ConfigProblem;
use serde::de::DeserializeOwned;

/// Parses a component's options JSON (empty = `{}`, i.e. all defaults) into `T`. On failure
/// the problem names the exact key path inside the options table (`lora.rank`,
/// `targets[2]`; an unknown key is named itself) and the message carries no position in the
/// JSON text. Use the same call in
/// [`Plugin::validate_config`](super::Plugin::validate_config) and the constructor.
pub fn parse_options<T: DeserializeOwned>(
    options_json: &str,
) -> std::result::Result<T, ConfigProblem> {
    let json = if options_json.trim().is_empty() {
        "{}"
    } else {
        options_json
    };
    let mut de = serde_json::Deserializer::from_str(json);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let mut key: Vec<String> = Vec::new();
        for segment in e.path().iter() {
            use serde_path_to_error::Segment;
            match segment {
                Segment::Seq { index } => match key.last_mut() {
                    Some(last) => last.push_str(&format!("[{index}]")),
                    None => key.push(format!("[{index}]")),
                },
                Segment::Map { key: k } | Segment::Enum { variant: k } => key.push(k.clone()),
                Segment::Unknown => {}
            }
        }
        let message = json_message(e.inner());
        // An unknown or missing key is reported at its own path, not at the table holding it.
        if let Some(name) = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix))
            .and_then(|rest| rest.split_once('`'))
            .map(|(name, _)| name)
            && key.last().map(String::as_str) != Some(name)
        {
            key.push(name.to_owned());
        }
        ConfigProblem::new(key.join("."), message)
            .with_help("fix the component's options table in the job file; see `tandem plugins`")
    })?;
    de.end()
        .map_err(|e| ConfigProblem::new("", json_message(&e)))?;
    Ok(value)
}

/// A serde_json error's message without its position in the JSON text (which is the host's
/// serialisation of the job file's table, meaningless to a user).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    text.strip_suffix(&suffix).unwrap_or(&text).to_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Lora {
        rank: u32,
        #[serde(default)]
        targets: Vec<String>,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Opts {
        max_batch: usize,
        lora: Option<Lora>,
        mode: Mode,
    }

    #[derive(Debug, serde::Deserialize, Default)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        #[default]
        Fast,
        Slow,
    }

    fn problem(json: &str) -> ConfigProblem {
        match parse_options::<Opts>(json) {
            Ok(o) => panic!("expected a problem, parsed {o:?}"),
            Err(p) => p,
        }
    }

    #[test]
    fn parse_options_defaults_on_empty_and_parses_values() {
        let o: Opts = parse_options("  ").unwrap();
        assert_eq!(o.max_batch, 0);
        let o: Opts = parse_options(
            r#"{"max_batch": 4, "lora": {"rank": 8, "targets": ["q"]}, "mode": "slow"}"#,
        )
        .unwrap();
        assert_eq!(o.max_batch, 4);
        let lora = o.lora.unwrap();
        assert_eq!((lora.rank, lora.targets), (8, vec!["q".to_owned()]));
        assert!(matches!(o.mode, Mode::Slow));
    }

    #[test]
    fn parse_options_names_the_exact_key_path() {
        let p = problem(r#"{"max_batch": "x"}"#);
        assert_eq!(p.key.as_str(), "max_batch");
        assert!(p.message.starts_with("invalid type: string \"x\""), "{p}");
        assert!(!p.message.contains("line 1"), "no JSON position: {p}");
        assert!(!p.help.is_empty());

        let p = problem(r#"{"max_batc": 3}"#);
        assert_eq!(p.key.as_str(), "max_batc", "{p}");
        assert!(p.message.contains("unknown field `max_batc`"), "{p}");

        let p = problem(r#"{"lora": {"rank": 8, "alpha": 1}}"#);
        assert_eq!(p.key.as_str(), "lora.alpha", "{p}");

        let p = problem(r#"{"lora": {"targets": []}}"#);
        assert_eq!(p.key.as_str(), "lora.rank", "{p}");
        assert_eq!(p.message.as_str(), "missing field `rank`", "{p}");

        let p = problem(r#"{"lora": {"rank": -1}}"#);
        assert_eq!(p.key.as_str(), "lora.rank", "{p}");

        let p = problem(r#"{"lora": {"targets": ["q", 3]}}"#);
        assert_eq!(p.key.as_str(), "lora.targets[1]", "{p}");

        let p = problem(r#"{"mode": "medium"}"#);
        assert_eq!(p.key.as_str(), "mode", "{p}");
        assert!(p.message.contains("unknown variant `medium`"), "{p}");

        let p = problem(r#"{"max_batch": 1} x"#);
        assert_eq!(p.key.as_str(), "", "{p}");
        assert_eq!(
            p.to_error("engine `e`").message.as_str(),
            format!("engine `e` options: {}", p.message)
        );
        let p = problem(r#"{"max_batch": 1.5}"#);
        assert_eq!(
            p.to_error("engine `e`").message.as_str(),
            format!("engine `e` options: max_batch: {}", p.message)
        );
    }
}
