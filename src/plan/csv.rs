//! Reads tensor-lifetime CSVs: `tensor_id,size_bytes,first_op,last_op[,align]`, one header line.
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::fmt;

use super::Tensor;

/// A CSV error with its 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

fn err(line: usize, message: impl Into<String>) -> ParseError {
    ParseError { line, message: message.into() }
}

fn number(line: usize, field: &str, what: &str) -> Result<u64, ParseError> {
    let f = field.trim();
    if f.starts_with('-') {
        return Err(err(line, format!("{what} is negative: '{f}'")));
    }
    f.parse::<u64>().map_err(|_| err(line, format!("{what} is not a whole number: '{f}'")))
}

/// Parses a CSV. Blank lines and lines starting with `#` are skipped. `default_align` applies to rows
/// without an `align` column.
pub fn parse(text: &str, default_align: u64) -> Result<Vec<Tensor>, ParseError> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| {
        let t = l.trim();
        !t.is_empty() && !t.starts_with('#')
    });
    let Some((hline, header)) = lines.next() else {
        return Err(err(1, "empty file: expected a header 'tensor_id,size_bytes,first_op,last_op'"));
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    if cols.len() < 4 || cols[..4] != ["tensor_id", "size_bytes", "first_op", "last_op"] {
        return Err(err(
            hline,
            format!("bad header '{header}': expected 'tensor_id,size_bytes,first_op,last_op[,align]'"),
        ));
    }
    let has_align = cols.get(4) == Some(&"align");
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (line, row) in lines {
        let f: Vec<&str> = row.split(',').collect();
        let want = if has_align { 5 } else { 4 };
        if f.len() != want {
            return Err(err(line, format!("expected {want} fields, found {}", f.len())));
        }
        let id = f[0].trim();
        if id.is_empty() {
            return Err(err(line, "empty tensor_id"));
        }
        if !seen.insert(id.to_owned()) {
            return Err(err(line, format!("duplicate tensor_id '{id}'")));
        }
        let size = number(line, f[1], "size_bytes")?;
        let first = number(line, f[2], "first_op")?;
        let last = number(line, f[3], "last_op")?;
        if first > u32::MAX as u64 || last > u32::MAX as u64 {
            return Err(err(line, "op index beyond 2^32"));
        }
        if last < first {
            return Err(err(line, format!("last_op {last} is before first_op {first}")));
        }
        let align = if has_align { number(line, f[4], "align")? } else { default_align };
        if !align.is_power_of_two() {
            return Err(err(line, format!("align {align} is not a power of two")));
        }
        out.push(Tensor { id: id.to_owned(), size, first: first as u32, last: last as u32, align });
    }
    if out.is_empty() {
        return Err(err(hline, "no tensors after the header"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "tensor_id,size_bytes,first_op,last_op\n";

    #[test]
    fn good_file() {
        let ts = parse(&format!("{H}a,100,0,1\n\n# note\nb,5,1,2\n"), 1).unwrap();
        assert_eq!(ts.len(), 2);
        assert_eq!(ts[1], Tensor::new("b", 5, 1, 2));
        let ts = parse("tensor_id,size_bytes,first_op,last_op,align\na,100,0,1,64\n", 1).unwrap();
        assert_eq!(ts[0].align, 64);
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("", 1, "empty file"),
            ("id,size\n", 1, "bad header"),
            (H, 1, "no tensors"),
            (&format!("{H}a,-5,0,1\n") as &str, 2, "negative"),
            (&format!("{H}a,12x,0,1\n"), 2, "not a whole number"),
            (&format!("{H}a,1,0,1\nb,1,3,2\n"), 3, "before first_op"),
            (&format!("{H}a,1,0,1\na,1,0,1\n"), 3, "duplicate"),
            (&format!("{H}a,1,0\n"), 2, "expected 4 fields"),
        ];
        for (text, line, what) in cases {
            let e = parse(text, 1).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
        }
    }
}
