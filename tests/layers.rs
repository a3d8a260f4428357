//! The layer order of `src/`: `lib.rs` declares the top-level modules lowest first, and each
//! may import (`crate::NAME`) only modules declared before it, so no two import each other,
//! directly or through others. ARCHITECTURE.md states the same order.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// The top-level modules in the order `lib.rs` declares them.
fn declared_order(root: &Path) -> Vec<String> {
    let lib = fs::read_to_string(root.join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("mod ").and_then(|r| r.strip_suffix(';')))
        .map(str::to_string)
        .collect()
}

/// Source text without `//` comments (doc links name modules without importing them).
fn code_of(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

/// The paths a file names under `crate::`, each item of a `use crate::{...}` group its own
/// (`ir::lang::Kind`, `codegen`): a group nested inside an item is cut at its brace.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        let items: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group[..group.find('}').unwrap_or(group.len())].split(',').collect(),
            None => vec![rest],
        };
        for item in items {
            let path: String =
                item.trim().chars().take_while(|c| c.is_alphanumeric() || matches!(c, '_' | ':')).collect();
            out.push(path.trim_end_matches(':').to_string());
        }
    }
    out
}

/// The crate modules a file refers to (the first part of each path it names).
fn references(code: &str, modules: &[String]) -> Vec<String> {
    let mut out: Vec<String> =
        crate_paths(code).iter().map(|p| p.split("::").next().unwrap_or("").to_string()).collect();
    out.retain(|n| modules.contains(n));
    out
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let order = declared_order(root);
    assert!(order.len() >= 8, "lib.rs declares the layers: {order:?}");
    let rank: BTreeMap<&str, usize> = order.iter().enumerate().map(|(i, m)| (m.as_str(), i)).collect();
    let mut files = vec![];
    rust_files(&root.join("src"), &mut files);
    let mut wrong = vec![];
    for f in &files {
        let rel = f.strip_prefix(root.join("src")).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_string();
        let Some(&own) = rank.get(top.as_str()) else { continue };
        let code = code_of(&fs::read_to_string(f).unwrap());
        for r in references(&code, &order) {
            if rank[r.as_str()] > own {
                wrong.push(format!("{} imports `{r}`, a layer above `{top}`", rel.display()));
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "imports against the layer order of lib.rs:\n{}", wrong.join("\n"));
}

#[test]
fn few_files_sit_loose_in_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let loose: Vec<String> = fs::read_dir(root.join("src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert!(loose.len() <= 12, "{} files loose in src/ (at most 12): {loose:?}", loose.len());
}

#[test]
fn architecture_md_draws_the_same_order_within_200_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();
    assert!(lines <= 200, "ARCHITECTURE.md is a map of at most 200 lines, not {lines}");
    let layers = &text[text.find("## Layers").expect("a Layers section")..];
    let layers = &layers[..layers[3..].find("\n## ").map_or(layers.len(), |i| i + 3)];
    let layers = &layers[layers.find("\n|").expect("a table of the layers")..];
    let mut last = 0;
    for m in declared_order(root) {
        let at = [format!("| `{m}/`"), format!("| `{m}.rs`"), format!(", `{m}.rs`")]
            .iter()
            .filter_map(|k| layers.find(k.as_str()))
            .min()
            .unwrap_or_else(|| panic!("ARCHITECTURE.md's Layers table has no row for `{m}`"));
        assert!(at >= last, "ARCHITECTURE.md lists `{m}` out of lib.rs's order");
        last = at;
    }
}

/// The planner's folders, which may ask code generation only through `codegen::caps`.
const PLANNER: [&str; 5] = ["autodiff", "frontend", "cost", "search", "plan"];

/// The paths a file names under `crate::codegen` other than `crate::codegen::caps`, also
/// inside `use crate::{...}` groups (`codegen::gemm`, `codegen`).
fn codegen_paths_besides_caps(code: &str) -> Vec<String> {
    crate_paths(code)
        .into_iter()
        .filter(|p| (p == "codegen" || p.starts_with("codegen::")) && !p.starts_with("codegen::caps"))
        .collect()
}

#[test]
fn the_planner_asks_codegen_only_through_caps() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = vec![];
    for dir in PLANNER {
        let d = root.join("src").join(dir);
        let mut files = vec![];
        if d.is_dir() {
            rust_files(&d, &mut files);
        }
        let top = root.join("src").join(format!("{dir}.rs"));
        if top.is_file() {
            files.push(top);
        }
        for f in &files {
            for p in codegen_paths_besides_caps(&code_of(&fs::read_to_string(f).unwrap())) {
                wrong.push(format!("{} names `crate::{p}`", f.strip_prefix(root).unwrap().display()));
            }
        }
    }
    assert!(wrong.is_empty(), "the planner asks codegen through `crate::codegen::caps` only:\n{}", wrong.join("\n"));
}

#[test]
fn the_caps_check_sees_other_codegen_paths() {
    let names = |s: &str| codegen_paths_besides_caps(s);
    assert_eq!(names("let t = crate::codegen::gemm::kernel_tile(d);"), ["codegen::gemm::kernel_tile"]);
    assert_eq!(names("use crate::codegen::{generates, loads_masks};"), ["codegen"]);
    assert_eq!(names("use crate::{codegen::attention, ir::types::DType};"), ["codegen::attention"]);
    assert!(names("use crate::codegen::caps::{self, MAX_GEMM_ROW};").is_empty());
    assert!(names("crate::codegen::caps::row_cached(w, 1, 4)").is_empty());
    assert!(names("use crate::ir::types::DType;").is_empty());
}
