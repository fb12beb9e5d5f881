//! The lexer: splits the text form into tokens that carry their line and column.

use crate::text::ParseError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// `%name`, without the `%`.
    Value(String),
    /// A word: mnemonic, keyword, dtype, `true`, `B`.
    Ident(String),
    /// A number exactly as written; its parser decides between integer and float.
    Number(String),
    /// A string literal, escapes decoded.
    Str(String),
    Colon,
    Eq,
    Comma,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    At,
    Newline,
    Eof,
}

impl Tok {
    /// How the token reads in an error message.
    pub(crate) fn describe(&self) -> String {
        match self {
            Tok::Value(v) => format!("`%{v}`"),
            Tok::Ident(s) | Tok::Number(s) => format!("`{s}`"),
            Tok::Str(s) => format!("string {s:?}"),
            Tok::Colon => "`:`".into(),
            Tok::Eq => "`=`".into(),
            Tok::Comma => "`,`".into(),
            Tok::LBracket => "`[`".into(),
            Tok::RBracket => "`]`".into(),
            Tok::LBrace => "`{`".into(),
            Tok::RBrace => "`}`".into(),
            Tok::At => "`@`".into(),
            Tok::Newline => "end of line".into(),
            Tok::Eof => "end of input".into(),
        }
    }
}

/// A 1-based source position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pos {
    pub(crate) line: usize,
    pub(crate) column: usize,
}

impl Pos {
    pub(crate) fn error(self, message: impl Into<String>) -> ParseError {
        ParseError {
            line: self.line,
            column: self.column,
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) pos: Pos,
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Characters a number may contain after its first: digits, exponent, sign, `inf`, `NaN`.
fn is_number(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_')
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
    column: usize,
}

impl Lexer<'_> {
    fn pos(&self) -> Pos {
        Pos {
            line: self.line,
            column: self.column,
        }
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next()?;
        if c == '\n' {
            self.line += 1;
            self.column = 1;
        } else {
            self.column += 1;
        }
        Some(c)
    }

    fn take_while(&mut self, first: String, keep: impl Fn(char) -> bool) -> String {
        let mut s = first;
        while let Some(&c) = self.chars.peek() {
            if !keep(c) {
                break;
            }
            s.push(c);
            self.bump();
        }
        s
    }

    fn string(&mut self, start: Pos) -> Result<String, ParseError> {
        let mut s = String::new();
        loop {
            let here = self.pos();
            match self.bump() {
                None | Some('\n') => return Err(start.error("unterminated string")),
                Some('"') => return Ok(s),
                Some('\\') => s.push(self.escape(here)?),
                Some(c) => s.push(c),
            }
        }
    }

    fn escape(&mut self, at: Pos) -> Result<char, ParseError> {
        match self.bump() {
            Some('"') => Ok('"'),
            Some('\\') => Ok('\\'),
            Some('n') => Ok('\n'),
            Some('t') => Ok('\t'),
            Some('r') => Ok('\r'),
            Some('u') => {
                if self.bump() != Some('{') {
                    return Err(at.error("expected `{` after `\\u`"));
                }
                let hex = self.take_while(String::new(), |c| c.is_ascii_hexdigit());
                if self.bump() != Some('}') {
                    return Err(at.error("expected `}` to close `\\u{`"));
                }
                u32::from_str_radix(&hex, 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| at.error(format!("invalid character code \\u{{{hex}}}")))
            }
            Some(c) => Err(at.error(format!("unknown escape `\\{c}`"))),
            None => Err(at.error("unterminated string")),
        }
    }
}

/// Splits `src` into tokens; the last one is always [`Tok::Eof`].
pub(crate) fn lex(src: &str) -> Result<Vec<Token>, ParseError> {
    let mut lx = Lexer {
        chars: src.chars().peekable(),
        line: 1,
        column: 1,
    };
    let mut out = Vec::new();
    loop {
        let pos = lx.pos();
        let Some(c) = lx.bump() else {
            out.push(Token { tok: Tok::Eof, pos });
            return Ok(out);
        };
        let tok = match c {
            '\n' => Tok::Newline,
            c if c.is_whitespace() => continue,
            ';' | '#' => {
                lx.take_while(String::new(), |c| c != '\n');
                continue;
            }
            ':' => Tok::Colon,
            '=' => Tok::Eq,
            ',' => Tok::Comma,
            '[' => Tok::LBracket,
            ']' => Tok::RBracket,
            '{' => Tok::LBrace,
            '}' => Tok::RBrace,
            '@' => Tok::At,
            '"' => Tok::Str(lx.string(pos)?),
            '%' => {
                let name = lx.take_while(String::new(), |c| is_word(c) || c == '.');
                if name.is_empty() {
                    return Err(pos.error("expected a value name after `%`"));
                }
                Tok::Value(name)
            }
            c if c.is_ascii_digit() || c == '-' || c == '+' => {
                Tok::Number(lx.take_while(c.to_string(), is_number))
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                Tok::Ident(lx.take_while(c.to_string(), is_word))
            }
            c => return Err(pos.error(format!("unexpected character {c:?}"))),
        };
        out.push(Token { tok, pos });
    }
}
