//! The text form of a graph: readable, and exact enough that print → parse → print is
//! byte-identical (tests are `.ir` files).
//!
//! # Example
//!
//! ```text
//! graph "tiny"
//! block "decoder_layer"
//!
//! %0: f32[B,S,64] = input "x"
//! %1: f32[64,64] = param "h0.w" @0
//! %2: f32[B,S,64] = linear{bias=false} %0, %1 @0
//! %3: f32[B,S,32], %4: f32[B,S,32] = split{axis=2, sizes=[32,32]} %2
//! %5: f32[B,S,64], %6: f32[64] = grad{of=layernorm{eps=1e-5}, wrt=[0,1]} %0, %7, %8, %2
//!
//! output "y" = %2   ; comments run from `;` or `#` to the end of the line
//! ```
//!
//! # Grammar
//!
//! Statements are one per line; blank lines and comments (`;` or `#` to end of line) are
//! ignored anywhere.
//!
//! ```text
//! file      := "graph" STRING NL  { stmt NL }
//! stmt      := "block" STRING                  ; the repeated block's name (at most once)
//!            | "output" STRING "=" VALUE       ; a named graph output
//!            | results "=" kind [operands] ["@" INT]
//! results   := VALUE ":" type { "," VALUE ":" type }
//!            | "_"                             ; an op with no results
//! operands  := VALUE { "," VALUE }
//! type      := DTYPE "[" [dim { "," dim }] "]"   ; f32 bf16 f16 fp8 f64 i64; `[]` is a scalar
//! dim       := INT | "B" | "S"                 ; fixed size, or batch / sequence symbol
//! kind      := MNEMONIC [STRING] ["{" [attr { "," attr }] "}"]
//! attr      := KEY "=" (bool | number | dim | "[" items "]" | kind)
//! VALUE     := "%" [A-Za-z0-9_.]+
//! STRING    := '"' chars '"'                   ; escapes \" \\ \n \t \r \u{hex}
//! ```
//!
//! - `MNEMONIC` is [`crate::OpKind::mnemonic`]. Named sources (`input`, `param`, `buffer`,
//!   `state`) take their name as the STRING; other kinds take none.
//! - Every attribute of the kind must be given exactly once, in any order; the printer writes
//!   them in the order of the `OpKind` variant's fields. Floats print with Rust's `{:?}` (the
//!   shortest text that reads back to the same `f64`, including `inf` and `NaN`); `grad` takes
//!   the differentiated op's kind as `of=kind`.
//! - `@N` tags the op with repeated layer `N` ([`crate::graph::OpData::layer`]).
//! - Lines are the execution order. Values are numbered in definition order when printed; the
//!   parser accepts any names, resolved after the whole file is read, so an operand may name a
//!   value defined later (the verifier reports it). A name defined nowhere or twice is a
//!   [`ParseError`].

mod kind;
mod lex;
pub(crate) mod names;
mod parse;
mod print;

pub use parse::parse;
pub use print::print;

pub(crate) use kind::KindText;

/// Why text did not parse, and where (1-based line and column, in characters).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{line}:{column}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[cfg(test)]
mod tests;
