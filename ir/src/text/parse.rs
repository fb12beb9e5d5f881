//! The parser: tokens to statements, then names resolved to ids and the graph built.
//!
//! Names resolve after the whole file is read, so an operand may name a value defined on a
//! later line; the graph is built anyway and [`crate::verify`] reports the use before its
//! definition. A name defined nowhere, or defined twice, is a parse error.

use std::collections::HashMap;

use crate::graph::{Graph, ValueId};
use crate::op::OpKind;
use crate::text::ParseError;
use crate::text::kind::{AttrTy, AttrVal, Attrs, attr_type, build_kind, is_named_source};
use crate::text::lex::{Pos, Tok, Token, lex};
use crate::types::{DType, Dim, Shape, Sym, TensorType};

/// Deepest `grad{of=grad{of=...}}` nesting accepted, so hostile input cannot exhaust the stack.
const MAX_KIND_DEPTH: usize = 8;

static EOF: Token = Token {
    tok: Tok::Eof,
    pos: Pos { line: 1, column: 1 },
};

/// Parses the text form described in [`crate::text`] into a graph.
///
/// The graph is not verified; call [`crate::verify::verify`] on it.
pub fn parse(src: &str) -> Result<Graph, ParseError> {
    let tokens = lex(src)?;
    let file = Parser { tokens, at: 0 }.file()?;
    file.build()
}

/// A name as written, with where it was written.
#[derive(Debug)]
struct Name {
    text: String,
    pos: Pos,
}

#[derive(Debug)]
struct OpStmt {
    results: Vec<(Name, TensorType)>,
    kind: OpKind,
    operands: Vec<Name>,
    layer: Option<u32>,
}

