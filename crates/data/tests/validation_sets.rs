//! The validation sets' reference routes validate and re-cost to their reference costs.

use std::path::PathBuf;

use routeburn_cost::Metric;
use routeburn_data::read_jsonl;

#[test]
fn reference_routes_recost_to_reference_costs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/validation");
    for (n, mean_ref) in [(10, 4.560), (20, 6.199), (50, 10.414), (100, 15.609)] {
        let records = read_jsonl(dir.join(format!("cvrp{n}.jsonl"))).unwrap();
        assert_eq!(records.len(), 128);
        let mut sum = 0.0;
        for r in &records {
            assert_eq!(r.instance.n(), n);
            let routes = r.reference_routes.as_ref().unwrap();
            let cost = r.instance.cost(routes, Metric::Exact).unwrap();
            let reference = r.reference_cost.unwrap();
            assert!(
                (cost - reference).abs() < 1e-6 * reference.max(1.0),
                "{}: {cost} vs {reference}",
                r.instance.name()
            );
            sum += reference;
        }
        assert!((sum / 128.0 - mean_ref).abs() < 5e-4, "n={n}");
    }
}
