//! JSON Lines datasets: one instance per line, with an optional reference cost and tour.
//!
//! ```text
//! {"name": "cvrp10_000", "depot": [x, y], "customers": [[x, y], ...], "demands": [d, ...],
//!  "capacity": 20, "reference_cost": 4.51, "reference_routes": [[1, 4], [2, 3]]}
//! ```
//! This is the format of `shared/data/validation/*.jsonl`, used for validation and test
//! sets and for supervised labels. `reference_cost`/`reference_routes` may be absent.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use routeburn_cost::Solution;
use serde::{Deserialize, Serialize};

use crate::error::DataError;
use crate::instance::Instance;

/// One dataset entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub instance: Instance,
    /// Cost of a good known solution (exact Euclidean), to measure gaps against.
    pub reference_cost: Option<f64>,
    /// The known solution itself, validated against the instance when read.
    pub reference_routes: Option<Solution>,
}

impl Record {
    pub fn new(instance: Instance) -> Self {
        Self {
            instance,
            reference_cost: None,
            reference_routes: None,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Line {
    #[serde(default)]
    name: Option<String>,
    depot: [f64; 2],
    customers: Vec<[f64; 2]>,
    demands: Vec<u32>,
    capacity: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference_cost: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference_routes: Option<Vec<Vec<u32>>>,
}

/// Streams records from a JSONL file; each error names the file and line.
pub struct DatasetReader<R> {
    path: PathBuf,
    lines: std::io::Lines<R>,
    line_no: usize,
}

impl DatasetReader<BufReader<File>> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| DataError::io(path, e))?;
        Ok(Self::new(BufReader::new(file), path))
    }
}

impl<R: BufRead> DatasetReader<R> {
    pub fn new(reader: R, path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            lines: reader.lines(),
            line_no: 0,
        }
    }

    fn parse(&self, text: &str) -> Result<Record, DataError> {
        let fail = |m: String| DataError::format(&self.path, self.line_no, m);
        let line: Line =
            serde_json::from_str(text).map_err(|e| fail(format!("bad record: {e}")))?;
        let name = line
            .name
            .unwrap_or_else(|| format!("line{:06}", self.line_no));
        let instance = Instance::new(
            name,
            line.depot,
            line.customers,
            line.demands,
            line.capacity,
        )
        .map_err(|e| fail(e.to_string()))?;
        if let Some(c) = line.reference_cost {
            if !c.is_finite() || c < 0.0 {
                return Err(fail(format!(
                    "reference_cost {c} is not a finite, non-negative number"
                )));
            }
        }
        let reference_routes = match line.reference_routes {
            Some(routes) => {
                let s = Solution::new(routes);
                instance
                    .validate(&s)
                    .map_err(|e| fail(format!("reference_routes are infeasible: {e}")))?;
                Some(s)
            }
            None => None,
        };
        Ok(Record {
            instance,
            reference_cost: line.reference_cost,
            reference_routes,
        })
    }
}

impl<R: BufRead> Iterator for DatasetReader<R> {
    type Item = Result<Record, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let line = self.lines.next()?;
            self.line_no += 1;
            let text = match line {
                Ok(t) => t,
                Err(e) => return Some(Err(DataError::io(&self.path, e))),
            };
            if text.trim().is_empty() {
                continue;
            }
            return Some(self.parse(&text));
        }
    }
}

/// Reads a whole JSONL dataset.
pub fn read_jsonl(path: impl AsRef<Path>) -> Result<Vec<Record>, DataError> {
    DatasetReader::open(path)?.collect()
}

/// Writes records as JSON Lines. Floats are written in shortest round-trip form, so the
/// same records always give byte-identical files.
pub fn write_jsonl<'a>(
    path: impl AsRef<Path>,
    records: impl IntoIterator<Item = &'a Record>,
) -> Result<(), DataError> {
    let path = path.as_ref();
    let io = |e| DataError::io(path, e);
    let mut w = BufWriter::new(File::create(path).map_err(io)?);
    for r in records {
        let inst = &r.instance;
        let line = Line {
            name: Some(inst.name().to_string()),
            depot: inst.coords()[0],
            customers: inst.coords()[1..].to_vec(),
            demands: inst.node_demands()[1..].to_vec(),
            capacity: inst.capacity(),
            reference_cost: r.reference_cost,
            reference_routes: r.reference_routes.as_ref().map(|s| s.routes.clone()),
        };
        serde_json::to_writer(&mut w, &line).map_err(|e| io(e.into()))?;
        w.write_all(b"\n").map_err(io)?;
    }
    w.flush().map_err(io)
}
