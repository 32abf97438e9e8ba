//! The crate's three layers, checked on its sources: the model imports the operations and
//! the runtime, the operations import the runtime, and nothing imports back up (test code
//! included); backend `cfg`s stand only in the operations and the runtime; no function is
//! longer than the house limit. docs/design.md describes the layers.

use std::fs;
use std::path::{Path, PathBuf};

/// The longest function the house style allows, in lines (signature to closing brace).
const MOST_LINES: usize = 80;

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

fn src(layer: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(layer)
}

/// The file's lines that are code: comments (`//`, `///`, `//!`) left out.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(i, line)| (i + 1, line.to_string()))
        .collect()
}

/// `file:line: text` for each code line under `layer` that contains one of `needles`.
fn lines_naming(layer: &str, needles: &[&str]) -> Vec<String> {
    sources(&src(layer))
        .iter()
        .flat_map(|path| {
            code_lines(path)
                .into_iter()
                .filter(|(_, line)| needles.iter().any(|n| line.contains(n)))
                .map(move |(i, line)| format!("{}:{i}: {}", path.display(), line.trim()))
        })
        .collect()
}

#[test]
fn operations_and_runtime_import_nothing_above_them() {
    let up_from_ops = lines_naming("ops", &["crate::model", "crate::AttentionModel"]);
    assert!(
        up_from_ops.is_empty(),
        "ops import the model:\n{up_from_ops:#?}"
    );
    let up_from_runtime = lines_naming("runtime", &["crate::model", "crate::ops"]);
    assert!(
        up_from_runtime.is_empty(),
        "the runtime imports a layer above it:\n{up_from_runtime:#?}"
    );
}

#[test]
fn the_model_names_no_backend_feature() {
    let cfgs = lines_naming("model", &["feature = \""]);
    assert!(cfgs.is_empty(), "backend cfgs in the model:\n{cfgs:#?}");
}

/// Functions longer than [`MOST_LINES`], in the crate's sources and tests: from a line that
/// opens a `fn` to the first line after it that closes a block at the same indentation.
#[test]
fn no_function_is_longer_than_the_house_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for path in [sources(&root.join("src")), sources(&root.join("tests"))].concat() {
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let opens = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "unsafe fn ",
            ]
            .iter()
            .any(|p| trimmed.starts_with(p))
                // `fn name => kernel(` names a function to a macro (`simd_dispatch!`); it
                // has no body here.
                && !trimmed.contains(" => ");
            // A declaration without a body (a trait's method) ends its signature in `;`.
            let signature_end = lines[i..]
                .iter()
                .map(|l| l.trim_end())
                .find(|l| l.ends_with('{') || l.ends_with(';'));
            if !opens || signature_end.is_none_or(|l| l.ends_with(';')) {
                continue;
            }
            let indent = line.len() - trimmed.len();
            let close = format!("{}}}", " ".repeat(indent));
            let end = lines[i + 1..]
                .iter()
                .position(|l| l.starts_with(&close) && l.trim() == "}")
                .map(|k| i + 1 + k);
            if let Some(end) = end {
                if end - i + 1 > MOST_LINES {
                    long.push(format!(
                        "{}:{}: {} lines",
                        path.display(),
                        i + 1,
                        end - i + 1
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines:\n{long:#?}"
    );
}
