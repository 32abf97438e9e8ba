//! Pictures: route plots of a solution, and the training curves of a run (SVG, plotters).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use routeburn_cost::Solution;
use routeburn_data::Instance;

use crate::error::TrainError;

fn plot_err(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Failed(format!("{}: could not draw: {e}", path.display()))
}

/// Draws the depot (black square), the customers (grey dots) and each route in its own
/// colour.
pub(crate) fn plot_routes(
    instance: &Instance,
    solution: &Solution,
    title: &str,
    path: &Path,
) -> Result<(), TrainError> {
    let coords = instance.coords();
    if coords.is_empty() {
        return Err(TrainError::Input(format!(
            "{}: no coordinates to plot",
            instance.name()
        )));
    }
    let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
    for p in coords {
        for k in 0..2 {
            lo[k] = lo[k].min(p[k]);
            hi[k] = hi[k].max(p[k]);
        }
    }
    let pad = 0.05 * (hi[0] - lo[0]).max(hi[1] - lo[1]).max(1e-9);
    let root = SVGBackend::new(path, (800, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(40)
        .build_cartesian_2d(lo[0] - pad..hi[0] + pad, lo[1] - pad..hi[1] + pad)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .disable_mesh()
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (k, route) in solution.routes.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let mut points = vec![(coords[0][0], coords[0][1])];
        points.extend(
            route
                .iter()
                .map(|&c| (coords[c as usize][0], coords[c as usize][1])),
        );
        points.push((coords[0][0], coords[0][1]));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?;
    }
    chart
        .draw_series(
            coords[1..]
                .iter()
                .map(|p| Circle::new((p[0], p[1]), 3, BLACK.mix(0.6).filled())),
        )
        .map_err(|e| plot_err(path, e))?;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [
                (coords[0][0] - pad * 0.3, coords[0][1] - pad * 0.3),
                (coords[0][0] + pad * 0.3, coords[0][1] + pad * 0.3),
            ],
            BLACK.filled(),
        )))
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))
}

/// A run's `metrics.csv` as columns.
pub(crate) struct Curves {
    pub epoch: Vec<f64>,
    pub elapsed: Vec<f64>,
    pub train_cost: Vec<f64>,
    pub baseline_cost: Vec<f64>,
    pub val_cost: Vec<f64>,
    pub val_gap: Vec<Option<f64>>,
}

pub(crate) fn read_curves(metrics: &Path) -> Result<Curves, TrainError> {
    let text = std::fs::read_to_string(metrics).map_err(|e| TrainError::io(metrics, e))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| TrainError::Input(format!("{}: empty metrics file", metrics.display())))?
        .split(',')
        .collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| TrainError::Input(format!("{}: no `{name}` column", metrics.display())))
    };
    let (ce, cs, ct, cb, cv, cg) = (
        col("epoch")?,
        col("elapsed_seconds")?,
        col("train_cost")?,
        col("baseline_cost")?,
        col("val_cost")?,
        col("val_gap")?,
    );
    let mut c = Curves {
        epoch: vec![],
        elapsed: vec![],
        train_cost: vec![],
        baseline_cost: vec![],
        val_cost: vec![],
        val_gap: vec![],
    };
    for (i, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let num = |k: usize| -> Result<f64, TrainError> {
            f.get(k).and_then(|v| v.parse::<f64>().ok()).ok_or_else(|| {
                TrainError::Input(format!(
                    "{}:{}: bad value in column {}",
                    metrics.display(),
                    i + 2,
                    header[k]
                ))
            })
        };
        c.epoch.push(num(ce)?);
        c.elapsed.push(num(cs)?);
        c.train_cost.push(num(ct)?);
        c.baseline_cost.push(num(cb)?);
        c.val_cost.push(num(cv)?);
        c.val_gap.push(f.get(cg).and_then(|v| v.parse().ok()));
    }
    if c.epoch.is_empty() {
        return Err(TrainError::Input(format!(
            "{}: no epochs yet",
            metrics.display()
        )));
    }
    Ok(c)
}

fn range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    let pad = ((hi - lo) * 0.05).max(1e-6);
    lo - pad..hi + pad
}

/// Training curves: costs against epochs, validation gap against epochs, and validation
/// cost against wall time.
pub(crate) fn plot_curves(curves: &Curves, title: &str, path: &Path) -> Result<(), TrainError> {
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let root = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| plot_err(path, e))?;
    let (top, bottom) = root.split_vertically(450);
    let (gap_area, time_area) = bottom.split_horizontally(600);
    draw_costs(&top, curves, path)?;
    let gaps: Vec<(f64, f64)> = curves
        .epoch
        .iter()
        .zip(&curves.val_gap)
        .filter_map(|(&e, g)| g.map(|g| (e, g)))
        .collect();
    draw_line(&gap_area, ("epoch", "validation gap (%)"), gaps, path)?;
    let by_time: Vec<(f64, f64)> = curves
        .elapsed
        .iter()
        .copied()
        .zip(curves.val_cost.iter().copied())
        .collect();
    draw_line(
        &time_area,
        ("wall time (s)", "validation cost"),
        by_time,
        path,
    )?;
    root.present().map_err(|e| plot_err(path, e))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// Train, baseline and validation cost per epoch, with a legend.
fn draw_costs(area: &Area, curves: &Curves, path: &Path) -> Result<(), TrainError> {
    let costs = range(
        curves
            .train_cost
            .iter()
            .chain(&curves.baseline_cost)
            .chain(&curves.val_cost)
            .copied(),
    );
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(range(curves.epoch.iter().copied()), costs)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("mean cost")
        .draw()
        .map_err(|e| plot_err(path, e))?;
    for (name, ys, color) in [
        ("train (sampled)", &curves.train_cost, BLUE),
        ("baseline", &curves.baseline_cost, GREEN),
        ("validation (greedy)", &curves.val_cost, RED),
    ] {
        let pts: Vec<(f64, f64)> = curves
            .epoch
            .iter()
            .copied()
            .zip(ys.iter().copied())
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| plot_err(path, e))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))
}

/// One red line of `pts` with axes named `(x, y)`.
fn draw_line(
    area: &Area,
    (x_desc, y_desc): (&str, &str),
    pts: Vec<(f64, f64)>,
    path: &Path,
) -> Result<(), TrainError> {
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(
            range(pts.iter().map(|p| p.0)),
            range(pts.iter().map(|p| p.1)),
        )
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    chart
        .draw_series(LineSeries::new(pts, RED.stroke_width(2)))
        .map_err(|e| plot_err(path, e))?;
    Ok(())
}
