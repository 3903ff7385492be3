//! Options: one table of `{name, default, description}`, read once from `EDGEPOOL_<NAME>`.
//!
//! Parsing is pure and allocation-free. Sizes accept a plain number of bytes or a `K`, `M`, `G` suffix
//! (powers of 1024, optional trailing `B`/`iB`); booleans accept `1/true/yes/on` and `0/false/no/off`.
//! A bad value is reported once on stderr, with the reason, and the default is kept; a name that is not
//! an option (a typo) is reported too, with the closest option's name. Names that start with `TEST_`
//! (the test suite's) and [`NOT_OPTIONS`] belong to edgepool's tools and are passed over.
#![forbid(unsafe_code)]

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Size,
    Bool,
    /// A file name: the table keeps 1 when it is set (the module that uses it reads the name itself).
    Path,
    /// A boolean, or `json:PATH` (kept as [`STATS_JSON`]; the path is read again when it is used).
    Stats,
    /// A boolean, or `backtrace` (kept as [`DEBUG_BACKTRACE`]).
    Debug,
}

/// `EDGEPOOL_STATS=json:PATH`.
pub const STATS_JSON: u64 = 2;
/// `EDGEPOOL_DEBUG=backtrace`.
pub const DEBUG_BACKTRACE: u64 = 2;

pub struct OptionDef {
    pub name: &'static str,
    pub kind: Kind,
    pub default: u64,
    pub description: &'static str,
}

/// Indices into [`OPTIONS`].
pub const RESERVE: usize = 0;
pub const MAX_BLOCK: usize = 1;
pub const RETAIN: usize = 2;
pub const LIMIT: usize = 3;
pub const VERBOSE: usize = 4;
pub const STATS: usize = 5;
pub const LOAD_PHASE: usize = 6;
pub const LOAD_SECONDS: usize = 7;
pub const LOAD_RETAIN: usize = 8;
pub const LOAD_ARENA: usize = 9;
pub const PURGE_DELAY: usize = 10;
pub const LOAD_PREFAULT: usize = 11;
pub const SECURE: usize = 12;
pub const CURVE: usize = 13;
pub const CURVE_MS: usize = 14;
pub const DEBUG: usize = 15;
pub const PROFILE: usize = 16;
pub const REUSE_SLACK: usize = 17;
pub const RETAIN_PERCENT: usize = 18;
pub const MOVE_PAGES: usize = 19;

