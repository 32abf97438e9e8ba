//! Hand-computed costs and every kind of infeasible solution.

use routeburn_cost::*;

/// Depot at the origin, customers on a 3-4-5 triangle and a unit square.
fn coords() -> Vec<[f64; 2]> {
    vec![[0.0, 0.0], [3.0, 0.0], [3.0, 4.0], [0.0, 4.0], [1.2, 0.0]]
}

#[test]
fn single_route_costs_by_hand() {
    let c = coords();
    // 0 -> 1 -> 2 -> 3 -> 0: 3 + 4 + 3 + 4 = 14
    let s = Solution::new(vec![vec![1, 2, 3]]);
    assert_eq!(s.cost(&Euclidean(&c)), 14.0);
    // 0 -> 2 -> 0: 5 + 5
    assert_eq!(Solution::new(vec![vec![2]]).cost(&Euclidean(&c)), 10.0);
}

#[test]
fn cvrplib_rounds_each_edge() {
    // Edges of length 1.2 round to 1, edges of 2.5 round half up to 3.
    let c = vec![[0.0, 0.0], [1.2, 0.0], [0.0, 2.5]];
    let s = Solution::new(vec![vec![1], vec![2]]);
    assert_eq!(s.cost(&RoundedEuclidean(&c)), 1.0 + 1.0 + 3.0 + 3.0);
    assert!((s.cost(&Euclidean(&c)) - (2.4 + 5.0)).abs() < 1e-12);
}

#[test]
fn explicit_matrix_cost() {
    let m = DistanceMatrix::from_square(3, vec![0., 2., 7., 2., 0., 3., 7., 3., 0.]).unwrap();
    let s = Solution::new(vec![vec![1, 2]]);
    assert_eq!(s.cost(&m), 2.0 + 3.0 + 7.0);
    assert!(DistanceMatrix::from_square(3, vec![0.0; 8]).is_none());
}

#[test]
fn actions_round_trip() {
    let s = Solution::new(vec![vec![1, 2], vec![3]]);
    let a = s.to_actions(8);
    assert_eq!(a, vec![1, 2, 0, 3, 0, 0, 0, 0]);
    assert_eq!(Solution::from_actions(&a).unwrap(), s);
    // The last route may be left open.
    assert_eq!(Solution::from_actions(&[1i32, 2, 0, 3]).unwrap(), s);
    // Too short a length means no padding, never truncation.
    assert_eq!(s.to_actions(2).len(), 5);
}

#[test]
fn actions_with_empty_route_are_rejected() {
    assert_eq!(
        Solution::from_actions(&[1i64, 0, 0, 2]),
        Err(SolutionError::EmptyRoute { route: 1 })
    );
    assert_eq!(
        Solution::from_actions(&[0i64, 1]),
        Err(SolutionError::EmptyRoute { route: 0 })
    );
    assert!(matches!(
        Solution::from_actions(&[1i64, -3]),
        Err(SolutionError::IndexOutOfRange { index: -3, .. })
    ));
}

fn demands() -> Vec<u32> {
    vec![0, 4, 3, 5, 2]
}

#[test]
fn feasible_solution_validates() {
    let s = Solution::new(vec![vec![1, 2], vec![3, 4]]);
    assert_eq!(validate(&s, &demands(), 7), Ok(()));
    assert_eq!(validate_actions(&s.to_actions(10), &demands(), 7), Ok(()));
}

/// Each infeasibility, checked on both forms of the same solution.
#[test]
fn every_kind_of_infeasibility_is_caught() {
    let d = demands();
    let cases: Vec<(Vec<Vec<u32>>, SolutionError)> = vec![
        (
            vec![vec![1, 2], vec![3, 4, 1]],
            SolutionError::DuplicateVisit {
                customer: 1,
                first_route: 0,
                second_route: 1,
            },
        ),
        (
            vec![vec![1, 2], vec![4]],
            SolutionError::MissingCustomers { first: 3, count: 1 },
        ),
        (
            vec![vec![1, 5], vec![3, 4]],
            SolutionError::IndexOutOfRange {
                route: 0,
                position: 1,
                index: 5,
                n: 4,
            },
        ),
        (
            vec![vec![1, 2, 4], vec![3]],
            SolutionError::CapacityExceeded {
                route: 0,
                load: 9,
                capacity: 7,
                excess: 2,
            },
        ),
    ];
    for (routes, expected) in cases {
        let s = Solution::new(routes);
        assert_eq!(validate(&s, &d, 7), Err(expected.clone()), "{s:?}");
        assert_eq!(
            validate_actions(&s.to_actions(12), &d, 7),
            Err(expected),
            "{s:?}"
        );
    }
    // An empty route only exists in the route form, and a depot index only in the action form.
    let s = Solution::new(vec![vec![1, 2], vec![], vec![3, 4]]);
    assert_eq!(
        validate(&s, &d, 7),
        Err(SolutionError::EmptyRoute { route: 1 })
    );
    assert_eq!(
        validate_actions(&[1i64, 2, 0, 0, 3, 4], &d, 7),
        Err(SolutionError::EmptyRoute { route: 1 })
    );
    let s = Solution::new(vec![vec![1, 0, 2], vec![3, 4]]);
    assert!(matches!(
        validate(&s, &d, 7),
        Err(SolutionError::IndexOutOfRange { index: 0, .. })
    ));
}

#[test]
fn batch_costs_match_scalar_and_catch_bad_indices() {
    let c = coords();
    let flat: Vec<f32> = c
        .iter()
        .chain(c.iter())
        .flat_map(|p| [p[0] as f32, p[1] as f32])
        .collect();
    // Row 0: 1 2 3 | 4 ; row 1: 2 | padding
    let actions: Vec<i64> = vec![1, 2, 3, 0, 4, 0, 2, 0, 0, 0, 0, 0];
    let costs = batch_costs(&actions, 6, &flat, 5).unwrap();
    assert!((costs[0] - (14.0 + 2.4)).abs() < 1e-5);
    assert!((costs[1] - 10.0).abs() < 1e-5);

    let bad: Vec<i64> = vec![1, 2, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert!(matches!(
        batch_costs(&bad, 6, &flat, 5),
        Err(BatchError::Invalid { instance: 0, .. })
    ));
    assert!(matches!(
        batch_costs(&actions, 5, &flat, 5),
        Err(BatchError::Shape(_))
    ));
}

#[test]
fn batch_validation_names_the_instance() {
    let d: Vec<u32> = demands().into_iter().chain(demands()).collect();
    let ok: Vec<i32> = vec![1, 2, 0, 3, 4, 0, 1, 4, 0, 2, 0, 3];
    assert_eq!(validate_batch(&ok, 6, &d, &[7, 7], 5), Ok(()));
    assert_eq!(
        validate_batch(&ok, 6, &d, &[7, 5], 5),
        Err(BatchError::Invalid {
            instance: 1,
            error: SolutionError::CapacityExceeded {
                route: 0,
                load: 6,
                capacity: 5,
                excess: 1
            }
        })
    );
    assert!(matches!(
        validate_batch(&ok, 6, &d, &[7], 5),
        Err(BatchError::Shape(_))
    ));
}
