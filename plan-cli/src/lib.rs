//! The readers of `edgepool-plan`: tensor-lifetime CSVs (through `csv` and `serde`) and, with the
//! `onnx` feature, ONNX models (through tract-onnx). The planner itself is `edgepool::plan`, which
//! depends on nothing.
#![forbid(unsafe_code)]

#[cfg(feature = "onnx")]
pub mod onnx;

use std::collections::HashSet;
use std::fmt;

use edgepool::plan::Tensor;
use serde::Deserialize;

/// A CSV error with its 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: u64,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

fn err(line: u64, message: impl Into<String>) -> ParseError {
    ParseError { line, message: message.into() }
}

const COLUMNS: [&str; 5] = ["tensor_id", "size_bytes", "first_op", "last_op", "align"];

/// One row: `tensor_id,size_bytes,first_op,last_op[,align]`.
#[derive(Deserialize)]
struct Row {
    tensor_id: String,
    size_bytes: u64,
    first_op: u32,
    last_op: u32,
    align: Option<u64>,
}

/// Reads a lifetime CSV: `tensor_id,size_bytes,first_op,last_op[,align]` with one header line. Blank
/// lines and lines starting with `#` are skipped; fields are trimmed. `default_align` applies to rows
/// without an `align` column. Every error names its line.
pub fn read_csv(text: &str, default_align: u64) -> Result<Vec<Tensor>, ParseError> {
    // Blank and comment lines are dropped before the reader sees the text (its line numbers skip
    // them); `lines[k]` is the file's line of the reader's line k + 1.
    let mut lines: Vec<u64> = Vec::new();
    let mut kept = String::with_capacity(text.len());
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if !t.is_empty() && !t.starts_with('#') {
            lines.push(i as u64 + 1);
            kept.push_str(l);
            kept.push('\n');
        }
    }
    let line_of = |reader_line: u64| lines.get(reader_line.saturating_sub(1) as usize).copied().unwrap_or(1);
    let mut reader = csv::ReaderBuilder::new().trim(csv::Trim::All).flexible(false).from_reader(kept.as_bytes());
    let header = reader.headers().map_err(|e| from_csv(&e, None, &line_of))?.clone();
    let hline = line_of(header.position().map_or(1, |p| p.line()));
    if header.is_empty() {
        return Err(err(1, "empty file: expected a header 'tensor_id,size_bytes,first_op,last_op'"));
    }
    let names: Vec<&str> = header.iter().collect();
    if names.len() < 4 || names.len() > 5 || names[..] != COLUMNS[..names.len()] {
        return Err(err(
            hline,
            format!("bad header '{}': expected 'tensor_id,size_bytes,first_op,last_op[,align]'", names.join(",")),
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.map_err(|e| from_csv(&e, None, &line_of))?;
        let line = line_of(record.position().map_or(1, |p| p.line()));
        let row: Row = record.deserialize(Some(&header)).map_err(|e| from_csv(&e, Some(&record), &line_of))?;
        if row.tensor_id.is_empty() {
            return Err(err(line, "empty tensor_id"));
        }
        if !seen.insert(row.tensor_id.clone()) {
            return Err(err(line, format!("duplicate tensor_id '{}'", row.tensor_id)));
        }
        if row.last_op < row.first_op {
            return Err(err(line, format!("last_op {} is before first_op {}", row.last_op, row.first_op)));
        }
        let align = row.align.unwrap_or(default_align);
        if !align.is_power_of_two() {
            return Err(err(line, format!("align {align} is not a power of two")));
        }
        out.push(Tensor { id: row.tensor_id, size: row.size_bytes, first: row.first_op, last: row.last_op, align });
    }
    if out.is_empty() {
        return Err(err(hline, "no tensors after the header"));
    }
    Ok(out)
}

/// The `csv` crate's error, said in this file's words (which field, what was wrong with it).
fn from_csv(e: &csv::Error, record: Option<&csv::StringRecord>, line_of: &dyn Fn(u64) -> u64) -> ParseError {
    let line = line_of(e.position().map_or(1, |p| p.line()));
    match e.kind() {
        csv::ErrorKind::UnequalLengths { expected_len, len, .. } => {
            err(line, format!("expected {expected_len} fields, found {len}"))
        }
        csv::ErrorKind::Deserialize { err: de, .. } => {
            let field = de.field().map(|f| f as usize);
            let name = field.and_then(|f| COLUMNS.get(f)).copied().unwrap_or("a field");
            let value = field.and_then(|f| record.and_then(|r| r.get(f))).unwrap_or("");
            let what = if value.starts_with('-') {
                "is negative"
            } else if name == "first_op" || name == "last_op" {
                "is not an op index below 2^32"
            } else {
                "is not a whole number"
            };
            err(line, format!("{name} {what}: '{value}'"))
        }
        csv::ErrorKind::Utf8 { .. } => err(line, "not UTF-8"),
        _ => err(line, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "tensor_id,size_bytes,first_op,last_op\n";

    #[test]
    fn good_file() {
        let ts = read_csv(&format!("{H}a,100,0,1\n\n# note\nb, 5 ,1,2\n"), 1).unwrap();
        assert_eq!(ts.len(), 2);
        assert_eq!(ts[1], Tensor::new("b", 5, 1, 2));
        let ts = read_csv("tensor_id,size_bytes,first_op,last_op,align\na,100,0,1,64\n", 1).unwrap();
        assert_eq!(ts[0].align, 64);
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("", 1, "empty file"),
            ("id,size\n", 1, "bad header"),
            (H, 1, "no tensors"),
            (&format!("{H}a,-5,0,1\n") as &str, 2, "size_bytes is negative: '-5'"),
            (&format!("{H}a,12x,0,1\n"), 2, "size_bytes is not a whole number: '12x'"),
            (&format!("{H}a,1,0,1\nb,1,3,2\n"), 3, "before first_op"),
            (&format!("{H}a,1,0,1\na,1,0,1\n"), 3, "duplicate"),
            (&format!("{H}a,1,0\n"), 2, "expected 4 fields, found 3"),
            (&format!("{H}# c\n\na,1,0,99999999999\n"), 4, "last_op is not an op index"),
            ("tensor_id,size_bytes,first_op,last_op,align\na,1,0,1,3\n", 2, "not a power of two"),
        ];
        for (text, line, what) in cases {
            let e = read_csv(text, 1).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.message.contains(what), "{text:?}: {e}");
        }
    }
}
