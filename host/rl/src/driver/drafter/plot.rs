//! A drafter job's `plot.png`: the drafter loss and the accuracy of each draft position per
//! step (top), the mean acceptance length of the measurements (bottom).

use super::metrics::DrafterStepMetrics;
use crate::error::RlError;
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (1000, 700);

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
    let (top, bottom) = root.split_vertically(SIZE.1 / 2);
    let last = steps.iter().map(|m| m.step).max().unwrap_or(1).max(1);
    let xs = 0f64..f64::from(last) + 1.0;
    training_chart(&top, xs.clone(), steps)?;
    acceptance_chart(&bottom, xs, steps)?;
    root.present().map_err(|e| e.to_string())
}

/// Loss (left axis scale shared with accuracy: both shown on 0..max(loss, 1)).
fn training_chart(
    area: &Area<'_>,
    xs: std::ops::Range<f64>,
    steps: &[DrafterStepMetrics],
) -> Result<(), String> {
    let top = steps
        .iter()
        .map(|m| m.loss)
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "drafter loss and accuracy per draft position",
            ("sans-serif", 18),
        )
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
    let loss: Vec<(f64, f64)> = steps
        .iter()
        .filter(|m| m.step > 0 && m.loss.is_finite())
        .map(|m| (f64::from(m.step), m.loss))
        .collect();
    chart
        .draw_series(LineSeries::new(loss, BLACK.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label("loss")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
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
            .label(format!("acc, position {}", k + 1))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
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
