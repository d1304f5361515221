//! The drivers' lines: one flat JSON object each (strings, numbers, `null`, booleans), read
//! without a JSON crate (the workspace has none).

use std::collections::HashMap;

#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Str(String),
    /// A number, as written (tokens are integers beyond what every reader keeps exact).
    Num(String),
    Bool(bool),
    Null,
}

impl Json {
    pub fn str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn int(&self) -> Option<i64> {
        match self {
            Json::Num(n) => n.parse().ok().or_else(|| {
                // 123.0 from a float-minded writer.
                n.parse::<f64>()
                    .ok()
                    .filter(|f| f.fract() == 0.0)
                    .map(|f| f as i64)
            }),
            _ => None,
        }
    }

    pub fn float(&self) -> Option<f64> {
        match self {
            Json::Num(n) => n.parse().ok(),
            _ => None,
        }
    }
}

/// One line: a flat object.
pub fn parse_object(line: &str) -> Result<HashMap<String, Json>, String> {
    let mut p = Parser {
        bytes: line.as_bytes(),
        at: 0,
    };
    let mut out = HashMap::new();
    p.expect(b'{')?;
    if p.peek() == Some(b'}') {
        p.at += 1;
        return p.end(out);
    }
    loop {
        let name = p.string()?;
        p.expect(b':')?;
        let value = p.value()?;
        out.insert(name, value);
        match p.next() {
            Some(b',') => continue,
            Some(b'}') => return p.end(out),
            other => return Err(format!("expected , or }} at {}, got {other:?}", p.at)),
        }
    }
}

struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn skip_space(&mut self) {
        while matches!(self.bytes.get(self.at), Some(b' ' | b'\t' | b'\r' | b'\n')) {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_space();
        self.bytes.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek();
        self.at += 1;
        b
    }

    fn expect(&mut self, want: u8) -> Result<(), String> {
        match self.next() {
            Some(b) if b == want => Ok(()),
            other => Err(format!(
                "expected {:?} at {}, got {other:?}",
                want as char, self.at
            )),
        }
    }

    fn end<T>(&mut self, out: T) -> Result<T, String> {
        match self.peek() {
            None => Ok(out),
            Some(b) => Err(format!("trailing {:?} at {}", b as char, self.at)),
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        match self.peek() {
            Some(b'"') => self.string().map(Json::Str),
            Some(b'n') => self.word("null", Json::Null),
            Some(b't') => self.word("true", Json::Bool(true)),
            Some(b'f') => self.word("false", Json::Bool(false)),
            Some(b'-' | b'0'..=b'9') => {
                let start = self.at;
                while matches!(
                    self.bytes.get(self.at),
                    Some(b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                ) {
                    self.at += 1;
                }
                Ok(Json::Num(
                    String::from_utf8_lossy(&self.bytes[start..self.at]).into_owned(),
                ))
            }
            other => Err(format!("unexpected {other:?} at {}", self.at)),
        }
    }

    fn word(&mut self, word: &str, value: Json) -> Result<Json, String> {
        if self.bytes[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(value)
        } else {
            Err(format!("expected {word} at {}", self.at))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let Some(&b) = self.bytes.get(self.at) else {
                return Err("unterminated string".into());
            };
            self.at += 1;
            match b {
                b'"' => return String::from_utf8(out).map_err(|e| e.to_string()),
                b'\\' => {
                    let Some(&e) = self.bytes.get(self.at) else {
                        return Err("unterminated escape".into());
                    };
                    self.at += 1;
                    match e {
                        b'"' | b'\\' | b'/' => out.push(e),
                        b'n' => out.push(b'\n'),
                        b't' => out.push(b'\t'),
                        b'r' => out.push(b'\r'),
                        b'b' => out.push(8),
                        b'f' => out.push(12),
                        b'u' => {
                            let mut code = self.hex4()?;
                            if (0xD800..0xDC00).contains(&code)
                                && self.bytes[self.at..].starts_with(b"\\u")
                            {
                                self.at += 2;
                                let low = self.hex4()?;
                                code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                            }
                            let c = char::from_u32(code).unwrap_or('\u{FFFD}');
                            out.extend_from_slice(c.to_string().as_bytes());
                        }
                        other => return Err(format!("bad escape \\{}", other as char)),
                    }
                }
                b => out.push(b),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .bytes
            .get(self.at..self.at + 4)
            .ok_or("short \\u escape")?;
        self.at += 4;
        u32::from_str_radix(std::str::from_utf8(digits).map_err(|e| e.to_string())?, 16)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_drivers_lines() {
        let rust = r#"{"lib":"rust","replicas":1,"key":"fo1:x","kind":"exclusive","limit":null,"owner":"a \"b\"","token":1795352340123001,"start_ms":1795352340123,"end_ms":1795352340200,"end":"lost:Expired"}"#;
        let o = parse_object(rust).unwrap();
        assert_eq!(o["token"].int(), Some(1795352340123001));
        assert_eq!(o["owner"].str(), Some("a \"b\""));
        assert_eq!(o["limit"], Json::Null);
        let python = r#"{"lib": "python", "replicas": 0, "key": "fo0:s", "kind": "permit", "limit": 2, "owner": "\u00e9", "token": 17, "start_ms": 1795352340123.456, "end_ms": 1795352340200.5, "end": "released"}"#;
        let o = parse_object(python).unwrap();
        assert_eq!(o["start_ms"].float(), Some(1795352340123.456));
        assert_eq!(o["owner"].str(), Some("é"));
        assert_eq!(o["limit"].int(), Some(2));
        assert!(parse_object("{\"a\": 1").is_err());
        assert!(parse_object("{\"a\": 1} x").is_err());
    }
}
