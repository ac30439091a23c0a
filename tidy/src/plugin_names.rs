//! The names the plugin-layer crates declare, read from their non-test source (for the rule
//! `host-names-no-plugin`):
//!
//! - **Component names**: the `name:` of every `ComponentDecl { … }` and the first argument of
//!   every `sdk::manifest(…)` (the plugin's name). Each is a string literal, a `const` of the
//!   crate (`const COMPONENT: &str = "…"`), or a parameter of the function building the decl
//!   (`fn bridge(name: &str, …) -> ComponentDecl`), whose calls in the crate are then read the
//!   same way. A name given any other way is a violation: tidy would miss it.
//! - **Option keys**: the fields of every struct deriving `Deserialize` with
//!   `#[serde(deny_unknown_fields)]` (the options structs; a `config.json` struct takes unknown
//!   fields), as serde reads them: `rename`, `alias` and the container's `rename_all`
//!   respected, `flatten` and `skip` fields left out.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::lexer::Scanned;
use crate::tokens::{Tok, Token, matching, split_commas};
use crate::{Rule, Violation};

/// What kind of name a plugin declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// A component's or plugin's name.
    Component,
    /// A key of an options struct.
    OptionKey,
}

/// Where a name is declared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Origin {
    /// The kind.
    pub kind: Kind,
    /// The file, relative to the root.
    pub path: PathBuf,
    /// The 1-based line.
    pub line: usize,
}

/// Every name → where it is declared.
pub type Names = BTreeMap<String, Vec<Origin>>;

/// One source file of a plugin crate, scanned, without its test code.
pub struct PluginFile<'a> {
    /// Relative to the root.
    pub path: &'a Path,
    /// The scan (for the literals' texts).
    pub scanned: &'a Scanned,
    /// The tokens, test code left out.
    pub tokens: &'a [Token],
}

/// A string-valued expression as far as tidy reads it.
enum Head {
    /// A string literal: its text.
    Lit(String),
    /// An identifier (the last segment of a path).
    Ident(String),
    /// Anything else.
    Unknown,
}

