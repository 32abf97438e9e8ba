//! CVRPLIB / TSPLIB `.vrp` instance files.
//!
//! Supported: `NAME`, `TYPE` (CVRP), `DIMENSION`, `CAPACITY`, `EDGE_WEIGHT_TYPE` (`EUC_2D`,
//! `EXPLICIT`), `EDGE_WEIGHT_FORMAT` (`FULL_MATRIX`, `LOWER_ROW`, `LOWER_DIAG_ROW`,
//! `UPPER_ROW`, `UPPER_DIAG_ROW`), `NODE_COORD_SECTION` (integer or float coordinates),
//! `DISPLAY_DATA_SECTION`, `DEMAND_SECTION`, `DEPOT_SECTION` and `EOF`. Other header keys
//! (`COMMENT`, `DISPLAY_DATA_TYPE`, ...) are ignored.
//!
//! A depot other than node 1 is moved to the front; customers keep their file order, so
//! customer `k` of a `.sol` file is the `k`-th non-depot node of the `.vrp`.
//!
//! Sizes read from the file are checked before anything is allocated for them: DIMENSION
//! is at most [`MAX_NODES`] and at most the number of lines the file has (every node needs
//! a coordinate or weight line and a demand line), and an explicit weight section must
//! hold its count of numbers before the matrix is built.

use std::fmt::Write as _;
use std::path::Path;

use routeburn_cost::DistanceMatrix;

use crate::error::DataError;
use crate::instance::Instance;

pub fn read_vrp(path: impl AsRef<Path>) -> Result<Instance, DataError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
    parse_vrp(&text, path)
}

/// The most nodes (depot included) a `.vrp` may declare: CVRPLIB's largest instances
/// (Arnold, Gendreau and Sörensen's Belgium set) have about 30,000.
pub const MAX_NODES: usize = 100_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Section {
    Header,
    Coords,
    Display,
    Demands,
    Depots,
    EdgeWeights,
}

