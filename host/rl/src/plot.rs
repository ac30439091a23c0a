//! The run's plot (`<run_dir>/plot.png`): mean reward (and exact-answer rate) and loss per
//! step, drawn with `plotters` onto a bitmap; with `[eval]`, the held-out accuracy (greedy)
//! as a series of its own on the reward chart, from step 0 (before training) on. When the
//! environment's items come from more than one data source, a middle panel shows the
//! reward (10-step average) and held-out accuracy of each source.

use super::metrics::StepMetrics;
use crate::error::RlError;
use plotters::prelude::*;
use std::ops::Range;
use std::path::Path;

const SIZE: (u32, u32) = (1000, 700);

fn err(path: &Path) -> impl Fn(String) -> RlError + '_ {
    move |e| RlError::failed(format!("drawing {}: {e}", path.display()))
}

/// Draws the plot; written to a temporary file and renamed, so a reader never sees half.
pub fn draw(path: &Path, title: &str, steps: &[StepMetrics]) -> Result<(), RlError> {
    let tmp = path.with_extension("tmp.png");
    draw_to(&tmp, title, steps).map_err(err(path))?;
    std::fs::rename(&tmp, path).map_err(RlError::io(format!("writing {}", path.display())))
}

/// The drawing area one chart is drawn on.
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_to(path: &Path, title: &str, steps: &[StepMetrics]) -> Result<(), String> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 24))
        .map_err(|e| e.to_string())?;
    let last = steps.iter().map(|m| m.step).max().unwrap_or(1).max(1);
    let xs = 0f64..f64::from(last) + 1.0;
    let sources = sources(steps);
    if sources.len() > 1 {
        let parts = root.split_evenly((3, 1));
        reward_chart(&parts[0], xs.clone(), steps)?;
        source_chart(&parts[1], xs.clone(), steps, &sources)?;
        loss_chart(&parts[2], xs, steps)?;
    } else {
        let (top, bottom) = root.split_vertically(SIZE.1 / 2);
        reward_chart(&top, xs.clone(), steps)?;
        loss_chart(&bottom, xs, steps)?;
    }
    root.present().map_err(|e| e.to_string())
}

/// The points `(step, f(m))` of the steps with a rollout (not step 0's evaluation line)
/// where `f(m)` is finite.
fn points(steps: &[StepMetrics], f: fn(&StepMetrics) -> f64) -> Vec<(f64, f64)> {
    steps
        .iter()
        .filter(|m| m.step > 0 && f(m).is_finite())
        .map(|m| (f64::from(m.step), f(m)))
        .collect()
}

/// One line of a chart: its points, line style, legend label and legend style.
type Series<'a> = (Vec<(f64, f64)>, ShapeStyle, &'a str, ShapeStyle);

/// Exact-answer rate, mean reward and its 10-step average.
fn reward_chart(area: &Area<'_>, xs: Range<f64>, steps: &[StepMetrics]) -> Result<(), String> {
    let mut reward = ChartBuilder::on(area)
        .caption("reward per step", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 0f64..1.05)
        .map_err(|e| e.to_string())?;
    reward
        .configure_mesh()
        .x_desc("step")
        .y_desc("reward")
        .draw()
        .map_err(|e| e.to_string())?;
    let series: [Series<'_>; 3] = [
        (
            points(steps, |m| m.exact_frac),
            GREEN.mix(0.5).stroke_width(1),
            "exact answers",
            GREEN.into(),
        ),
        (
            points(steps, |m| m.reward_mean),
            BLUE.mix(0.35).stroke_width(1),
            "mean reward",
            BLUE.mix(0.35).into(),
        ),
        (
            moving_average(&points(steps, |m| m.reward_mean), 10),
            BLUE.stroke_width(3),
            "mean reward, 10-step average",
            BLUE.stroke_width(3),
        ),
    ];
    for (line, style, label, key) in series {
        reward
            .draw_series(LineSeries::new(line, style))
            .map_err(|e| e.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], key));
    }
    let evals: Vec<(f64, f64)> = steps
        .iter()
        .filter_map(|m| m.eval_accuracy.map(|a| (f64::from(m.step), a)))
        .collect();
    if !evals.is_empty() {
        let color = RGBColor(230, 120, 0);
        reward
            .draw_series(LineSeries::new(evals.clone(), color.stroke_width(3)))
            .map_err(|e| e.to_string())?
            .label("held-out accuracy (greedy)")
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
            });
        reward
            .draw_series(evals.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    reward
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}

