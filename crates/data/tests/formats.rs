//! Round trips of every file format, and clear errors (file + line) for malformed input.

use std::path::Path;

use routeburn_cost::{Metric, Solution};
use routeburn_data::*;

fn fmt_err(e: DataError) -> (usize, String) {
    match e {
        DataError::Format { line, message, .. } => (line, message),
        other => panic!("expected a format error, got {other}"),
    }
}

#[test]
fn vrp_round_trip_generated_and_explicit() {
    let mut rng = InstanceRng::new(7);
    let inst = Generator::uniform(12).sample(&mut rng, "g");
    let back = parse_vrp(&format_vrp(&inst), Path::new("g.vrp")).unwrap();
    assert_eq!(back, inst);

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/cvrplib/E");
    let e13 = read_vrp(dir.join("E-n13-k4.vrp")).unwrap();
    let back = parse_vrp(&format_vrp(&e13), Path::new("e.vrp")).unwrap();
    assert_eq!(back, e13);
}

#[test]
fn depot_not_first_is_moved_to_front() {
    let text = "NAME : t\nTYPE : CVRP\nDIMENSION : 3\nEDGE_WEIGHT_TYPE : EUC_2D\nCAPACITY : 10\n\
NODE_COORD_SECTION\n1 3 0\n2 0 0\n3 0 4\nDEMAND_SECTION\n1 5\n2 0\n3 5\nDEPOT_SECTION\n2\n-1\nEOF\n";
    let inst = parse_vrp(text, Path::new("t.vrp")).unwrap();
    assert_eq!(inst.coords(), &[[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]]);
    let s = Solution::new(vec![vec![1, 2]]);
    assert_eq!(inst.cost(&s, Metric::Cvrplib).unwrap(), 12.0);
}

#[test]
fn malformed_vrp_errors_name_the_line() {
    let good = "NAME : t\nTYPE : CVRP\nDIMENSION : 3\nEDGE_WEIGHT_TYPE : EUC_2D\nCAPACITY : 10\n\
NODE_COORD_SECTION\n1 0 0\n2 3 0\n3 0 4\nDEMAND_SECTION\n1 0\n2 5\n3 5\nDEPOT_SECTION\n1\n-1\nEOF\n";
    assert!(parse_vrp(good, Path::new("t.vrp")).is_ok());
    let cases = [
        ("2 3 0", "2 3 x", 8, "not a finite number"),
        ("2 3 0", "2 3", 8, "expected `node x y`"),
        ("2 3 0", "9 3 0", 8, "not in 1..=3"),
        ("3 5\nDEPOT", "3 11\nDEPOT", 0, "demand 11"),
        (
            "3 5\nDEPOT",
            "3 -2\nDEPOT",
            13,
            "not a non-negative integer",
        ),
        ("CAPACITY : 10", "CAPACITY : ten", 5, "CAPACITY `ten`"),
        ("EUC_2D", "GEO", 4, "not supported"),
        ("TYPE : CVRP", "TYPE : TSP", 2, "only CVRP"),
        ("DIMENSION : 3\n", "", 0, "before DIMENSION"),
        ("CAPACITY : 10\n", "", 0, "missing CAPACITY"),
        ("1 0\n2 5\n3 5\n", "1 0\n2 5\n", 0, "no entry for node 3"),
        ("NAME : t", "NAME : t\nFOO : 1", 2, "unknown keyword"),
    ];
    for (from, to, line, msg) in cases {
        let text = good.replacen(from, to, 1);
        let e = parse_vrp(&text, Path::new("t.vrp")).unwrap_err();
        let shown = e.to_string();
        assert!(shown.starts_with("t.vrp"), "{shown}");
        let (got_line, message) = fmt_err_or_instance(e);
        assert!(message.contains(msg), "{from} -> {to}: {message}");
        if line > 0 {
            assert_eq!(got_line, line, "{from} -> {to}: {message}");
        }
    }
}

fn fmt_err_or_instance(e: DataError) -> (usize, String) {
    match e {
        DataError::Instance { source, .. } => (0, source.to_string()),
        other => fmt_err(other),
    }
}

#[test]
fn sol_round_trip_and_errors() {
    let s = Solution::new(vec![vec![3, 1], vec![2]]);
    let text = format_sol(&s, 42.0);
    assert_eq!(text, "Route #1: 3 1\nRoute #2: 2\nCost 42\n");
    let back = parse_sol(&text, Path::new("x.sol")).unwrap();
    assert_eq!(
        back,
        SolFile {
            solution: s,
            cost: Some(42.0)
        }
    );

    let bad = [
        ("Route #1: 3 x\nCost 4\n", 1, "customer `x`"),
        ("Route #1: 3\nCost four\n", 2, "cost `four`"),
        ("Route #1: 3\nhello\n", 2, "expected a `Route"),
        ("Route 1 3\n", 1, "expected `Route #k:"),
        ("Cost 3\n", 0, "no `Route"),
    ];
    for (text, line, msg) in bad {
        let (l, m) = fmt_err(parse_sol(text, Path::new("x.sol")).unwrap_err());
        assert_eq!(l, line, "{text}");
        assert!(m.contains(msg), "{text}: {m}");
    }
}

#[test]
fn jsonl_round_trip_and_bad_line_number() {
    let dir = std::env::temp_dir().join(format!("routeburn-jsonl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = InstanceRng::new(3);
    let records: Vec<Record> = Generator::uniform(5)
        .sample_many(&mut rng, 4, "r")
        .into_iter()
        .map(Record::new)
        .collect();
    let path = dir.join("a.jsonl");
    write_jsonl(&path, &records).unwrap();
    assert_eq!(read_jsonl(&path).unwrap(), records);

    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(
        "\n{\"depot\": [0, 0], \"customers\": [[1, 1]], \"demands\": [30], \"capacity\": 20}\n",
    );
    std::fs::write(&path, &text).unwrap();
    let e = read_jsonl(&path).unwrap_err();
    let (line, msg) = fmt_err(e);
    assert_eq!(line, 6);
    assert!(msg.contains("demand 30"), "{msg}");

    std::fs::write(&path, "{\"depot\": [0, 0], \"customers\": [[1, 1]]\n").unwrap();
    let (line, msg) = fmt_err(read_jsonl(&path).unwrap_err());
    assert_eq!(line, 1);
    assert!(msg.contains("bad record"), "{msg}");

    // Reference routes are validated on read.
    std::fs::write(&path, "{\"depot\": [0, 0], \"customers\": [[1, 1], [2, 2]], \"demands\": [1, 1], \"capacity\": 5, \"reference_routes\": [[1]]}\n").unwrap();
    let (_, msg) = fmt_err(read_jsonl(&path).unwrap_err());
    assert!(msg.contains("never visited"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}