/// Parses `.vrp` text; `path` is only used in error messages.
pub fn parse_vrp(text: &str, path: &Path) -> Result<Instance, DataError> {
    let err = |line: usize, msg: String| DataError::format(path, line, msg);
    let mut name = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut dimension: Option<usize> = None;
    let mut capacity: Option<u32> = None;
    let mut weight_type: Option<(String, usize)> = None;
    let mut weight_format: Option<(String, usize)> = None;
    let mut coords: Vec<Option<[f64; 2]>> = vec![];
    let mut display: Vec<Option<[f64; 2]>> = vec![];
    let mut demands: Vec<Option<u32>> = vec![];
    let mut depots: Vec<(usize, usize)> = vec![];
    let mut depots_closed = false;
    let mut weights: Vec<f64> = vec![];
    let mut weights_line = 0;
    let mut seen = std::collections::HashSet::new();
    let mut section = Section::Header;
    let mut saw_eof = false;

    let lines = text.lines().count();
    let need_dim = |dimension: Option<usize>, line: usize, what: &str| {
        dimension.ok_or_else(|| err(line, format!("{what} before DIMENSION")))
    };

    for (i, raw) in text.lines().enumerate() {
        let line_no = i + 1;
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let starts_numeric = line
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
        if starts_numeric && section != Section::Header {
            let fields: Vec<&str> = line.split_whitespace().collect();
            match section {
                Section::Coords | Section::Display => {
                    let dim = need_dim(dimension, line_no, "coordinates")?;
                    let [id, x, y] = fields[..] else {
                        return Err(err(line_no, format!("expected `node x y`, got `{line}`")));
                    };
                    let id = parse_node(id, dim).map_err(|m| err(line_no, m))?;
                    let p = [parse_f64(x, line_no, path)?, parse_f64(y, line_no, path)?];
                    let target = if section == Section::Coords {
                        &mut coords
                    } else {
                        &mut display
                    };
                    target.resize(dim, None);
                    if target[id - 1].replace(p).is_some() {
                        return Err(err(line_no, format!("node {id} is given twice")));
                    }
                }
                Section::Demands => {
                    let dim = need_dim(dimension, line_no, "DEMAND_SECTION")?;
                    let [id, d] = fields[..] else {
                        return Err(err(
                            line_no,
                            format!("expected `node demand`, got `{line}`"),
                        ));
                    };
                    let id = parse_node(id, dim).map_err(|m| err(line_no, m))?;
                    let d: u32 = d.parse().map_err(|_| {
                        err(
                            line_no,
                            format!("demand `{d}` is not a non-negative integer"),
                        )
                    })?;
                    demands.resize(dim, None);
                    if demands[id - 1].replace(d).is_some() {
                        return Err(err(line_no, format!("demand of node {id} is given twice")));
                    }
                }
                Section::Depots => {
                    let dim = need_dim(dimension, line_no, "DEPOT_SECTION")?;
                    for f in fields {
                        if depots_closed {
                            return Err(err(line_no, "data after the DEPOT_SECTION's -1".into()));
                        }
                        if f == "-1" {
                            depots_closed = true;
                        } else {
                            depots
                                .push((parse_node(f, dim).map_err(|m| err(line_no, m))?, line_no));
                        }
                    }
                }
                Section::EdgeWeights => {
                    for f in fields {
                        weights.push(parse_f64(f, line_no, path)?);
                    }
                }
                Section::Header => unreachable!(),
            }
            continue;
        }
        // A keyword: `KEY : value`, `KEY: value` or a bare section name.
        let (key, value) = match line.split_once(':') {
            Some((k, v)) => (k.trim().to_ascii_uppercase(), Some(v.trim())),
            None => {
                let mut it = line.splitn(2, char::is_whitespace);
                let k = it.next().unwrap_or("").to_ascii_uppercase();
                (k, it.next().map(str::trim).filter(|v| !v.is_empty()))
            }
        };
        if !seen.insert(key.clone()) && key != "COMMENT" {
            return Err(err(line_no, format!("`{key}` appears twice")));
        }
        section = Section::Header;
        let value = value.filter(|v| !v.is_empty());
        let missing = || err(line_no, format!("`{key}` needs a value"));
        match key.as_str() {
            "NAME" => name = value.ok_or_else(missing)?.to_string(),
            "COMMENT" | "DISPLAY_DATA_TYPE" | "NODE_COORD_TYPE" | "DISTANCE" | "VEHICLES" => {}
            "TYPE" => {
                let v = value.ok_or_else(missing)?;
                if !v.eq_ignore_ascii_case("CVRP") {
                    return Err(err(
                        line_no,
                        format!("TYPE is `{v}`; only CVRP is supported"),
                    ));
                }
            }
            "DIMENSION" => {
                let v = value.ok_or_else(missing)?;
                let d: usize = v.parse().map_err(|_| {
                    err(
                        line_no,
                        format!("DIMENSION `{v}` is not a positive integer"),
                    )
                })?;
                if d < 2 {
                    return Err(err(
                        line_no,
                        format!("DIMENSION is {d}; expected at least 2 (depot + one customer)"),
                    ));
                }
                if d > MAX_NODES {
                    return Err(err(
                        line_no,
                        format!("DIMENSION is {d}; routeburn reads at most {MAX_NODES} nodes"),
                    ));
                }
                if d > lines {
                    return Err(err(
                        line_no,
                        format!("DIMENSION is {d}, but the file has only {lines} lines (one per node at least)"),
                    ));
                }
                dimension = Some(d);
            }
            "CAPACITY" => {
                let v = value.ok_or_else(missing)?;
                capacity = Some(v.parse().map_err(|_| {
                    err(
                        line_no,
                        format!("CAPACITY `{v}` is not a non-negative integer"),
                    )
                })?);
            }
            "EDGE_WEIGHT_TYPE" => {
                let v = value.ok_or_else(missing)?.to_ascii_uppercase();
                if v != "EUC_2D" && v != "EXPLICIT" {
                    return Err(err(
                        line_no,
                        format!(
                            "EDGE_WEIGHT_TYPE `{v}` is not supported; expected EUC_2D or EXPLICIT"
                        ),
                    ));
                }
                weight_type = Some((v, line_no));
            }
            "EDGE_WEIGHT_FORMAT" => {
                weight_format = Some((value.ok_or_else(missing)?.to_ascii_uppercase(), line_no))
            }
            "NODE_COORD_SECTION" => section = Section::Coords,
            "DISPLAY_DATA_SECTION" => section = Section::Display,
            "DEMAND_SECTION" => section = Section::Demands,
            "DEPOT_SECTION" => section = Section::Depots,
            "EDGE_WEIGHT_SECTION" => {
                section = Section::EdgeWeights;
                weights_line = line_no;
            }
            "EOF" => {
                saw_eof = true;
                break;
            }
            other => return Err(err(line_no, format!("unknown keyword `{other}`"))),
        }
    }
    let _ = saw_eof; // EOF is optional in practice.

    let dim = dimension.ok_or_else(|| err(0, "missing DIMENSION".into()))?;
    let capacity = capacity.ok_or_else(|| err(0, "missing CAPACITY".into()))?;
    let (weight_type, _) = weight_type.unwrap_or_else(|| ("EUC_2D".into(), 0));
    if demands.is_empty() {
        return Err(err(0, "missing DEMAND_SECTION".into()));
    }
    let demands = complete(demands, dim, "DEMAND_SECTION", path)?;
    let depot = match depots[..] {
        [] => 1,
        [(d, _)] => d,
        [_, (_, line), ..] => {
            return Err(err(
                line,
                "more than one depot; only single-depot CVRP is supported".into(),
            ))
        }
    };
    if demands[depot - 1] != 0 {
        return Err(err(
            0,
            format!(
                "the depot (node {depot}) has demand {}; expected 0",
                demands[depot - 1]
            ),
        ));
    }
    // New order: depot first, then the other nodes in file order.
    let order: Vec<usize> = std::iter::once(depot - 1)
        .chain((0..dim).filter(|&i| i != depot - 1))
        .collect();
    let customer_demands: Vec<u32> = order[1..].iter().map(|&i| demands[i]).collect();

    let (node_coords, explicit) = if weight_type == "EXPLICIT" {
        if weights.is_empty() {
            return Err(err(
                0,
                "EDGE_WEIGHT_TYPE is EXPLICIT but EDGE_WEIGHT_SECTION is missing".into(),
            ));
        }
        let (format, format_line) = weight_format
            .ok_or_else(|| err(0, "EXPLICIT weights need an EDGE_WEIGHT_FORMAT".into()))?;
        let full = expand_weights(&format, dim, &weights).map_err(|m| {
            err(
                if m.starts_with("EDGE_WEIGHT_FORMAT") {
                    format_line
                } else {
                    weights_line
                },
                m,
            )
        })?;
        let matrix = DistanceMatrix::from_fn(dim, |i, j| full[order[i] * dim + order[j]]);
        let shown = if display.is_empty() { coords } else { display };
        let shown = if shown.is_empty() {
            vec![]
        } else {
            let c = complete(shown, dim, "DISPLAY_DATA_SECTION", path)?;
            order.iter().map(|&i| c[i]).collect()
        };
        (shown, Some(matrix))
    } else {
        if coords.is_empty() {
            return Err(err(0, "missing NODE_COORD_SECTION".into()));
        }
        let c = complete(coords, dim, "NODE_COORD_SECTION", path)?;
        (order.iter().map(|&i| c[i]).collect(), None)
    };
    Instance::from_nodes(
        name.clone(),
        node_coords,
        customer_demands,
        capacity,
        explicit,
    )
    .map_err(|source| DataError::Instance {
        path: path.to_path_buf(),
        name,
        source,
    })
}