/// Every data source the steps name, sorted.
fn sources(steps: &[StepMetrics]) -> Vec<String> {
    let mut all: Vec<String> = steps
        .iter()
        .flat_map(|m| m.reward_by_source.keys().chain(m.eval_by_source.keys()))
        .cloned()
        .collect();
    all.sort();
    all.dedup();
    all
}

/// Each data source's reward (10-step average, line) and held-out accuracy (dots).
fn source_chart(
    area: &Area<'_>,
    xs: Range<f64>,
    steps: &[StepMetrics],
    sources: &[String],
) -> Result<(), String> {
    let mut chart = ChartBuilder::on(area)
        .caption(
            "per data source: reward (line), held-out accuracy (dots)",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, 0f64..1.05)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("reward")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, source) in sources.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let rewards: Vec<(f64, f64)> = steps
            .iter()
            .filter_map(|m| {
                m.reward_by_source
                    .get(source)
                    .map(|r| (f64::from(m.step), *r))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(
                moving_average(&rewards, 10),
                color.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(source.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        let evals = steps.iter().filter_map(|m| {
            m.eval_by_source
                .get(source)
                .map(|a| (f64::from(m.step), *a))
        });
        chart
            .draw_series(evals.map(|p| Circle::new(p, 4, color.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|e| e.to_string())
}

/// The policy loss, on a range fitted to it.
fn loss_chart(area: &Area<'_>, xs: Range<f64>, steps: &[StepMetrics]) -> Result<(), String> {
    let losses = points(steps, |m| m.loss);
    let (lo, hi) = losses
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &(_, y)| {
            (lo.min(y), hi.max(y))
        });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
    } else if lo.is_finite() {
        (lo - 1.0, lo + 1.0)
    } else {
        (-1.0, 1.0)
    };
    let mut loss = ChartBuilder::on(area)
        .caption("policy loss per step", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(xs, lo..hi)
        .map_err(|e| e.to_string())?;
    loss.configure_mesh()
        .x_desc("step")
        .y_desc("loss")
        .draw()
        .map_err(|e| e.to_string())?;
    loss.draw_series(LineSeries::new(losses, RED.stroke_width(2)))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Trailing average over `window` points.
fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            sum += y;
            if i >= window {
                sum -= points[i - window].1;
            }
            (x, sum / (i + 1).min(window) as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_trails() {
        let p = [(1.0, 1.0), (2.0, 3.0), (3.0, 5.0)];
        assert_eq!(
            moving_average(&p, 2),
            vec![(1.0, 1.0), (2.0, 2.0), (3.0, 4.0)]
        );
    }

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.png");
        let steps: Vec<StepMetrics> = (1..=30)
            .map(|i| StepMetrics {
                step: i,
                reward_mean: f64::from(i) / 30.0,
                exact_frac: f64::from(i) / 40.0,
                loss: 0.1 / f64::from(i),
                eval_accuracy: (i % 10 == 0).then_some(f64::from(i) / 35.0),
                ..StepMetrics::default()
            })
            .collect();
        draw(&path, "test", &steps).expect("draw");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 10_000, "a real picture, not an empty canvas");
    }

    #[test]
    fn two_data_sources_get_a_panel_of_their_own() {
        let steps: Vec<StepMetrics> = (1..=12)
            .map(|i| StepMetrics {
                step: i,
                reward_by_source: [("gsm8k", 0.5), ("math", 0.25)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v * f64::from(i) / 12.0))
                    .collect(),
                eval_by_source: if i % 4 == 0 {
                    [("math".to_owned(), 0.5)].into_iter().collect()
                } else {
                    Default::default()
                },
                ..StepMetrics::default()
            })
            .collect();
        assert_eq!(sources(&steps), ["gsm8k", "math"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("plot.png");
        draw(&path, "sources", &steps).expect("draw");
        assert_eq!(&std::fs::read(&path).expect("read")[1..4], b"PNG");
        let one: Vec<StepMetrics> = steps
            .iter()
            .map(|m| StepMetrics {
                reward_by_source: m
                    .reward_by_source
                    .iter()
                    .take(1)
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
                eval_by_source: Default::default(),
                ..m.clone()
            })
            .collect();
        assert_eq!(sources(&one).len(), 1, "one source: no panel");
    }
}