/// Every option edgepool reads. The README's table is this table.
///
/// A `static`, not a `const`: each use of a `const` array is a copy of it in the code unit that uses
/// it, and the descriptions' text went with each copy. With the code split into units as it was at
/// 67e36fb, the library's first read-only segment (resident in every process) held all of them
/// twice (`tests/preload.rs`, `the_library_holds_each_table_once`).
pub static OPTIONS: [OptionDef; 20] = [
    OptionDef {
        name: "RESERVE",
        kind: Kind::Size,
        default: 64 << 30,
        description: "address space reserved for the heap (not memory: pages are committed on use)",
    },
    OptionDef {
        name: "MAX_BLOCK",
        kind: Kind::Size,
        default: 64 << 20,
        description: "largest buddy block (power of two, 256K..1G); larger requests are mapped directly",
    },
    OptionDef {
        name: "RETAIN",
        kind: Kind::Size,
        default: 8 << 20,
        description: "free heap memory kept resident for reuse; beyond it, free memory goes back to the OS before fresh memory would raise the heap's peak, and after waiting PURGE_DELAY unused",
    },
    OptionDef {
        name: "LIMIT",
        kind: Kind::Size,
        default: 0,
        description: "budget of bytes taken from the OS (0 = none); requests beyond it fail cleanly",
    },
    OptionDef {
        name: "VERBOSE",
        kind: Kind::Bool,
        default: 0,
        description: "print once that edgepool is active, with the options in effect",
    },
    OptionDef {
        name: "STATS",
        kind: Kind::Stats,
        default: 0,
        description: "at process exit, print edgepool's statistics to stderr (1), or write them as one JSON object to a file (json:PATH)",
    },
    OptionDef {
        name: "LOAD_PHASE",
        kind: Kind::Bool,
        default: 0,
        description: "open a process-wide load phase at start-up; it ends on SIGUSR2, after LOAD_SECONDS or at edgepool_load_end()",
    },
    OptionDef {
        name: "LOAD_SECONDS",
        kind: Kind::Size,
        default: 0,
        description: "with LOAD_PHASE: end the start-up load phase after this many seconds (0 = only on a signal or call)",
    },
    OptionDef {
        name: "LOAD_RETAIN",
        kind: Kind::Size,
        default: 0,
        description: "RETAIN while a load phase is open: by default none, so that memory waiting for reuse never adds to the peak of loading (the phase's end purges everything free)",
    },
    OptionDef {
        name: "LOAD_ARENA",
        kind: Kind::Bool,
        default: 0,
        description: "load phases of the C API and EDGEPOOL_LOAD_PHASE bump-allocate from an arena instead of segregated slabs",
    },
    OptionDef {
        name: "PURGE_DELAY",
        kind: Kind::Size,
        default: 250,
        description: "milliseconds that free memory beyond RETAIN may stay resident, waiting for reuse, before it goes back to the OS (0 = at once)",
    },
    OptionDef {
        name: "LOAD_PREFAULT",
        kind: Kind::Bool,
        default: 1,
        description: "inside a load phase, a large block of fresh memory (256 KiB or more; not zeroed requests, not realloc) is faulted in with one call instead of page by page",
    },
    OptionDef {
        name: "SECURE",
        kind: Kind::Bool,
        default: 0,
        description: "hardened mode: a guard page after every slab, and free heap memory made inaccessible when it is purged, until it is handed out again (each costs a mapping: see the README)",
    },
    OptionDef {
        name: "CURVE",
        kind: Kind::Path,
        default: 0,
        description: "write the memory curve to this CSV file: every CURVE_MS, the process RSS, the bytes in use, the bytes held from the OS, the system's available memory and whether a load phase is open (scripts/plot-curve.py draws it)",
    },
    OptionDef {
        name: "CURVE_MS",
        kind: Kind::Size,
        default: 5,
        description: "milliseconds between two samples of EDGEPOOL_CURVE (at least 1)",
    },
    OptionDef {
        name: "DEBUG",
        kind: Kind::Debug,
        default: 0,
        description: "(a library built with the `debug` feature) debug mode: a canary after every block, checked at free, realloc and edgepool_check(); every double or invalid free caught; freed blocks filled with 0xDD and small ones held in a quarantine that catches writes after free; the last 256 allocator events dumped on corruption and on SIGSEGV, SIGBUS and SIGABRT (backtrace: with the callers of each event)",
    },
    OptionDef {
        name: "PROFILE",
        kind: Kind::Bool,
        default: 0,
        description: "(a library built with the `debug` feature) sizing advice: count requests by size and the peak live blocks of each class; at exit, print the waste of today's size classes, the classes with the least waste for this run, and the pools that would have held its peak with 1.2x headroom",
    },
    OptionDef {
        name: "REUSE_SLACK",
        kind: Kind::Size,
        default: 25,
        description: "percent: outside load phases, free memory waiting for reuse may hold the heap up to this far above the most bytes in use since the last trim() or phase end before fresh memory makes it go back to the OS, as far as the process earned it by faulting purged memory back in (0 = never above the heap's own high-water mark)",
    },
    OptionDef {
        name: "RETAIN_PERCENT",
        kind: Kind::Size,
        default: 50,
        description: "percent: outside load phases, a process that churns (one that reused more freed memory than its heap grew by) keeps free memory resident up to this share of its bytes in use, when that is more than RETAIN, until trim() or a phase's end",
    },
    OptionDef {
        name: "MOVE_PAGES",
        kind: Kind::Bool,
        default: 1,
        description: "where free memory must leave the resident set as a large block's fresh pages fault in, its resident pages move into the block instead (mremap, Linux 5.7+), and realloc moves a large block's pages instead of copying them; 0 = purge and fault in, copy",
    },
];

/// `EDGEPOOL_*` names that are not allocator options but belong to edgepool's own tools (the tract
/// example's allocator switch); with every name starting with `TEST_`, they are not reported.
pub const NOT_OPTIONS: [&str; 1] = ["ALLOCATOR"];

/// Whether `name` (without the prefix) belongs to edgepool's tools rather than to the allocator.
pub fn is_tool_name(name: &[u8]) -> bool {
    name.starts_with(b"TEST_") || NOT_OPTIONS.iter().any(|n| n.as_bytes() == name)
}

/// The option whose name is closest to `name` (at most two edits away), for "did you mean".
pub fn closest(name: &[u8]) -> Option<&'static str> {
    fn distance(a: &[u8], b: &[u8]) -> usize {
        // Levenshtein, one row; names are short (a fixed buffer, no allocation).
        let mut row = [0usize; 64];
        if b.len() >= row.len() {
            return usize::MAX;
        }
        for (j, r) in row.iter_mut().enumerate().take(b.len() + 1) {
            *r = j;
        }
        for (i, &ca) in a.iter().enumerate() {
            let mut diag = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let up = row[j + 1];
                row[j + 1] = (diag + usize::from(!ca.eq_ignore_ascii_case(&cb))).min(up + 1).min(row[j] + 1);
                diag = up;
            }
        }
        row[b.len()]
    }
    OPTIONS.iter().map(|d| (distance(name, d.name.as_bytes()), d.name)).filter(|&(d, _)| d <= 2).min().map(|(_, n)| n)
}