fn parse_node(s: &str, dim: usize) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(id) if (1..=dim).contains(&id) => Ok(id),
        _ => Err(format!("node id `{s}` is not in 1..={dim} (DIMENSION)")),
    }
}

fn parse_f64(s: &str, line: usize, path: &Path) -> Result<f64, DataError> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or_else(|| DataError::format(path, line, format!("`{s}` is not a finite number")))
}

fn complete<T: Copy>(
    values: Vec<Option<T>>,
    dim: usize,
    section: &str,
    path: &Path,
) -> Result<Vec<T>, DataError> {
    let mut out = Vec::with_capacity(dim);
    for (i, v) in values.iter().enumerate() {
        out.push(v.ok_or_else(|| {
            DataError::format(
                path,
                0,
                format!("{section} has no entry for node {}", i + 1),
            )
        })?);
    }
    if out.len() < dim {
        return Err(DataError::format(
            path,
            0,
            format!("{section} has {} entries; DIMENSION is {dim}", out.len()),
        ));
    }
    Ok(out)
}

/// Expands an explicit weight section into a full row-major `[dim, dim]` matrix.
fn expand_weights(format: &str, dim: usize, w: &[f64]) -> Result<Vec<f64>, String> {
    // Count before building anything of size dim²: the numbers read bound the matrix.
    let needed = match format {
        "FULL_MATRIX" => dim * dim,
        "UPPER_ROW" | "LOWER_ROW" => dim * (dim - 1) / 2,
        "UPPER_DIAG_ROW" | "LOWER_DIAG_ROW" => dim * (dim + 1) / 2,
        _ => w.len(),
    };
    if needed != w.len() {
        return Err(format!(
            "EDGE_WEIGHT_SECTION has {} numbers; {format} with DIMENSION {dim} needs {needed}",
            w.len()
        ));
    }
    let pairs: Vec<(usize, usize)> = match format {
        "FULL_MATRIX" => (0..dim).flat_map(|i| (0..dim).map(move |j| (i, j))).collect(),
        "UPPER_ROW" => (0..dim).flat_map(|i| (i + 1..dim).map(move |j| (i, j))).collect(),
        "LOWER_ROW" => (0..dim).flat_map(|i| (0..i).map(move |j| (i, j))).collect(),
        "UPPER_DIAG_ROW" => (0..dim).flat_map(|i| (i..dim).map(move |j| (i, j))).collect(),
        "LOWER_DIAG_ROW" => (0..dim).flat_map(|i| (0..=i).map(move |j| (i, j))).collect(),
        other => {
            return Err(format!(
                "EDGE_WEIGHT_FORMAT `{other}` is not supported; expected FULL_MATRIX, LOWER_ROW, LOWER_DIAG_ROW, UPPER_ROW or UPPER_DIAG_ROW"
            ))
        }
    };
    if pairs.len() != w.len() {
        return Err(format!(
            "EDGE_WEIGHT_SECTION has {} numbers; {format} with DIMENSION {dim} needs {}",
            w.len(),
            pairs.len()
        ));
    }
    let mut full = vec![0.0; dim * dim];
    for (&(i, j), &v) in pairs.iter().zip(w) {
        full[i * dim + j] = v;
        full[j * dim + i] = v;
    }
    Ok(full)
}

