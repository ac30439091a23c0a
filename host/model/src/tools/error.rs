//! The errors of the tool layer: a family that cannot be named or detected, a call the
//! dispatcher cannot run, and the calculator's refusals. Each renders as one line that says
//! what went wrong, where, and how to fix it; the calculator's lines are also what the model
//! reads back as the tool's answer.

use thiserror::Error;

/// A tool-layer failure.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ToolError {
    /// A family name given by the user that no parser knows.
    #[error("unknown tool-call family {name:?}: use one of `hermes` (also `qwen`), `llama3`")]
    UnknownFamily {
        /// The name given.
        name: String,
    },
    /// A chat template in none of the supported tool-call formats.
    #[error(
        "the chat template has no supported tool-call format (neither `<tool_call>` as in \
         Qwen2.5/Hermes, nor `<|python_tag|>` / `\"parameters\"` with an `ipython` role as in \
         Llama 3.x): name the family explicitly (`hermes` or `llama3`) if the model writes one of \
         them anyway"
    )]
    NoFamily,
    /// A call to a tool that is not offered.
    #[error("unknown tool {name:?}: the tools offered are: {offered}")]
    UnknownTool {
        /// The name the model used.
        name: String,
        /// The tools offered, comma separated.
        offered: String,
    },
    /// An attempted call that does not parse (the parser's reason).
    #[error("malformed tool call: {reason}")]
    Malformed {
        /// Why it does not parse, one line.
        reason: String,
    },
    /// The python tool's run failed or was stopped (its exception, or the limit it hit).
    #[error("python: {reason}")]
    Sandbox {
        /// What happened, one line.
        reason: String,
    },
    /// A call whose arguments do not fit the tool.
    #[error("bad arguments for {tool}: {reason}")]
    BadArguments {
        /// The tool.
        tool: String,
        /// What is wrong, and the expected form.
        reason: String,
    },
    /// The calculator got nothing to evaluate.
    #[error("empty expression: give an arithmetic expression such as `2 * (3 + 4)`")]
    Empty,
    /// The expression is longer than the calculator accepts.
    #[error("expression too long: {len} bytes, at most {max}")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Parentheses nested deeper than the calculator accepts.
    #[error("expression nested too deeply at byte {at}: at most {max} levels of parentheses")]
    TooDeep {
        /// Byte offset of the parenthesis or sign over the limit.
        at: usize,
        /// The limit.
        max: usize,
    },
    /// A character that is not part of the calculator's language.
    #[error("unknown token {found:?} at byte {at}: use digits, `.`, `+ - * / ^`, and parentheses")]
    UnknownToken {
        /// Byte offset.
        at: usize,
        /// The character.
        found: char,
    },
    /// A token where the grammar expects something else.
    #[error("syntax error at byte {at}: expected {expected}, found {found}")]
    Syntax {
        /// Byte offset.
        at: usize,
        /// What the grammar expects there.
        expected: &'static str,
        /// What is there (`end of input` at the end).
        found: String,
    },
    /// A division (or a negative power) by zero.
    #[error("division by zero")]
    DivisionByZero,
    /// A result or an intermediate value beyond the exact range (about ±1.7e38).
    #[error("overflow: a value exceeds the calculator's exact range (about ±1.7e38)")]
    Overflow,
    /// An exponent that is not a whole number.
    #[error("non-integer exponent {exponent}: only whole-number powers are exact")]
    NonIntegerExponent {
        /// The exponent, as the calculator writes it.
        exponent: String,
    },
    /// An exponent beyond the cap that bounds the calculator's work.
    #[error("exponent {exponent} too large: at most {max} in absolute value")]
    ExponentTooLarge {
        /// The exponent.
        exponent: String,
        /// The cap.
        max: u32,
    },
}
