//! Tests of the calculator: exact values, precedence, the errors, and the work bounds.

#![allow(clippy::unwrap_used)]

use super::*;

fn ok(e: &str) -> String {
    calculate(e).unwrap()
}

#[test]
fn values_are_exact() {
    assert_eq!(ok("1 + 2 * 3"), "7");
    assert_eq!(ok("(1 + 2) * 3"), "9");
    assert_eq!(ok("0.1 + 0.2"), "0.3");
    assert_eq!(ok("1/3 * 3"), "1");
    assert_eq!(ok("1/3"), "1/3");
    assert_eq!(ok("-2/6"), "-1/3");
    assert_eq!(ok("1/8"), "0.125");
    assert_eq!(ok("-1/8"), "-0.125");
    assert_eq!(ok("7 / 2"), "3.5");
    assert_eq!(ok("2.50 * 4"), "10");
    assert_eq!(ok(".5 + 5."), "5.5");
    assert_eq!(ok("10 - 4 - 3"), "3");
    assert_eq!(ok("48 / 4 / 2"), "6");
    assert_eq!(ok("  12\t+ 30\n"), "42");
    assert_eq!(
        ok("170141183460469231731687303715884105727"),
        i128::MAX.to_string()
    );
}

#[test]
fn powers_and_signs() {
    assert_eq!(ok("2^10"), "1024");
    assert_eq!(ok("2**10"), "1024");
    assert_eq!(ok("2 ** 3 * 2"), "16");
    assert_eq!(ok("2^3^2"), "512");
    assert_eq!(ok("-2^2"), "-4");
    assert_eq!(ok("(-2)^2"), "4");
    assert_eq!(ok("(-2)^3"), "-8");
    assert_eq!(ok("2^-2"), "0.25");
    assert_eq!(ok("(2/3)^-2"), "2.25");
    assert_eq!(ok("3^0"), "1");
    assert_eq!(ok("--3"), "3");
    assert_eq!(ok("+3 - -3"), "6");
    assert_eq!(ok("2 * -3"), "-6");
    assert_eq!(ok("1^256"), "1");
    assert_eq!(ok("2^126"), (1i128 << 126).to_string());
    assert_eq!(ok("(-2)^127"), i128::MIN.to_string());
}

#[test]
fn errors_are_one_line_each() {
    let cases: &[(&str, ToolError)] = &[
        ("", ToolError::Empty),
        ("   ", ToolError::Empty),
        ("1/0", ToolError::DivisionByZero),
        ("1/(2-2)", ToolError::DivisionByZero),
        ("0^-1", ToolError::DivisionByZero),
        ("2^127", ToolError::Overflow),
        (
            "170141183460469231731687303715884105728",
            ToolError::Overflow,
        ),
        (
            "99999999999999999999 * 99999999999999999999",
            ToolError::Overflow,
        ),
        ("2 x 3", ToolError::UnknownToken { at: 2, found: 'x' }),
        ("1e5", ToolError::UnknownToken { at: 1, found: 'e' }),
        ("sqrt(2)", ToolError::UnknownToken { at: 0, found: 's' }),
        ("2 % 3", ToolError::UnknownToken { at: 2, found: '%' }),
        (
            "(1 + 2",
            ToolError::Syntax {
                at: 6,
                expected: "`)`",
                found: "end of input".to_owned(),
            },
        ),
        (
            "1 +",
            ToolError::Syntax {
                at: 3,
                expected: "a number or `(`",
                found: "end of input".to_owned(),
            },
        ),
        (
            "1.2.3",
            ToolError::Syntax {
                at: 0,
                expected: "a number with at most one `.`",
                found: "\"1.2.3\"".to_owned(),
            },
        ),
        (
            "(1))",
            ToolError::Syntax {
                at: 3,
                expected: "an operator or the end",
                found: "')'".to_owned(),
            },
        ),
        (
            "2^0.5",
            ToolError::NonIntegerExponent {
                exponent: "0.5".to_owned(),
            },
        ),
        (
            "1^257",
            ToolError::ExponentTooLarge {
                exponent: "257".to_owned(),
                max: MAX_EXPONENT,
            },
        ),
    ];
    for (expr, want) in cases {
        let got = calculate(expr).unwrap_err();
        assert_eq!(&got, want, "{expr:?}");
        let line = got.to_string();
        assert!(!line.is_empty() && !line.contains('\n'), "{expr:?}: {line}");
    }
}

#[test]
fn work_is_bounded() {
    let long = "1+".repeat(MAX_LEN / 2) + "1";
    assert_eq!(
        calculate(&long).unwrap_err(),
        ToolError::TooLong {
            len: long.len(),
            max: MAX_LEN
        }
    );
    // Exactly at the limit is still evaluated.
    let at_limit = "1+".repeat((MAX_LEN - 1) / 2) + "1";
    assert!(at_limit.len() <= MAX_LEN);
    assert_eq!(ok(&at_limit), ((MAX_LEN - 1) / 2 + 1).to_string());
    // Nesting beyond the limit is refused before the stack grows with it.
    let deep = "(".repeat(MAX_DEPTH + 1) + "1" + &")".repeat(MAX_DEPTH + 1);
    assert!(matches!(calculate(&deep), Err(ToolError::TooDeep { .. })));
    let signs = "-".repeat(MAX_DEPTH + 1) + "1";
    assert!(matches!(calculate(&signs), Err(ToolError::TooDeep { .. })));
    let nested = "(".repeat(MAX_DEPTH) + "1" + &")".repeat(MAX_DEPTH);
    assert_eq!(ok(&nested), "1");
    // A power tower is capped, not computed.
    assert!(matches!(
        calculate("9^9^9"),
        Err(ToolError::ExponentTooLarge { .. })
    ));
    assert_eq!(
        calculate("2^2^2^2^2"),
        Err(ToolError::ExponentTooLarge {
            exponent: "65536".to_owned(),
            max: MAX_EXPONENT,
        })
    );
}
