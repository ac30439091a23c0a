//! A drafter job's `plot.png`: the drafter loss per step (its axis fitted to the steps after
//! the first ten, whose loss starts an order of magnitude higher), the accuracy of each
//! draft position per step, and the mean acceptance length of the measurements.

use super::metrics::DrafterStepMetrics;
use crate::error::RlError;
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (1000, 900);

/// Draws the plot into a temporary file renamed over `path`.
pub(super) fn draw(path: &Path, title: &str, steps: &[DrafterStepMetrics]) -> Result<(), RlError> {
    let tmp = path.with_extension("tmp.png");
    draw_to(&tmp, title, steps)
        .map_err(|e| RlError::failed(format!("drawing {}: {e}", path.display())))?;
    std::fs::rename(&tmp, path).map_err(RlError::io(format!("writing {}", path.display())))
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_to(path: &Path, title: &str, steps: &[DrafterStepMetrics]) -> Result<(), String> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| e.to_string())?;
    let panels = root.split_evenly((3, 1));
    let last = steps.iter().map(|m| m.step).max().unwrap_or(1).max(1);
    let xs = 0f64..f64::from(last) + 1.0;
    loss_chart(&panels[0], xs.clone(), steps)?;
    accuracy_chart(&panels[1], xs.clone(), steps)?;
    acceptance_chart(&panels[2], xs, steps)?;
    root.present().map_err(|e| e.to_string())
}

/// The drafter loss per trained step.
fn loss_chart(
    area: &Area<'_>,
    xs: std::ops::Range<f64>,
    steps: &[DrafterStepMetrics],
) -> Result<(), String> {
    let pts: Vec<(f64, f64)> = steps
        .iter()
        .filter(|m| m.step > 0 && m.loss.is_finite())
        .map(|m| (f64::from(m.step), m.loss))
        .collect();
    let settled: Vec<f64> = pts.iter().filter(|p| p.0 > 10.0).map(|p| p.1).collect();
    let shown = if settled.is_empty() {
        pts.iter().map(|p| p.1).collect()
    } else {
        settled
    };
    let top = shown.into_iter().fold(0.1f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("drafter loss", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 0f64..top * 1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(pts, BLACK.stroke_width(1)))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Top-1 accuracy of each draft position per trained step.
fn accuracy_chart(
    area: &Area<'_>,
    xs: std::ops::Range<f64>,
    steps: &[DrafterStepMetrics],
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(
            "accuracy per draft position (training batch)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 0f64..1.0)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .draw()
        .map_err(|e| e.to_string())?;
    let positions = steps.iter().map(|m| m.acc.len()).max().unwrap_or(0);
    for k in 0..positions {
        let color = Palette99::pick(k).to_rgba();
        let pts: Vec<(f64, f64)> = steps
            .iter()
            .filter(|m| m.step > 0)
            .filter_map(|m| m.acc.get(k).map(|&a| (f64::from(m.step), a)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(1)))
            .map_err(|e| e.to_string())?
            .label(format!("position {}", k + 1))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn acceptance_chart(
    area: &Area<'_>,
    xs: std::ops::Range<f64>,
    steps: &[DrafterStepMetrics],
) -> Result<(), String> {
    let pts: Vec<(f64, f64)> = steps
        .iter()
        .filter_map(|m| m.acceptance_length.map(|a| (f64::from(m.step), a)))
        .collect();
    let top = pts.iter().map(|p| p.1).fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "mean acceptance length (greedy, held-out prompts)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 0f64..top * 1.1)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("tokens per verification")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, BLUE.filled())))
        .map_err(|e| e.to_string())?;
    Ok(())
}
