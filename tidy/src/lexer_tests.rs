//! Tests of the scanner on the constructs that trip a line-based search.

use super::{StrLit, scan};

fn lit(line: usize, text: &str) -> StrLit {
    StrLit {
        line,
        text: text.to_string(),
    }
}

#[test]
fn comments_are_not_code() {
    let s = scan("a // unsafe {\n/* unsafe fn /* nested */ still */ b\n/// unsafe impl\nc");
    assert_eq!(s.code, "a \n b\n\nc");
    assert!(s.strings.is_empty());
}

#[test]
fn strings_are_blanked_and_collected_with_their_lines() {
    let s = scan("let x = \"unsafe { \\\" }\";\nlet y = \"two\nlines\"; z");
    assert_eq!(s.code, "let x = \"\";\nlet y = \"\n\"; z");
    assert_eq!(
        s.strings,
        vec![lit(1, "unsafe { \\\" }"), lit(2, "two\nlines")]
    );
}

#[test]
fn raw_and_byte_strings() {
    let s = scan("r#\"a \"quoted\" b\"# br\"x\\\" c \"d\" for_r");
    assert_eq!(
        s.strings,
        vec![lit(1, "a \"quoted\" b"), lit(1, "x\\"), lit(1, "d")]
    );
    assert!(s.code.ends_with(" for_r"), "{}", s.code);
}

#[test]
fn char_literals_are_not_string_quotes() {
    let s = scan("let q = '\"'; let e = '\\''; let u = '\\u{22}'; fn f<'a>(x: &'a str) {}");
    assert!(s.strings.is_empty(), "{:?}", s.strings);
    assert!(s.code.contains("fn f<'a>(x: &'a str) {}"), "{}", s.code);
}

#[test]
fn comment_markers_inside_strings_are_text() {
    let s = scan("let u = \"http://x /* y\"; unsafe { }");
    assert_eq!(s.strings, vec![lit(1, "http://x /* y")]);
    assert!(s.code.contains("unsafe { }"));
}
