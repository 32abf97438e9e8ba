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

use std::collections::HashSet;
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
    let mut reader = VrpReader::new(path, text.lines().count());
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let starts_numeric = line
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-' || c == '+' || c == '.');
        if starts_numeric && reader.section != Section::Header {
            reader.data_line(line, i + 1)?;
        } else if reader.keyword_line(line, i + 1)? {
            break;
        }
    }
    reader.finish()
}

/// What a `.vrp` file has said so far, read a line at a time: its header's values and its
/// sections' entries, each entry `None` until its line is read.
struct VrpReader<'p> {
    path: &'p Path,
    /// The file's line count, which bounds DIMENSION before anything is allocated for it.
    lines: usize,
    section: Section,
    /// The header keys read, each allowed once (`COMMENT` any number of times).
    seen: HashSet<String>,
    name: String,
    dimension: Option<usize>,
    capacity: Option<u32>,
    edge_weight_type: Option<String>,
    /// The format, and the line that gave it.
    edge_weight_format: Option<(String, usize)>,
    coords: Vec<Option<[f64; 2]>>,
    display: Vec<Option<[f64; 2]>>,
    demands: Vec<Option<u32>>,
    /// Each depot's node and the line that gave it.
    depots: Vec<(usize, usize)>,
    /// Whether the DEPOT_SECTION's closing `-1` has been read.
    depots_closed: bool,
    weights: Vec<f64>,
    /// The EDGE_WEIGHT_SECTION's keyword line, where a wrong count of weights is reported.
    weights_line: usize,
}

