//! The crate's three layers, checked on its sources: the model imports the operations and
//! the runtime, the operations import the runtime, and nothing imports back up (test code
//! included); backend `cfg`s stand only in the operations and the runtime. docs/design.md
//! describes the layers; the house limit on a function's length is checked for the whole
//! workspace in `xtask/tests/house_style.rs`.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let files = walkdir::WalkDir::new(dir).sort_by_file_name().into_iter();
    let files = files.map(|entry| entry.unwrap().into_path());
    files
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect()
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

/// The checks above find what they look for: the model does import the operations and
/// the runtime, and the operations the runtime (so an empty list above is not a walk that
/// read nothing).
#[test]
fn the_imports_down_the_layers_are_found() {
    for (layer, below) in [
        ("model", "crate::ops"),
        ("model", "crate::runtime"),
        ("ops", "crate::runtime"),
    ] {
        let found = lines_naming(layer, &[below]);
        assert!(!found.is_empty(), "no `{below}` found under src/{layer}");
    }
}
