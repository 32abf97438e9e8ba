//! Every classical CVRPLIB instance in `data/cvrplib` (copied from the shared data; sources
//! in `data/README.md`) reads, its `.sol` validates, and re-costs to the stated cost under
//! the CVRPLIB convention.

use std::path::PathBuf;

use routeburn_cost::Metric;
use routeburn_data::{read_sol, read_vrp};

fn cvrplib_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/cvrplib")
}

#[test]
fn every_cvrplib_solution_validates_and_recosts() {
    let index = std::fs::read_to_string(cvrplib_dir().join("INDEX.tsv")).unwrap();
    let mut rows = index.lines();
    let header: Vec<&str> = rows.next().unwrap().split('\t').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (c_name, c_set, c_n, c_cap, c_sol) = (
        col("name"),
        col("set"),
        col("n"),
        col("capacity"),
        col("sol_cost"),
    );
    let mut checked = 0;
    for row in rows {
        let f: Vec<&str> = row.split('\t').collect();
        let dir = cvrplib_dir().join(f[c_set]);
        let inst = read_vrp(dir.join(format!("{}.vrp", f[c_name]))).unwrap();
        assert_eq!(inst.n().to_string(), f[c_n], "{}", f[c_name]);
        assert_eq!(inst.capacity().to_string(), f[c_cap], "{}", f[c_name]);
        let sol = read_sol(dir.join(format!("{}.sol", f[c_name]))).unwrap();
        let cost = inst
            .cost(&sol.solution, Metric::Cvrplib)
            .unwrap_or_else(|e| panic!("{}: {e}", f[c_name]));
        let stated: f64 = f[c_sol].parse().unwrap();
        assert_eq!(cost, stated, "{}", f[c_name]);
        assert_eq!(Some(cost), sol.cost, "{}", f[c_name]);
        checked += 1;
    }
    assert_eq!(checked, 87);
}

#[test]
fn explicit_lower_row_instance_reads() {
    let inst = read_vrp(cvrplib_dir().join("E/E-n13-k4.vrp")).unwrap();
    let m = inst.explicit_distances().expect("EXPLICIT");
    use routeburn_cost::Distance;
    // LOWER_ROW: the first numbers are d(1,0), d(2,0), d(2,1).
    assert_eq!(
        (m.dist(1, 0), m.dist(0, 2), m.dist(2, 1)),
        (9.0, 14.0, 21.0)
    );
    assert!(!inst.has_coords());
}
