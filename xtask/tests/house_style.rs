//! The house style's limit on a function's length, checked on the whole workspace's
//! sources: every crate's code and tests, the benches and this tool.

use std::fs;
use std::path::{Path, PathBuf};

/// The longest function the house style allows, in lines (signature to closing brace).
const MOST_LINES: usize = 80;

/// Every `.rs` file under `dir`, sorted (build outputs left out).
fn sources(dir: &Path) -> Vec<PathBuf> {
    let files = walkdir::WalkDir::new(dir)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|entry| entry.file_name() != "target");
    let files = files.map(|entry| entry.unwrap().into_path());
    files
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect()
}

/// Whether `line` opens a function with a body here. `fn name => kernel(` names a function
/// to a macro (`simd_dispatch!`), and a declaration without a body (a trait's method) ends
/// its signature in `;`.
fn opens_a_body(lines: &[&str], i: usize) -> bool {
    let trimmed = lines[i].trim_start();
    let opens = [
        "fn ",
        "pub fn ",
        "pub(crate) fn ",
        "pub(super) fn ",
        "unsafe fn ",
    ]
    .iter()
    .any(|p| trimmed.starts_with(p))
        && !trimmed.contains(" => ");
    let signature_end = lines[i..]
        .iter()
        .map(|l| l.trim_end())
        .find(|l| l.ends_with('{') || l.ends_with(';'));
    opens && signature_end.is_some_and(|l| l.ends_with('{'))
}

/// `file:line: N lines` for each function in `path` longer than [`MOST_LINES`]: from a line
/// that opens a `fn` to the first line after it that closes a block at the same indentation.
fn long_functions(path: &Path) -> Vec<String> {
    let text = fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut long = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !opens_a_body(&lines, i) {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let close = format!("{}}}", " ".repeat(indent));
        let end = lines[i + 1..]
            .iter()
            .position(|l| l.starts_with(&close) && l.trim() == "}")
            .map(|k| i + 1 + k);
        if let Some(end) = end.filter(|end| end - i + 1 > MOST_LINES) {
            long.push(format!(
                "{}:{}: {} lines",
                path.display(),
                i + 1,
                end - i + 1
            ));
        }
    }
    long
}

#[test]
fn no_function_is_longer_than_the_house_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files: Vec<PathBuf> = ["crates", "benches", "xtask"]
        .iter()
        .flat_map(|dir| sources(&root.join(dir)))
        .collect();
    // The model crate alone holds ~100 files: a scan that finds few read the wrong place.
    assert!(files.len() > 100, "{} sources under {root:?}", files.len());
    let long: Vec<String> = files.iter().flat_map(|f| long_functions(f)).collect();
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines:\n{long:#?}"
    );
}

/// The check's own rule, on a made-up file: a function of exactly the limit passes, one
/// line more is reported, and a trait's declaration has no body to count.
#[test]
fn the_limit_counts_from_the_signature_to_the_closing_brace() {
    let body = |lines: usize| "    let x = 1;\n".repeat(lines - 2);
    let text = format!(
        "trait T {{\n    fn declared(&self);\n}}\nfn exact() {{\n{}}}\n\
         pub(crate) fn over() {{\n{}}}\n",
        body(MOST_LINES),
        body(MOST_LINES + 1)
    );
    let path = std::env::temp_dir().join(format!("house-style-{}.rs", std::process::id()));
    fs::write(&path, text).unwrap();
    let long = long_functions(&path);
    fs::remove_file(&path).ok();
    let over_at = 3 + MOST_LINES + 1;
    assert_eq!(
        long,
        [format!(
            "{}:{over_at}: {} lines",
            path.display(),
            MOST_LINES + 1
        )]
    );
}
