//! The layer rule of `src/lib.rs`, checked: every module uses only modules of its own layer or lower
//! ones, and no modules form a cycle. The layer table is read from `src/lib.rs`'s documentation (the
//! rows `//! | N | a, b | … |`), the uses from the `crate::NAME` paths in every file under `src/`
//! (comments left out). A file `src/x/…` belongs to module `x`; `src/bin` is another crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Module → layer, from the table in `lib.rs`.
fn layer_table(lib: &str) -> BTreeMap<String, u32> {
    let mut t = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! |") else { continue };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Ok(layer) = cells[0].parse::<u32>() else { continue };
        for m in cells[1].split(',') {
            assert!(t.insert(m.trim().to_string(), layer).is_none(), "module {m} listed twice");
        }
    }
    t
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module a file under `src/` belongs to (`None` for the crate root and other crates).
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    match first.as_str() {
        "lib.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_string()),
    }
}

/// The modules named by `crate::NAME` in `text`, comments left out.
fn uses(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap();
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}` lists several.
            if after.starts_with('{') {
                let group = &after[1..after.find('}').unwrap_or(after.len())];
                for n in group.split(',') {
                    let n: String = n.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !n.is_empty() {
                        out.insert(n);
                    }
                }
            } else if !name.is_empty() {
                out.insert(name);
            }
            rest = after;
        }
    }
    out
}

/// Module → the other modules it uses (only names that are modules of the table).
fn graph(table: &BTreeMap<String, u32>) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = vec![];
    rust_files(&src(), &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let Some(m) = module_of(&f) else { continue };
        assert!(table.contains_key(&m), "module {m} ({}) is missing from the layer table in lib.rs", f.display());
        let used = uses(&std::fs::read_to_string(&f).unwrap());
        let e = g.entry(m.clone()).or_default();
        e.extend(used.into_iter().filter(|u| table.contains_key(u) && *u != m));
    }
    g
}

/// A cycle in `g`, if any, as the list of modules along it.
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(n) {
            Some(2) => return None,
            Some(1) => {
                let at = path.iter().position(|p| p == n).unwrap();
                let mut c = path[at..].to_vec();
                c.push(n.to_string());
                return Some(c);
            }
            _ => {}
        }
        state.insert(n.to_string(), 1);
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, state, path) {
                return Some(c);
            }
        }
        path.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut state, &mut vec![]) {
            return Some(c);
        }
    }
    None
}

#[test]
fn modules_use_only_their_own_or_lower_layers() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let table = layer_table(&lib);
    assert!(table.len() >= 10, "the layer table in lib.rs was not found: {table:?}");
    let g = graph(&table);
    let mut upward = vec![];
    for (m, used) in &g {
        for u in used {
            if table[u] > table[m] {
                upward.push(format!("{m} (layer {}) uses {u} (layer {})", table[m], table[u]));
            }
        }
    }
    assert!(upward.is_empty(), "uses of a higher layer:\n{}", upward.join("\n"));
    if let Some(c) = find_cycle(&g) {
        panic!("modules form a cycle: {}", c.join(" → "));
    }
}

#[test]
fn the_checker_finds_upward_uses_and_cycles() {
    // The parsing: groups, comments, and names that are not modules.
    let u = uses("use crate::{heap, os::PAGE};\n// crate::phase\nlet x = crate::stats::add; crate::nothing();");
    assert_eq!(u, ["heap", "nothing", "os", "stats"].iter().map(|s| s.to_string()).collect());
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), ["b".to_string()].into_iter().collect::<BTreeSet<_>>());
    g.insert("b".to_string(), ["c".to_string()].into_iter().collect());
    g.insert("c".to_string(), BTreeSet::new());
    assert_eq!(find_cycle(&g), None);
    g.get_mut("c").unwrap().insert("a".to_string());
    assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
}
