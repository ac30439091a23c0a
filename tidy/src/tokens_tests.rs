//! Tests of the tokens and of leaving test code out.

use std::path::Path;

use super::{Tok, is_test_file, tokenize, without_tests};
use crate::lexer::scan;

fn words(src: &str) -> Vec<String> {
    let scanned = scan(src);
    without_tests(tokenize(&scanned))
        .into_iter()
        .map(|t| match t.tok {
            Tok::Ident(w) => w,
            Tok::Str(k) => format!("{:?}", scanned.strings[k].text),
            Tok::Punct(c) => c.to_string(),
        })
        .collect()
}

#[test]
fn literals_are_one_token_without_their_prefix() {
    assert_eq!(
        words("let a = r#\"x\"#; f(b\"y\", c)"),
        [
            "let", "a", "=", "\"x\"", ";", "f", "(", "\"y\"", ",", "c", ")"
        ]
    );
}

#[test]
fn lines_count_inside_literals() {
    let scanned = scan("a \"two\nlines\" b");
    let lines: Vec<usize> = tokenize(&scanned).iter().map(|t| t.line).collect();
    assert_eq!(lines, [1, 1, 2]);
}

#[test]
fn items_under_cfg_test_are_left_out() {
    let src = "a\n#[cfg(test)]\nmod tests {\n    fn f() { \"x\" }\n}\nb\n\
               #[cfg(test)]\n#[path = \"p_tests.rs\"]\nmod p;\nc\n\
               #[cfg(test)]\nfn g() -> u8 { 1 }\nd\n\
               struct S { #[cfg(test)] x: Vec<u8>, y: u8 }\n";
    assert_eq!(
        words(src),
        ["a", "b", "c", "d", "struct", "S", "{", "y", ":", "u8", "}"]
    );
    assert_eq!(words("#![cfg(test)]\nfn f() {}"), Vec::<String>::new());
    assert_eq!(words("#[cfg(not(test))]\nfn f() {}").len(), 16);
}

#[test]
fn test_files() {
    for path in ["src/tests.rs", "src/a/b_tests.rs", "src/a/tests/mod.rs"] {
        assert!(is_test_file(Path::new(path)), "{path}");
    }
    for path in ["src/lib.rs", "src/testsuite.rs", "src/contests.rs"] {
        assert!(!is_test_file(Path::new(path)), "{path}");
    }
}
