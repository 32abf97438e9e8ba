//! Every parser of outside input, fed byte-level mutations of valid files: any input gives
//! `Ok` or a typed error, never a panic or an abort (an allocation sized by a number from
//! the file before it is checked would abort the whole test process).

use std::io::BufReader;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use routeburn_data::{parse_sol, parse_vrp, DatasetReader, MAX_NODES};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data")
        .join(rel)
}

fn seed(rel: &str) -> Vec<u8> {
    std::fs::read(data(rel)).unwrap()
}

/// The first `lines` lines of a file.
fn head(rel: &str, lines: usize) -> Vec<u8> {
    let text = String::from_utf8(seed(rel)).unwrap();
    text.lines()
        .take(lines)
        .collect::<Vec<_>>()
        .join("\n")
        .into_bytes()
}

#[path = "common/mutate.rs"]
mod mutate;
use mutate::{config, mutated};

proptest! {
    #![proptest_config(config())]

    #[test]
    fn vrp_never_panics(bytes in mutated(vec![
        seed("cvrplib/P/P-n16-k8.vrp"),
        seed("cvrplib/E/E-n13-k4.vrp"),
        seed("cvrplib/A/A-n32-k5.vrp"),
    ])) {
        let _ = parse_vrp(&String::from_utf8_lossy(&bytes), Path::new("fuzz.vrp"));
    }

    #[test]
    fn sol_never_panics(bytes in mutated(vec![
        seed("cvrplib/P/P-n16-k8.sol"),
        seed("cvrplib/A/A-n32-k5.sol"),
    ])) {
        let _ = parse_sol(&String::from_utf8_lossy(&bytes), Path::new("fuzz.sol"));
    }

    #[test]
    fn jsonl_never_panics(bytes in mutated(vec![
        head("validation/cvrp10.jsonl", 3),
        head("validation/cvrp20.jsonl", 2),
    ])) {
        let reader = DatasetReader::new(BufReader::new(&bytes[..]), "fuzz.jsonl");
        for record in reader {
            let _ = record;
        }
    }
}

/// The one input that aborted the process before (SIGABRT while reserving 24 TB): a
/// declared size far beyond what the file holds is an error naming the line.
#[test]
fn huge_declared_dimension_is_an_error() {
    let text = String::from_utf8(seed("cvrplib/P/P-n16-k8.vrp")).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("DIMENSION"))
        .unwrap()
        + 1;
    for (dimension, expected) in [
        ("999999999999", format!("at most {MAX_NODES} nodes")),
        ("5000", "the file has only".to_string()),
    ] {
        let bad = text.replace("DIMENSION : 16", &format!("DIMENSION : {dimension}"));
        assert_ne!(bad, text);
        let err = parse_vrp(&bad, Path::new("huge.vrp"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("huge.vrp:{line}:")), "{err}");
        assert!(err.contains(&expected), "{err}");
    }
}

/// An explicit weight section is counted before a DIMENSION² matrix is built.
#[test]
fn explicit_weights_are_counted_before_the_matrix() {
    let text = String::from_utf8(seed("cvrplib/E/E-n13-k4.vrp")).unwrap();
    let bad = text.replace("DIMENSION : 13", "DIMENSION : 60");
    assert_ne!(bad, text);
    let err = parse_vrp(&bad, Path::new("e.vrp")).unwrap_err().to_string();
    assert!(
        err.contains("EDGE_WEIGHT_SECTION has") || err.contains("node"),
        "{err}"
    );
}