/// The `.vrp` text of an instance: EUC_2D with node coordinates, or EXPLICIT FULL_MATRIX
/// (plus display coordinates when it has them). Floats are written in Rust's shortest
/// round-trip form, so reading the file back gives the same instance.
pub fn format_vrp(instance: &Instance) -> String {
    let nodes = instance.n() + 1;
    let mut s = String::new();
    let _ = writeln!(s, "NAME : {}", instance.name());
    let _ = writeln!(s, "TYPE : CVRP");
    let _ = writeln!(s, "DIMENSION : {nodes}");
    match instance.explicit_distances() {
        Some(_) => {
            let _ = writeln!(s, "EDGE_WEIGHT_TYPE : EXPLICIT");
            let _ = writeln!(s, "EDGE_WEIGHT_FORMAT : FULL_MATRIX");
        }
        None => {
            let _ = writeln!(s, "EDGE_WEIGHT_TYPE : EUC_2D");
        }
    }
    let _ = writeln!(s, "CAPACITY : {}", instance.capacity());
    if let Some(m) = instance.explicit_distances() {
        s.push_str("EDGE_WEIGHT_SECTION\n");
        for i in 0..nodes {
            let row: Vec<String> = m.row(i).iter().map(f64::to_string).collect();
            let _ = writeln!(s, "{}", row.join(" "));
        }
        if instance.has_coords() {
            s.push_str("DISPLAY_DATA_SECTION\n");
        }
    } else {
        s.push_str("NODE_COORD_SECTION\n");
    }
    for (i, p) in instance.coords().iter().enumerate() {
        let _ = writeln!(s, "{} {} {}", i + 1, p[0], p[1]);
    }
    s.push_str("DEMAND_SECTION\n");
    for (i, d) in instance.node_demands().iter().enumerate() {
        let _ = writeln!(s, "{} {d}", i + 1);
    }
    s.push_str("DEPOT_SECTION\n1\n-1\nEOF\n");
    s
}

pub fn write_vrp(instance: &Instance, path: impl AsRef<Path>) -> Result<(), DataError> {
    let path = path.as_ref();
    std::fs::write(path, format_vrp(instance)).map_err(|e| DataError::io(path, e))
}
