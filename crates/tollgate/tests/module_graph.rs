//! The limiter's modules import each other without a circle: each top-level module of
//! `src/` (a file or a directory) may use the modules beneath it, never one that uses it
//! back. Read from the source: every `crate::module` path outside comments, and every
//! `crate::Name` through the root's re-exports (`pub use module::Name`). The test
//! scaffolding (`testing`), which uses everything, is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .expect("read src dir")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for e in entries {
            rust_files(&e, out);
        }
    } else if p.extension().is_some_and(|x| x == "rs") {
        out.push(p.to_path_buf());
    }
}

/// The identifiers following each `crate::` in `text`, outside `//` comments.
fn crate_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let ident: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !ident.is_empty() {
                out.push(ident);
            }
            rest = after;
        }
    }
    out
}

/// The root's re-exports: name → the top-level module it comes from.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let flat = lib.replace('\n', " ");
    for stmt in flat.split(';') {
        let s = stmt.trim();
        let Some(path) = s.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = path.split_once("::") else {
            continue;
        };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim();
            let last = n.rsplit("::").next().unwrap_or(n).trim();
            let name = last.split(" as ").last().unwrap_or(last).trim();
            if !name.is_empty() {
                out.insert(name.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

fn graph(src: &Path) -> Graph {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let names = reexports(&lib);
    let mut modules: BTreeMap<String, PathBuf> = BTreeMap::new();
    for e in std::fs::read_dir(src).expect("src") {
        let p = e.expect("entry").path();
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if stem != "lib" && stem != "testing" {
            modules.insert(stem, p);
        }
    }
    let mut g = Graph::new();
    for (m, p) in &modules {
        let mut files = Vec::new();
        rust_files(p, &mut files);
        let deps = g.entry(m.clone()).or_default();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("source file");
            for id in crate_paths(&text) {
                let target = if modules.contains_key(&id) {
                    Some(id)
                } else {
                    names.get(&id).cloned()
                };
                if let Some(t) = target.filter(|t| t != m && modules.contains_key(t)) {
                    deps.insert(t);
                }
            }
        }
    }
    g
}

/// A circle through `g`, if there is one, as the modules along it.
fn find_circle(g: &Graph) -> Option<Vec<String>> {
    fn visit(
        g: &Graph,
        m: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|x| x == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            return Some(c);
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            if let Some(c) = visit(g, d, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for m in g.keys() {
        if let Some(c) = visit(g, m, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 20, "the modules were found: {:?}", g.keys());
    assert!(
        g.get("acquire").is_some_and(|d| d.contains("limiter")),
        "the graph sees imports (acquire uses the limiter): {g:?}"
    );
    if let Some(c) = find_circle(&g) {
        panic!("import circle: {}", c.join(" -> "));
    }
}

#[test]
fn a_circle_is_found_when_there_is_one() {
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("c".into());
    g.entry("c".into()).or_default().insert("a".into());
    g.entry("d".into()).or_default().insert("a".into());
    assert_eq!(
        find_circle(&g).map(|c| c.join(" -> ")),
        Some("a -> b -> c -> a".to_string())
    );
    g.get_mut("c").expect("c").clear();
    assert_eq!(find_circle(&g), None);
}