/// Parses a decimal unsigned number (the whole slice).
pub fn parse_u64(s: &[u8]) -> Option<u64> {
    let s = trim(s);
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

fn trim(s: &[u8]) -> &[u8] {
    let mut a = 0;
    let mut b = s.len();
    while a < b && (s[a] == b' ' || s[a] == b'\n' || s[a] == b'\t') {
        a += 1;
    }
    while b > a && (s[b - 1] == b' ' || s[b - 1] == b'\n' || s[b - 1] == b'\t') {
        b -= 1;
    }
    &s[a..b]
}

/// Parses a size: `4096`, `64K`, `180M`, `2G`, `2GiB`, `512kb` (case-insensitive suffixes).
pub fn parse_size(s: &[u8]) -> Option<u64> {
    let s = trim(s);
    let mut end = s.len();
    let lower = |c: u8| c.to_ascii_lowercase();
    // strip "b" / "ib"
    if end > 0 && lower(s[end - 1]) == b'b' {
        end -= 1;
        if end > 0 && lower(s[end - 1]) == b'i' {
            end -= 1;
        }
    }
    let (num, shift) = match s[..end].last().map(|&c| lower(c)) {
        Some(b'k') => (&s[..end - 1], 10),
        Some(b'm') => (&s[..end - 1], 20),
        Some(b'g') => (&s[..end - 1], 30),
        Some(b't') => (&s[..end - 1], 40),
        _ => {
            if end != s.len() && end + 1 != s.len() {
                return None; // "iB" without a unit letter
            }
            (&s[..end], 0)
        }
    };
    let v = parse_u64(num)?;
    v.checked_mul(1u64 << shift)
}

/// Parses a boolean.
pub fn parse_bool(s: &[u8]) -> Option<bool> {
    let s = trim(s);
    let eq = |w: &[u8]| s.len() == w.len() && s.iter().zip(w).all(|(a, b)| a.to_ascii_lowercase() == *b);
    if eq(b"1") || eq(b"true") || eq(b"yes") || eq(b"on") {
        Some(true)
    } else if eq(b"0") || eq(b"false") || eq(b"no") || eq(b"off") || s.is_empty() {
        Some(false)
    } else {
        None
    }
}

/// Checks an option's value beyond its syntax; returns the value to use, or why it is refused.
pub fn validate(index: usize, v: u64) -> Result<u64, &'static str> {
    match index {
        MAX_BLOCK if !(v.is_power_of_two() && (256 << 10..=1 << 30).contains(&v)) => {
            Err("it must be a power of two from 256K to 1G")
        }
        RESERVE if v < 16 << 20 => Err("it must be at least 16M"),
        CURVE_MS if v == 0 => Err("it must be at least 1"),
        _ => Ok(v),
    }
}

/// The values in effect: defaults overridden by the environment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Values(pub [u64; OPTIONS.len()]);

impl Default for Values {
    fn default() -> Self {
        Self::defaults()
    }
}

/// The defaults, read from [`OPTIONS`] when the crate is compiled: only the numbers are in the code.
const DEFAULTS: Values = {
    let mut v = [0u64; OPTIONS.len()];
    let mut i = 0;
    while i < OPTIONS.len() {
        v[i] = OPTIONS[i].default;
        i += 1;
    }
    Values(v)
};

impl Values {
    pub const fn defaults() -> Values {
        DEFAULTS
    }