impl<'p> VrpReader<'p> {
    fn new(path: &'p Path, lines: usize) -> Self {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        VrpReader {
            path,
            lines,
            section: Section::Header,
            seen: HashSet::new(),
            name,
            dimension: None,
            capacity: None,
            edge_weight_type: None,
            edge_weight_format: None,
            coords: vec![],
            display: vec![],
            demands: vec![],
            depots: vec![],
            depots_closed: false,
            weights: vec![],
            weights_line: 0,
        }
    }

    fn err(&self, line: usize, message: String) -> DataError {
        DataError::format(self.path, line, message)
    }

    /// DIMENSION, which a section's node ids are checked against (`what` needs it).
    fn dimension_for(&self, line: usize, what: &str) -> Result<usize, DataError> {
        self.dimension
            .ok_or_else(|| self.err(line, format!("{what} before DIMENSION")))
    }

    /// A line of numbers in the current section (not the header).
    fn data_line(&mut self, line: &str, line_no: usize) -> Result<(), DataError> {
        let path = self.path;
        let err = |message: String| DataError::format(path, line_no, message);
        let fields: Vec<&str> = line.split_whitespace().collect();
        match self.section {
            Section::Coords | Section::Display => {
                let dim = self.dimension_for(line_no, "coordinates")?;
                let [id, x, y] = fields[..] else {
                    return Err(err(format!("expected `node x y`, got `{line}`")));
                };
                let id = parse_node(id, dim).map_err(err)?;
                let point = [parse_f64(x, line_no, path)?, parse_f64(y, line_no, path)?];
                let points = match self.section {
                    Section::Coords => &mut self.coords,
                    _ => &mut self.display,
                };
                if !set_once(points, dim, id, point) {
                    return Err(err(format!("node {id} is given twice")));
                }
                Ok(())
            }
            Section::Demands => {
                let dim = self.dimension_for(line_no, "DEMAND_SECTION")?;
                let [id, demand] = fields[..] else {
                    return Err(err(format!("expected `node demand`, got `{line}`")));
                };
                let id = parse_node(id, dim).map_err(err)?;
                let demand: u32 = demand
                    .parse()
                    .map_err(|_| err(format!("demand `{demand}` is not a non-negative integer")))?;
                if !set_once(&mut self.demands, dim, id, demand) {
                    return Err(err(format!("demand of node {id} is given twice")));
                }
                Ok(())
            }
            Section::Depots => self.depot_line(&fields, line_no),
            Section::EdgeWeights => {
                for field in fields {
                    self.weights.push(parse_f64(field, line_no, path)?);
                }
                Ok(())
            }
            Section::Header => unreachable!("parse_vrp reads header lines as keywords"),
        }
    }

    /// A DEPOT_SECTION line: depot ids, up to the section's closing `-1`.
    fn depot_line(&mut self, fields: &[&str], line_no: usize) -> Result<(), DataError> {
        let dim = self.dimension_for(line_no, "DEPOT_SECTION")?;
        for &field in fields {
            if self.depots_closed {
                return Err(self.err(line_no, "data after the DEPOT_SECTION's -1".into()));
            }
            if field == "-1" {
                self.depots_closed = true;
            } else {
                let depot = parse_node(field, dim).map_err(|m| self.err(line_no, m))?;
                self.depots.push((depot, line_no));
            }
        }
        Ok(())
    }

    /// A keyword line: `KEY : value`, `KEY: value` or a bare section name. Returns whether
    /// it is `EOF`, after which nothing is read (the keyword is optional in practice).
    fn keyword_line(&mut self, line: &str, line_no: usize) -> Result<bool, DataError> {
        let (key, value) = match line.split_once(':') {
            Some((k, v)) => (k.trim().to_ascii_uppercase(), Some(v.trim())),
            None => {
                let mut it = line.splitn(2, char::is_whitespace);
                let k = it.next().unwrap_or("").to_ascii_uppercase();
                (k, it.next().map(str::trim))
            }
        };
        if !self.seen.insert(key.clone()) && key != "COMMENT" {
            return Err(self.err(line_no, format!("`{key}` appears twice")));
        }
        self.section = Section::Header;
        let path = self.path;
        let err = |message: String| DataError::format(path, line_no, message);
        let value = value
            .filter(|v| !v.is_empty())
            .ok_or_else(|| err(format!("`{key}` needs a value")));
        match key.as_str() {
            "NAME" => self.name = value?.to_string(),
            "COMMENT" | "DISPLAY_DATA_TYPE" | "NODE_COORD_TYPE" | "DISTANCE" | "VEHICLES" => {}
            "TYPE" => {
                let v = value?;
                if !v.eq_ignore_ascii_case("CVRP") {
                    return Err(err(format!("TYPE is `{v}`; only CVRP is supported")));
                }
            }
            "DIMENSION" => self.dimension = Some(dimension(value?, self.lines).map_err(err)?),
            "CAPACITY" => {
                let v = value?;
                let capacity = v
                    .parse()
                    .map_err(|_| err(format!("CAPACITY `{v}` is not a non-negative integer")))?;
                self.capacity = Some(capacity);
            }
            "EDGE_WEIGHT_TYPE" => {
                let v = value?.to_ascii_uppercase();
                if v != "EUC_2D" && v != "EXPLICIT" {
                    return Err(err(format!(
                        "EDGE_WEIGHT_TYPE `{v}` is not supported; expected EUC_2D or EXPLICIT"
                    )));
                }
                self.edge_weight_type = Some(v);
            }
            "EDGE_WEIGHT_FORMAT" => {
                self.edge_weight_format = Some((value?.to_ascii_uppercase(), line_no))
            }
            "NODE_COORD_SECTION" => self.section = Section::Coords,
            "DISPLAY_DATA_SECTION" => self.section = Section::Display,
            "DEMAND_SECTION" => self.section = Section::Demands,
            "DEPOT_SECTION" => self.section = Section::Depots,
            "EDGE_WEIGHT_SECTION" => {
                self.section = Section::EdgeWeights;
                self.weights_line = line_no;
            }
            "EOF" => return Ok(true),
            other => return Err(err(format!("unknown keyword `{other}`"))),
        }
        Ok(false)
    }

    /// The instance the file describes, its depot moved to the front (customers in file
    /// order), once every line is read.
    fn finish(self) -> Result<Instance, DataError> {
        let dim = self
            .dimension
            .ok_or_else(|| self.err(0, "missing DIMENSION".into()))?;
        let capacity = self
            .capacity
            .ok_or_else(|| self.err(0, "missing CAPACITY".into()))?;
        if self.demands.is_empty() {
            return Err(self.err(0, "missing DEMAND_SECTION".into()));
        }
        let demands = complete(&self.demands, dim, "DEMAND_SECTION", self.path)?;
        let depot = match self.depots[..] {
            [] => 1,
            [(depot, _)] => depot,
            [_, (_, line), ..] => {
                let message = "more than one depot; only single-depot CVRP is supported";
                return Err(self.err(line, message.into()));
            }
        };
        if demands[depot - 1] != 0 {
            let message = format!(
                "the depot (node {depot}) has demand {}; expected 0",
                demands[depot - 1]
            );
            return Err(self.err(0, message));
        }
        let order: Vec<usize> = std::iter::once(depot - 1)
            .chain((0..dim).filter(|&i| i != depot - 1))
            .collect();
        let customer_demands: Vec<u32> = order[1..].iter().map(|&i| demands[i]).collect();
        let (node_coords, explicit) = if self.edge_weight_type.as_deref() == Some("EXPLICIT") {
            let (shown, matrix) = self.explicit_distances(dim, &order)?;
            (shown, Some(matrix))
        } else {
            if self.coords.is_empty() {
                return Err(self.err(0, "missing NODE_COORD_SECTION".into()));
            }
            let coords = complete(&self.coords, dim, "NODE_COORD_SECTION", self.path)?;
            (order.iter().map(|&i| coords[i]).collect(), None)
        };
        let name = self.name;
        Instance::from_nodes(
            name.clone(),
            node_coords,
            customer_demands,
            capacity,
            explicit,
        )
        .map_err(|source| DataError::Instance {
            path: self.path.to_path_buf(),
            name,
            source,
        })
    }

    /// An EXPLICIT file's distances in `order`, and the coordinates it shows in that order
    /// (its display data, else its node coordinates, else none).
    fn explicit_distances(
        &self,
        dim: usize,
        order: &[usize],
    ) -> Result<(Vec<[f64; 2]>, DistanceMatrix), DataError> {
        if self.weights.is_empty() {
            let message = "EDGE_WEIGHT_TYPE is EXPLICIT but EDGE_WEIGHT_SECTION is missing";
            return Err(self.err(0, message.into()));
        }
        let (format, format_line) = self
            .edge_weight_format
            .as_ref()
            .ok_or_else(|| self.err(0, "EXPLICIT weights need an EDGE_WEIGHT_FORMAT".into()))?;
        let full = expand_weights(format, dim, &self.weights).map_err(|m| {
            let format_is_wrong = m.starts_with("EDGE_WEIGHT_FORMAT");
            self.err(
                if format_is_wrong {
                    *format_line
                } else {
                    self.weights_line
                },
                m,
            )
        })?;
        let matrix = DistanceMatrix::from_fn(dim, |i, j| full[order[i] * dim + order[j]]);
        let shown = if self.display.is_empty() {
            &self.coords
        } else {
            &self.display
        };
        if shown.is_empty() {
            return Ok((vec![], matrix));
        }
        let shown = complete(shown, dim, "DISPLAY_DATA_SECTION", self.path)?;
        Ok((order.iter().map(|&i| shown[i]).collect(), matrix))
    }
}

/// DIMENSION's value, checked before anything is allocated for it: at least the depot and
/// one customer, at most [`MAX_NODES`] and at most the file's `lines`.
fn dimension(value: &str, lines: usize) -> Result<usize, String> {
    let d: usize = value
        .parse()
        .map_err(|_| format!("DIMENSION `{value}` is not a positive integer"))?;
    if d < 2 {
        return Err(format!(
            "DIMENSION is {d}; expected at least 2 (depot + one customer)"
        ));
    }
    if d > MAX_NODES {
        return Err(format!(
            "DIMENSION is {d}; routeburn reads at most {MAX_NODES} nodes"
        ));
    }
    if d > lines {
        return Err(format!(
            "DIMENSION is {d}, but the file has only {lines} lines (one per node at least)"
        ));
    }
    Ok(d)
}

/// Node `id`'s entry of a section (`values` grown to `dim` entries), set unless the file
/// gave it before: returns whether it was new.
fn set_once<T: Clone>(values: &mut Vec<Option<T>>, dim: usize, id: usize, value: T) -> bool {
    values.resize(dim, None);
    values[id - 1].replace(value).is_none()
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
    values: &[Option<T>],
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
