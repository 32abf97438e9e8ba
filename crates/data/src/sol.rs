//! CVRPLIB `.sol` solution files: `Route #k: c1 c2 ...` lines (customers numbered 1..n in
//! the `.vrp`'s node order after the depot) and a `Cost C` line.

use std::fmt::Write as _;
use std::path::Path;

use routeburn_cost::Solution;

use crate::error::DataError;

/// A parsed `.sol` file: the routes and the cost it states, if any.
#[derive(Debug, Clone, PartialEq)]
pub struct SolFile {
    pub solution: Solution,
    pub cost: Option<f64>,
}

pub fn read_sol(path: impl AsRef<Path>) -> Result<SolFile, DataError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
    parse_sol(&text, path)
}

/// Parses `.sol` text; `path` is only used in error messages. Route numbers are not
/// checked, since solvers number them differently; empty routes are kept, so that the
/// validator reports them.
pub fn parse_sol(text: &str, path: &Path) -> Result<SolFile, DataError> {
    let mut routes = vec![];
    let mut cost = None;
    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("route") {
            let (_, customers) = line.split_once(':').ok_or_else(|| {
                DataError::format(
                    path,
                    line_no,
                    format!("expected `Route #k: customers...`, got `{line}`"),
                )
            })?;
            let route = customers
                .split_whitespace()
                .map(|c| {
                    c.parse::<u32>().map_err(|_| {
                        DataError::format(
                            path,
                            line_no,
                            format!("customer `{c}` is not a non-negative integer"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            routes.push(route);
        } else if lower.starts_with("cost") {
            if cost.is_some() {
                return Err(DataError::format(path, line_no, "a second `Cost` line"));
            }
            let v = line[4..].trim();
            cost = Some(
                v.parse::<f64>()
                    .ok()
                    .filter(|c| c.is_finite())
                    .ok_or_else(|| {
                        DataError::format(
                            path,
                            line_no,
                            format!("cost `{v}` is not a finite number"),
                        )
                    })?,
            );
        } else {
            return Err(DataError::format(
                path,
                line_no,
                format!("expected a `Route #k: ...` or `Cost C` line, got `{line}`"),
            ));
        }
    }
    if routes.is_empty() {
        return Err(DataError::format(path, 0, "no `Route #k:` lines"));
    }
    Ok(SolFile {
        solution: Solution::new(routes),
        cost,
    })
}

/// `.sol` text for a solution, with `Cost` written as an integer when it is one.
pub fn format_sol(solution: &Solution, cost: f64) -> String {
    let mut s = String::new();
    for (k, r) in solution.routes.iter().enumerate() {
        let customers: Vec<String> = r.iter().map(u32::to_string).collect();
        let _ = writeln!(s, "Route #{}: {}", k + 1, customers.join(" "));
    }
    if cost.fract() == 0.0 {
        let _ = writeln!(s, "Cost {}", cost as i64);
    } else {
        let _ = writeln!(s, "Cost {cost}");
    }
    s
}

pub fn write_sol(solution: &Solution, cost: f64, path: impl AsRef<Path>) -> Result<(), DataError> {
    let path = path.as_ref();
    std::fs::write(path, format_sol(solution, cost)).map_err(|e| DataError::io(path, e))
}