    /// Applies one `NAME=value` pair (name without the `EDGEPOOL_` prefix). Returns `Ok(true)` when
    /// it set an option, `Ok(false)` for a name that is not an option (left alone), and for a known
    /// name with a bad value the reason, keeping the option as it was.
    pub fn apply(&mut self, name: &[u8], value: &[u8]) -> Result<bool, &'static str> {
        for (i, def) in OPTIONS.iter().enumerate() {
            if def.name.as_bytes() == name {
                let parsed = match def.kind {
                    Kind::Size => {
                        parse_size(value).ok_or("it is not a size (a number of bytes, or with a K, M, G or T suffix)")
                    }
                    Kind::Bool => {
                        parse_bool(value).map(u64::from).ok_or("it is not a boolean (1/0, true/false, yes/no, on/off)")
                    }
                    Kind::Path if value.is_empty() || value.len() >= 4096 => {
                        Err("it must be a file name of 1 to 4095 bytes")
                    }
                    Kind::Path => Ok(1),
                    Kind::Stats => match value.strip_prefix(b"json:") {
                        Some(path) if !path.is_empty() && path.len() < 4096 => Ok(STATS_JSON),
                        Some(_) => Err("json: needs a file name of 1 to 4095 bytes"),
                        None => parse_bool(value).map(u64::from).ok_or("it is 1/0 (or true/false...) or json:PATH"),
                    },
                    Kind::Debug if trim(value).eq_ignore_ascii_case(b"backtrace") => Ok(DEBUG_BACKTRACE),
                    Kind::Debug => parse_bool(value).map(u64::from).ok_or("it is 1/0 (or true/false...) or backtrace"),
                };
                self.0[i] = parsed.and_then(|v| validate(i, v))?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    pub fn get(&self, i: usize) -> u64 {
        self.0[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_takes_a_boolean_or_a_json_file() {
        let mut v = Values::defaults();
        assert_eq!(v.apply(b"STATS", b"1"), Ok(true));
        assert_eq!(v.get(STATS), 1);
        assert_eq!(v.apply(b"STATS", b"json:/tmp/s.json"), Ok(true));
        assert_eq!(v.get(STATS), STATS_JSON);
        assert!(v.apply(b"STATS", b"json:").is_err());
        assert!(v.apply(b"STATS", b"xml:/tmp/s").is_err());
        assert_eq!(v.get(STATS), STATS_JSON);
    }

    #[test]
    fn debug_takes_a_boolean_or_backtrace() {
        let mut v = Values::defaults();
        assert_eq!(v.get(DEBUG), 0);
        assert_eq!(v.apply(b"DEBUG", b"1"), Ok(true));
        assert_eq!(v.get(DEBUG), 1);
        assert_eq!(v.apply(b"DEBUG", b"Backtrace"), Ok(true));
        assert_eq!(v.get(DEBUG), DEBUG_BACKTRACE);
        assert!(v.apply(b"DEBUG", b"loud").is_err());
        assert_eq!(v.get(DEBUG), DEBUG_BACKTRACE);
        assert_eq!(v.apply(b"DEBUG", b"off"), Ok(true));
        assert_eq!(v.get(DEBUG), 0);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size(b"4096"), Some(4096));
        assert_eq!(parse_size(b"64K"), Some(64 << 10));
        assert_eq!(parse_size(b"180M"), Some(180 << 20));
        assert_eq!(parse_size(b"180m"), Some(180 << 20));
        assert_eq!(parse_size(b"2G"), Some(2 << 30));
        assert_eq!(parse_size(b"2GiB"), Some(2 << 30));
        assert_eq!(parse_size(b"512kb"), Some(512 << 10));
        assert_eq!(parse_size(b" 12 "), Some(12));
        assert_eq!(parse_size(b""), None);
        assert_eq!(parse_size(b"M"), None);
        assert_eq!(parse_size(b"-1"), None);
        assert_eq!(parse_size(b"1.5M"), None);
        assert_eq!(parse_size(b"12x"), None);
        assert_eq!(parse_size(b"99999999999999999999"), None);
        assert_eq!(parse_size(b"99999999999T"), None);
    }

    #[test]
    fn bools() {
        for t in [&b"1"[..], b"true", b"YES", b"On"] {
            assert_eq!(parse_bool(t), Some(true));
        }
        for f in [&b"0"[..], b"false", b"no", b"OFF", b""] {
            assert_eq!(parse_bool(f), Some(false));
        }
        assert_eq!(parse_bool(b"maybe"), None);
    }

    #[test]
    fn apply_keeps_default_on_bad_value() {
        let mut v = Values::defaults();
        assert_eq!(v.apply(b"LIMIT", b"180M"), Ok(true));
        assert_eq!(v.get(LIMIT), 180 << 20);
        assert_eq!(v.apply(b"MAX_BLOCK", b"3M"), Err("it must be a power of two from 256K to 1G"));
        assert_eq!(v.get(MAX_BLOCK), OPTIONS[MAX_BLOCK].default);
        assert_eq!(v.apply(b"MAX_BLOCK", b"128M"), Ok(true));
        assert_eq!(v.get(MAX_BLOCK), 128 << 20);
        assert_eq!(v.apply(b"NOPE", b"1"), Ok(false));
        assert!(v.apply(b"VERBOSE", b"bogus").unwrap_err().contains("boolean"));
        assert_eq!(v.apply(b"RESERVE", b"1M"), Err("it must be at least 16M"));
        assert!(v.apply(b"RETAIN", b"lots").unwrap_err().contains("size"));
    }

    #[test]
    fn typos_find_the_closest_option_and_tool_names_are_passed_over() {
        assert_eq!(closest(b"MAXBLOCK"), Some("MAX_BLOCK"));
        assert_eq!(closest(b"retain"), Some("RETAIN"));
        assert_eq!(closest(b"LOAD_PHASES"), Some("LOAD_PHASE"));
        assert_eq!(closest(b"SOMETHING_ELSE"), None);
        assert!(is_tool_name(b"TEST_PYTHON") && is_tool_name(b"ALLOCATOR"));
        assert!(!is_tool_name(b"MAXBLOCK"));
    }
}