/// Adds the names one plugin crate declares (its files) to `names`; a component name tidy
/// cannot read is a violation in `out`.
pub fn crate_names(files: &[PluginFile<'_>], names: &mut Names, out: &mut Vec<Violation>) {
    let consts = consts(files);
    let add = |names: &mut Names, text: String, kind, path: &Path, line| {
        let origin = Origin {
            kind,
            path: path.to_path_buf(),
            line,
        };
        names.entry(text).or_default().push(origin);
    };
    // Helpers building a decl from a parameter: (function, parameter index).
    let mut helpers: Vec<(String, usize)> = Vec::new();
    for file in files {
        let toks = file.tokens;
        for i in 0..toks.len() {
            // A struct literal, not a return type (`-> ComponentDecl {`) or an `impl … for`.
            let literal = i == 0
                || !(toks[i - 1].punct('>') || toks[i - 1].is("for") || toks[i - 1].is("impl"));
            let is_decl = literal
                && toks[i].is("ComponentDecl")
                && toks.get(i + 1).is_some_and(|t| t.punct('{'));
            let is_manifest = toks[i].is("manifest")
                && i >= 3
                && toks[i - 1].punct(':')
                && toks[i - 3].is("sdk")
                && toks.get(i + 1).is_some_and(|t| t.punct('('));
            let expr = if is_decl {
                decl_name(toks, i + 1)
            } else if is_manifest {
                argument(toks, i + 1, 0)
            } else {
                continue;
            };
            let line = toks[i].line;
            let Some(expr) = expr else {
                out.push(unreadable(
                    file.path,
                    line,
                    "it has no `name:` tidy can find",
                ));
                continue;
            };
            let head = head(expr, file.scanned);
            let helper = match &head {
                Head::Ident(name) if !consts.contains_key(name) => parameter(toks, i, name),
                _ => None,
            };
            match (resolve(head, &consts), helper) {
                (Some(text), _) => add(names, text, Kind::Component, file.path, line),
                (None, Some(helper)) => helpers.push(helper),
                (None, None) => {
                    out.push(unreadable(file.path, line, "its name is an expression"));
                }
            }
        }
        for (key, line) in option_keys(file) {
            add(names, key, Kind::OptionKey, file.path, line);
        }
    }
    for (helper, index) in helpers {
        for file in files {
            let toks = file.tokens;
            for i in 0..toks.len() {
                let call = toks[i].is(&helper)
                    && toks.get(i + 1).is_some_and(|t| t.punct('('))
                    && !(i > 0 && toks[i - 1].is("fn"));
                if !call {
                    continue;
                }
                let line = toks[i].line;
                let text = argument(toks, i + 1, index)
                    .and_then(|a| resolve(head(a, file.scanned), &consts));
                match text {
                    Some(text) => add(names, text, Kind::Component, file.path, line),
                    None => out.push(unreadable(
                        file.path,
                        line,
                        &format!("argument {} of `{helper}` is an expression", index + 1),
                    )),
                }
            }
        }
    }
}

fn unreadable(path: &Path, line: usize, why: &str) -> Violation {
    Violation {
        rule: Rule::HostNamesNoPlugin,
        path: path.to_path_buf(),
        line: Some(line),
        message: format!(
            "tidy cannot read this component's name ({why}): give it as a string literal, a \
             `const NAME: &str` of this crate, or a parameter of a function whose calls pass \
             one, so the rule `host-names-no-plugin` knows it"
        ),
    }
}

/// The `const`/`static` string items of the crate: name → text.
fn consts(files: &[PluginFile<'_>]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for file in files {
        let toks = file.tokens;
        for i in 0..toks.len() {
            if !(toks[i].is("const") || toks[i].is("static")) {
                continue;
            }
            let Some(name) = toks
                .get(i + 1)
                .and_then(Token::ident)
                .filter(|n| *n != "fn")
            else {
                continue;
            };
            let Some(eq) = toks[i..].iter().take(8).position(|t| t.punct('=')) else {
                continue;
            };
            if let Some(Tok::Str(k)) = toks.get(i + eq + 1).map(|t| &t.tok) {
                out.insert(name.to_string(), file.scanned.strings[*k].text.clone());
            }
        }
    }
    out
}

/// The tokens of the `name:` field of the struct literal whose `{` is at `open`.
fn decl_name(toks: &[Token], open: usize) -> Option<&[Token]> {
    let close = matching(toks, open)?;
    let fields = split_commas(&toks[open + 1..close], false);
    fields.into_iter().find_map(|f| {
        let named = f.first()?.is("name") && f.get(1)?.punct(':') && !f.get(2)?.punct(':');
        named.then(|| &f[2..])
    })
}

/// The tokens of argument `index` of the call whose `(` is at `open`.
fn argument(toks: &[Token], open: usize, index: usize) -> Option<&[Token]> {
    let close = matching(toks, open)?;
    split_commas(&toks[open + 1..close], false)
        .get(index)
        .copied()
}

/// What an expression is: a literal, a path's last identifier (through `X.into()`,
/// `RString::from(X)`, `&X`, ...), or something else.
fn head(expr: &[Token], strings: &Scanned) -> Head {
    let expr = match expr.first() {
        Some(t) if t.punct('&') => &expr[1..],
        _ => expr,
    };
    let Some(first) = expr.first() else {
        return Head::Unknown;
    };
    let mut i = 0;
    let tail = |i: usize| {
        let rest = &expr[i..];
        let call = |t: &Token| t.ident().is_some() || t.punct('.') || t.punct('(') || t.punct(')');
        rest.is_empty() || (rest[0].punct('.') && rest.iter().all(call))
    };
    if let Tok::Str(k) = first.tok {
        return if tail(1) {
            Head::Lit(strings.strings[k].text.clone())
        } else {
            Head::Unknown
        };
    }
    let mut last = None;
    while let Some(word) = expr.get(i).and_then(Token::ident) {
        last = Some(word);
        i += 1;
        if expr.get(i).is_some_and(|t| t.punct(':'))
            && expr.get(i + 1).is_some_and(|t| t.punct(':'))
        {
            i += 2;
        } else {
            break;
        }
    }
    match (last, expr.get(i)) {
        (Some("from" | "new"), Some(t)) if t.punct('(') => match matching(expr, i) {
            Some(close) if close + 1 == expr.len() => head(&expr[i + 1..close], strings),
            _ => Head::Unknown,
        },
        (Some(word), _) if tail(i) => Head::Ident(word.to_string()),
        _ => Head::Unknown,
    }
}

/// The text of an expression that is a literal or a `const` of the crate.
fn resolve(head: Head, consts: &BTreeMap<String, String>) -> Option<String> {
    match head {
        Head::Lit(text) => Some(text),
        Head::Ident(name) => consts.get(&name).cloned(),
        Head::Unknown => None,
    }
}

/// When `name` (used at token `at`) is a parameter of the innermost function around it: that
/// function and the parameter's index.
fn parameter(toks: &[Token], at: usize, name: &str) -> Option<(String, usize)> {
    let mut best = None;
    for i in (0..at).filter(|&i| toks[i].is("fn")) {
        let Some(fname) = toks.get(i + 1).and_then(Token::ident) else {
            continue;
        };
        let Some(open) = toks[i..at].iter().position(|t| t.punct('(')).map(|p| p + i) else {
            continue;
        };
        let Some(close) = matching(toks, open).filter(|&c| c < at) else {
            continue;
        };
        let body = toks[close..at]
            .iter()
            .position(|t| t.punct('{') || t.punct(';'));
        let encloses = body.is_some_and(|b| {
            toks[close + b].punct('{') && matching(toks, close + b).is_some_and(|end| end > at)
        });
        let index = split_commas(&toks[open + 1..close], true)
            .iter()
            .position(|p| {
                let colon = p.iter().position(|t| t.punct(':'));
                colon.is_some_and(|c| c > 0 && p[c - 1].is(name))
            });
        if let (true, Some(index)) = (encloses, index) {
            best = Some((fname.to_string(), index));
        }
    }
    best
}

/// The option keys (and their lines) of the `deny_unknown_fields` structs deriving
/// `Deserialize` in `file`.
fn option_keys(file: &PluginFile<'_>) -> Vec<(String, usize)> {
    let mut keys = Vec::new();
    let toks = file.tokens;
    let text = |t: &Token| match t.tok {
        Tok::Str(k) => Some(file.scanned.strings[k].text.as_str()),
        _ => None,
    };
    let mut i = 0;
    while i < toks.len() {
        let (attrs, next) = attributes(toks, i);
        if attrs.is_empty() {
            i += 1;
            continue;
        }
        i = next;
        let mut j = next;
        if toks.get(j).is_some_and(|t| t.is("pub")) {
            j += 1;
            if toks.get(j).is_some_and(|t| t.punct('(')) {
                j = matching(toks, j).map_or(toks.len(), |c| c + 1);
            }
        }
        let derives = attrs.iter().any(|a| {
            a.first().is_some_and(|t| t.is("derive")) && a.iter().any(|t| t.is("Deserialize"))
        });
        let serde = serde_args(&attrs);
        let denies = serde
            .iter()
            .any(|a| a.len() == 1 && a[0].is("deny_unknown_fields"));
        let is_struct = toks.get(j).is_some_and(|t| t.is("struct"));
        if !(derives && denies && is_struct) {
            continue;
        }
        let rename_all = serde
            .iter()
            .find_map(|a| value(a, "rename_all"))
            .and_then(text);
        let Some(open) = toks[j..]
            .iter()
            .position(|t| t.punct('{') || t.punct('(') || t.punct(';'))
            .map(|p| p + j)
        else {
            continue;
        };
        let Some(close) = toks[open]
            .punct('{')
            .then(|| matching(toks, open))
            .flatten()
        else {
            continue;
        };
        for field in split_commas(&toks[open + 1..close], true) {
            let (attrs, start) = attributes(field, 0);
            let serde = serde_args(&attrs);
            let skipped = serde.iter().any(|a| {
                a.len() == 1
                    && (a[0].is("flatten") || a[0].is("skip") || a[0].is("skip_deserializing"))
            });
            let Some(colon) = field[start..].iter().position(|t| t.punct(':')) else {
                continue;
            };
            let Some(ident) = (start + colon)
                .checked_sub(1)
                .and_then(|c| field[c].ident())
            else {
                continue;
            };
            if skipped {
                continue;
            }
            let line = field[start + colon - 1].line;
            let key = match serde.iter().find_map(|a| value(a, "rename")).and_then(text) {
                Some(renamed) => renamed.to_string(),
                None => renamed_all(ident, rename_all),
            };
            keys.push((key, line));
            for alias in serde
                .iter()
                .filter_map(|a| value(a, "alias"))
                .filter_map(text)
            {
                keys.push((alias.to_string(), line));
            }
        }
    }
    keys
}

/// The attributes `#[…]` starting at `i` (each as the tokens inside its brackets) and the
/// index after them.
fn attributes(toks: &[Token], mut i: usize) -> (Vec<&[Token]>, usize) {
    let mut attrs = Vec::new();
    while toks.get(i).is_some_and(|t| t.punct('#')) && toks.get(i + 1).is_some_and(|t| t.punct('['))
    {
        let Some(close) = matching(toks, i + 1) else {
            break;
        };
        attrs.push(&toks[i + 2..close]);
        i = close + 1;
    }
    (attrs, i)
}

/// The arguments of every `serde(…)` attribute among `attrs`.
fn serde_args<'a>(attrs: &[&'a [Token]]) -> Vec<&'a [Token]> {
    let mut out = Vec::new();
    for attr in attrs {
        let serde = attr.first().is_some_and(|t| t.is("serde"))
            && attr.get(1).is_some_and(|t| t.punct('('));
        if let Some(close) = serde.then(|| matching(attr, 1)).flatten() {
            out.extend(split_commas(&attr[2..close], false));
        }
    }
    out
}

/// The literal of `key = "…"` when `arg` is that.
fn value<'a>(arg: &'a [Token], key: &str) -> Option<&'a Token> {
    let fits = arg.len() == 3 && arg[0].is(key) && arg[1].punct('=');
    fits.then(|| &arg[2])
}

/// A snake_case field name under serde's `rename_all` rule.
fn renamed_all(field: &str, rule: Option<&str>) -> String {
    let words: Vec<&str> = field.split('_').collect();
    let capitalised = || {
        words.iter().map(|w| {
            let mut c = w.chars();
            c.next()
                .map_or(String::new(), |f| f.to_uppercase().chain(c).collect())
        })
    };
    match rule {
        Some("UPPERCASE" | "SCREAMING_SNAKE_CASE") => field.to_uppercase(),
        Some("kebab-case") => field.replace('_', "-"),
        Some("SCREAMING-KEBAB-CASE") => field.to_uppercase().replace('_', "-"),
        Some("PascalCase") => capitalised().collect(),
        Some("camelCase") => {
            let pascal: String = capitalised().collect();
            let mut c = pascal.chars();
            c.next()
                .map_or(String::new(), |f| f.to_lowercase().chain(c).collect())
        }
        _ => field.to_string(),
    }
}