#[derive(Debug)]
struct File {
    name: String,
    block: Option<String>,
    kind_starts: Vec<u32>,
    ops: Vec<OpStmt>,
    outputs: Vec<(String, Name)>,
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        // `lex` always ends with Eof and `next` never moves past it; the fallback is for safety.
        self.tokens.get(self.at).unwrap_or(&EOF)
    }

    fn next(&mut self) -> Token {
        let t = self.peek().clone();
        if t.tok != Tok::Eof {
            self.at += 1;
        }
        t
    }

    fn unexpected(&self, wanted: &str) -> ParseError {
        let t = self.peek();
        t.pos
            .error(format!("expected {wanted}, found {}", t.tok.describe()))
    }

    fn expect(&mut self, tok: Tok, wanted: &str) -> Result<Pos, ParseError> {
        if self.peek().tok == tok {
            Ok(self.next().pos)
        } else {
            Err(self.unexpected(wanted))
        }
    }

    fn eat(&mut self, tok: &Tok) -> bool {
        if self.peek().tok == *tok {
            self.next();
            true
        } else {
            false
        }
    }

    fn string(&mut self, wanted: &str) -> Result<String, ParseError> {
        match self.peek().tok.clone() {
            Tok::Str(s) => {
                self.next();
                Ok(s)
            }
            _ => Err(self.unexpected(wanted)),
        }
    }

    fn value_name(&mut self) -> Result<Name, ParseError> {
        match self.peek().tok.clone() {
            Tok::Value(text) => Ok(Name {
                text,
                pos: self.next().pos,
            }),
            _ => Err(self.unexpected("a value `%name`")),
        }
    }

    fn end_of_statement(&mut self) -> Result<(), ParseError> {
        match self.peek().tok {
            Tok::Newline => {
                self.next();
                Ok(())
            }
            Tok::Eof => Ok(()),
            _ => Err(self.unexpected("end of line")),
        }
    }

    fn skip_newlines(&mut self) {
        while self.eat(&Tok::Newline) {}
    }

    fn file(mut self) -> Result<File, ParseError> {
        self.skip_newlines();
        if self.peek().tok != Tok::Ident("graph".into()) {
            return Err(self.unexpected("`graph \"name\"`"));
        }
        self.next();
        let name = self.string("the graph name as a quoted string")?;
        self.end_of_statement()?;
        let mut file = File {
            name,
            block: None,
            kind_starts: Vec::new(),
            ops: Vec::new(),
            outputs: Vec::new(),
        };
        loop {
            self.skip_newlines();
            let t = self.peek().clone();
            match &t.tok {
                Tok::Eof => return Ok(file),
                Tok::Ident(w) if w == "block" => {
                    self.next();
                    if file.block.is_some() {
                        return Err(t.pos.error("the block name is given twice"));
                    }
                    file.block = Some(self.string("the block name as a quoted string")?);
                    if self.eat(&Tok::Ident("kind_starts".into())) {
                        while let Tok::Number(_) = self.peek().tok {
                            let (n, pos) = self.integer("a layer number")?;
                            let n = u32::try_from(n)
                                .map_err(|_| pos.error(format!("layer {n} is too large")))?;
                            file.kind_starts.push(n);
                        }
                    }
                }
                Tok::Ident(w) if w == "output" => {
                    self.next();
                    let name = self.string("the output name as a quoted string")?;
                    self.expect(Tok::Eq, "`=`")?;
                    file.outputs.push((name, self.value_name()?));
                }
                Tok::Value(_) => file.ops.push(self.op_stmt()?),
                Tok::Ident(w) if w == "_" => file.ops.push(self.op_stmt()?),
                _ => {
                    return Err(
                        self.unexpected("`block`, `output`, or an op line `%name: type = ...`")
                    );
                }
            }
            self.end_of_statement()?;
        }
    }

    fn op_stmt(&mut self) -> Result<OpStmt, ParseError> {
        let mut results = Vec::new();
        if !self.eat(&Tok::Ident("_".into())) {
            loop {
                let name = self.value_name()?;
                self.expect(Tok::Colon, "`:` and the value's type")?;
                results.push((name, self.tensor_type()?));
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        self.expect(Tok::Eq, "`=`")?;
        let kind = self.kind(0)?;
        let mut operands = Vec::new();
        if matches!(self.peek().tok, Tok::Value(_)) {
            loop {
                operands.push(self.value_name()?);
                if !self.eat(&Tok::Comma) {
                    break;
                }
            }
        }
        let layer = if self.eat(&Tok::At) {
            let (n, pos) = self.integer("a layer number after `@`")?;
            Some(u32::try_from(n).map_err(|_| pos.error(format!("layer {n} is too large")))?)
        } else {
            None
        };
        Ok(OpStmt {
            results,
            kind,
            operands,
            layer,
        })
    }

    fn tensor_type(&mut self) -> Result<TensorType, ParseError> {
        let t = self.next();
        let dtype = match &t.tok {
            Tok::Ident(s) => DType::from_name(s),
            _ => None,
        }
        .ok_or_else(|| {
            t.pos.error(format!(
                "expected an element type (f32, bf16, f16, fp8, f64, i64), found {}",
                t.tok.describe()
            ))
        })?;
        let dims = self.list(Self::dim)?;
        Ok(TensorType::new(dtype, Shape(dims)))
    }

    fn dim(&mut self) -> Result<Dim, ParseError> {
        match self.peek().tok.clone() {
            Tok::Ident(s) if s == "B" => {
                self.next();
                Ok(Dim::Sym(Sym::Batch))
            }
            Tok::Ident(s) if s == "S" => {
                self.next();
                Ok(Dim::Sym(Sym::Seq))
            }
            _ => Ok(Dim::Fixed(
                self.integer("a dimension (a number, `B` or `S`)")?.0,
            )),
        }
    }

    fn integer(&mut self, wanted: &str) -> Result<(u64, Pos), ParseError> {
        match self.peek().tok.clone() {
            Tok::Number(s) => {
                let pos = self.next().pos;
                let n = s
                    .parse::<u64>()
                    .map_err(|_| pos.error(format!("expected {wanted}, found `{s}`")))?;
                Ok((n, pos))
            }
            _ => Err(self.unexpected(wanted)),
        }
    }

    fn float(&mut self) -> Result<f64, ParseError> {
        match self.peek().tok.clone() {
            // `inf` and `NaN` lex as words; Rust's f64 parser reads them as printed by `{:?}`.
            Tok::Number(s) | Tok::Ident(s) => {
                let pos = self.next().pos;
                s.parse::<f64>()
                    .map_err(|_| pos.error(format!("expected a number, found `{s}`")))
            }
            _ => Err(self.unexpected("a number")),
        }
    }

    fn boolean(&mut self) -> Result<bool, ParseError> {
        let t = self.next();
        match &t.tok {
            Tok::Ident(s) if s == "true" => Ok(true),
            Tok::Ident(s) if s == "false" => Ok(false),
            other => Err(t.pos.error(format!(
                "expected true or false, found {}",
                other.describe()
            ))),
        }
    }

    /// `[item, item, ...]`, possibly empty.
    fn list<T>(
        &mut self,
        item: fn(&mut Self) -> Result<T, ParseError>,
    ) -> Result<Vec<T>, ParseError> {
        self.expect(Tok::LBracket, "`[`")?;
        let mut out = Vec::new();
        if self.eat(&Tok::RBracket) {
            return Ok(out);
        }
        loop {
            out.push(item(self)?);
            if self.eat(&Tok::RBracket) {
                return Ok(out);
            }
            self.expect(Tok::Comma, "`,` or `]`")?;
        }
    }

    /// `mnemonic ["name"] [{key=value, ...}]`.
    fn kind(&mut self, depth: usize) -> Result<OpKind, ParseError> {
        let t = self.next();
        let Tok::Ident(mnemonic) = &t.tok else {
            return Err(t
                .pos
                .error(format!("expected an op name, found {}", t.tok.describe())));
        };
        if depth > MAX_KIND_DEPTH {
            return Err(t.pos.error("op kinds are nested too deeply"));
        }
        let name = match self.peek().tok.clone() {
            Tok::Str(s) if is_named_source(mnemonic) => {
                self.next();
                Some(s)
            }
            _ => None,
        };
        let mut items: Vec<(String, AttrVal)> = Vec::new();
        if self.eat(&Tok::LBrace) && !self.eat(&Tok::RBrace) {
            loop {
                let kt = self.next();
                let Tok::Ident(key) = kt.tok else {
                    return Err(kt.pos.error(format!(
                        "expected an attribute name, found {}",
                        kt.tok.describe()
                    )));
                };
                let ty = attr_type(&key)
                    .ok_or_else(|| kt.pos.error(format!("unknown attribute `{key}`")))?;
                if items.iter().any(|(k, _)| *k == key) {
                    return Err(kt.pos.error(format!("attribute `{key}` is given twice")));
                }
                self.expect(Tok::Eq, "`=`")?;
                let val = self.attr_value(ty, depth)?;
                items.push((key, val));
                if self.eat(&Tok::RBrace) {
                    break;
                }
                self.expect(Tok::Comma, "`,` or `}`")?;
            }
        }
        build_kind(mnemonic, name, Attrs::new(items)).map_err(|m| t.pos.error(m))
    }

    fn attr_value(&mut self, ty: AttrTy, depth: usize) -> Result<AttrVal, ParseError> {
        Ok(match ty {
            AttrTy::Bool => AttrVal::Bool(self.boolean()?),
            AttrTy::Float => AttrVal::Float(self.float()?),
            AttrTy::Int => AttrVal::Int(self.integer("an integer")?.0),
            AttrTy::Dim => AttrVal::Dim(self.dim()?),
            AttrTy::Dims => AttrVal::Dims(self.list(Self::dim)?),
            AttrTy::Ints => AttrVal::Ints(self.list(|p| Ok(p.integer("an integer")?.0))?),
            AttrTy::Kind => AttrVal::Kind(Box::new(self.kind(depth + 1)?)),
        })
    }
}

impl File {
    /// Resolves names and builds the graph; values get ids in definition order.
    fn build(self) -> Result<Graph, ParseError> {
        let mut ids: HashMap<&str, ValueId> = HashMap::new();
        let mut next = 0u32;
        for op in &self.ops {
            for (name, _) in &op.results {
                if ids.contains_key(name.text.as_str()) {
                    return Err(name
                        .pos
                        .error(format!("value %{} is defined twice", name.text)));
                }
                ids.insert(&name.text, ValueId(next));
                next = next
                    .checked_add(1)
                    .ok_or_else(|| name.pos.error("too many values"))?;
            }
        }
        let resolve = |name: &Name| {
            ids.get(name.text.as_str())
                .copied()
                .ok_or_else(|| name.pos.error(format!("undefined value %{}", name.text)))
        };
        let mut graph = Graph::new(self.name.clone());
        graph.block_name = self.block.clone();
        graph.kind_starts = self.kind_starts.clone();
        for op in &self.ops {
            let inputs = op.operands.iter().map(resolve).collect::<Result<_, _>>()?;
            let types = op.results.iter().map(|(_, t)| t.clone()).collect();
            graph.push_op_typed(op.kind.clone(), inputs, types, op.layer);
        }
        for (name, value) in &self.outputs {
            graph.add_output(name.clone(), resolve(value)?);
        }
        Ok(graph)
    }
}
