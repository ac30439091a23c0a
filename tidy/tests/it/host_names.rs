//! The rule `host-names-no-plugin` on the fixture: the names come from the plugin crate's
//! source, a host literal equal to one is a violation unless the allowlist names it with a
//! reason, and an allowlist line that no longer matches is one too.

use crate::common;

use std::path::PathBuf;

use common::{Fixture, found};
use tandem_tidy::{HOST_NAMES_ALLOWLIST, Rule};

/// A plugin source declaring three component names (`fx` the plugin, `fx-engine` through a
/// const, `fx-bridge` through a helper's parameter) and three option keys (`draft-tokens`,
/// `maxLen`, `max_len`); the other structs, the test module and the `type` field are not
/// options.
const DECL: &str = r#"//! What the fixture plugin declares.

const COMPONENT: &str = "fx-engine";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Options {
    pub draft_tokens: HashMap<String, u32>,
    #[serde(rename = "maxLen", alias = "max_len")]
    pub max: u32,
    #[serde(flatten)]
    pub rest: Rest,
}

#[derive(Deserialize)]
struct HfConfig {
    hidden_size: u32,
}

fn decl(kind: ComponentKind, name: &str) -> ComponentDecl {
    ComponentDecl {
        kind,
        name: RString::from(name),
        caps: Capabilities::default(),
    }
}

pub fn manifest() -> PluginManifest {
    let engine = ComponentDecl {
        kind: ComponentKind::Engine,
        name: COMPONENT.into(),
    };
    sdk::manifest("fx", "0.1.0", vec![engine, decl(ComponentKind::Bridge, "fx-bridge")])
}

#[cfg(test)]
mod tests {
    const NOT: ComponentDecl = ComponentDecl { name: "test-only".into() };
}
"#;

/// Host source naming plugin names; only `fx-engine` and `draft-tokens` (lines 4 and 5) are
/// outside tests and equal to a name as a whole.
const TALK: &str = r#"//! The host talking about the plugin.

pub fn names() -> [&'static str; 5] {
    ["fx-engine",
     "draft-tokens",
     "draft_tokens", "hidden_size", "fx-engine is not the whole literal"]
}

#[cfg(test)]
mod tests {
    const IN_A_TEST: &str = "fx-bridge";
}
"#;

fn fixture() -> Fixture {
    let fixture = Fixture::new();
    fixture.write("plug/src/decl.rs", DECL);
    fixture.write("host/src/talk.rs", TALK);
    fixture.write(
        "host/src/talk_tests.rs",
        "//! Tests.\nconst A: &str = \"maxLen\";\n",
    );
    fixture.write("host/tests/more.rs", "const A: &str = \"fx\";\n");
    fixture
}

fn at(path: &str, line: usize) -> (&'static str, PathBuf, Option<usize>) {
    (
        Rule::HostNamesNoPlugin.name(),
        PathBuf::from(path),
        Some(line),
    )
}

#[test]
fn a_host_literal_naming_a_plugin_component_or_option_is_a_violation() {
    let fixture = fixture();
    let report = fixture.check();
    assert_eq!(
        found(&report),
        vec![at("host/src/talk.rs", 4), at("host/src/talk.rs", 5)],
        "{:#?}",
        report.violations
    );
    assert_eq!(
        report.figures.plugin_components, 3,
        "fx, fx-engine, fx-bridge"
    );
    assert_eq!(
        report.figures.plugin_option_keys, 3,
        "draft-tokens, maxLen, max_len"
    );
    let first = &report.violations[0].message;
    assert!(
        first.starts_with(
            "the host names \"fx-engine\", a plugin's component name (plug/src/decl.rs:"
        ),
        "{first}"
    );
    assert!(
        first.contains("ask the plugin through its capabilities"),
        "{first}"
    );
    let fix =
        format!("add the line `host/src/talk.rs \"fx-engine\"  # why` to {HOST_NAMES_ALLOWLIST}");
    assert!(first.contains(&fix), "{first}");
    assert!(
        report.violations[1]
            .message
            .contains("a plugin's option key")
    );
}

#[test]
fn listed_occurrences_pass_and_stale_lines_do_not() {
    let fixture = fixture();
    let list = "# Host literals equal to plugin names, each with its reason.\n\n\
                host/src/talk.rs \"fx-engine\"  # the fixture's own word\n\
                host/src/talk.rs \"draft-tokens\"  # the fixture's own word\n";
    fixture.write(HOST_NAMES_ALLOWLIST, list);
    let report = fixture.check();
    assert_eq!(found(&report), vec![], "{:#?}", report.violations);

    let stale = "host/src/lib.rs \"fx-engine\"  # not there\n\
                 host/src/talk.rs \"hidden_size\"  # no plugin name\n\
                 host/src/talk.rs \"fx-engine\"  # twice\n\
                 host/src/talk.rs \"fx\"\n\
                 host/src/talk.rs fx  # unquoted\n";
    fixture.write(HOST_NAMES_ALLOWLIST, &format!("{list}{stale}"));
    let report = fixture.check();
    let list_at = |line| at(HOST_NAMES_ALLOWLIST, line);
    assert_eq!(
        found(&report),
        vec![list_at(5), list_at(6), list_at(7), list_at(8), list_at(9)],
        "{:#?}",
        report.violations
    );
    let texts: Vec<&str> = report
        .violations
        .iter()
        .map(|v| v.message.as_str())
        .collect();
    assert!(
        texts[0].starts_with("stale: host/src/lib.rs holds no literal \"fx-engine\""),
        "{}",
        texts[0]
    );
    assert!(
        texts[1].starts_with("stale: \"hidden_size\" is no longer a plugin's"),
        "{}",
        texts[1]
    );
    assert!(
        texts[2].contains("the same file and literal as line 3"),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("say after `#` why"), "{}", texts[3]);
    assert!(
        texts[4].contains("put the literal in double quotes"),
        "{}",
        texts[4]
    );

    // A listed literal that leaves the file makes its line stale.
    fixture.edit("host/src/talk.rs", "[\"fx-engine\",", "[\"fx-engine2\",");
    fixture.write(HOST_NAMES_ALLOWLIST, list);
    assert_eq!(found(&fixture.check()), vec![list_at(3)]);
}

#[test]
fn a_component_name_tidy_cannot_read_is_a_violation() {
    let fixture = fixture();
    fixture.edit(
        "plug/src/decl.rs",
        "name: COMPONENT.into(),",
        "name: format!(\"fx-{}\", 1).into(),",
    );
    fixture.write(
        HOST_NAMES_ALLOWLIST,
        "host/src/talk.rs \"draft-tokens\"  # the fixture's own word\n",
    );
    let line = fixture.line_of("plug/src/decl.rs", "let engine = ComponentDecl");
    let report = fixture.check();
    assert_eq!(
        found(&report),
        vec![at("plug/src/decl.rs", line)],
        "{:#?}",
        report.violations
    );
    assert!(
        report.violations[0]
            .message
            .starts_with("tidy cannot read this component's name")
    );
    assert_eq!(report.figures.plugin_components, 2);
}
