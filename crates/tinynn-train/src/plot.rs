//! The loss curve as a PNG: training loss (blue line) and eval loss (red line with dots) against
//! the step, with axis titles, tick labels and a legend, drawn with plotters' bitmap backend and
//! encoded with `png`. Text is rendered by plotters (`ab_glyph`) in DejaVu Sans, embedded in the
//! binary (the `dejavu` crate), so no system font library is needed.

use std::path::Path;

use plotters::prelude::*;

use crate::metrics::StepMetrics;

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("loss plot: no finite loss to plot")]
    NoData,
    #[error("loss plot: drawing: {0}")]
    Draw(String),
    #[error("{}: {cause}", path.display())]
    Io {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
}

pub const TRAIN_COLOR: RGBColor = RGBColor(31, 119, 180);
pub const EVAL_COLOR: RGBColor = RGBColor(214, 39, 40);
const AXIS: RGBColor = RGBColor(60, 60, 60);
const GRID: RGBColor = RGBColor(225, 225, 225);
const TICKS: usize = 5;

/// Registers the embedded font under the family name plotters asks for (once).
fn register_font() -> Result<(), PlotError> {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError::Draw(
            "the embedded font could not be read".into(),
        ))
    }
}

fn draw_err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

fn number(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Renders the curves into an RGB buffer of `width × height`.
pub fn render(metrics: &[StepMetrics], width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let train: Vec<(f64, f64)> = metrics
        .iter()
        .filter(|m| m.loss.is_finite())
        .map(|m| (m.step as f64, f64::from(m.loss)))
        .collect();
    let eval: Vec<(f64, f64)> = metrics
        .iter()
        .filter_map(|m| Some((m.step as f64, f64::from(m.eval_loss?))))
        .filter(|p| p.1.is_finite())
        .collect();
    let all = || train.iter().chain(&eval);
    if all().next().is_none() {
        return Err(PlotError::NoData);
    }
    let (mut x0, mut x1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (mut y0, mut y1) = all().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if x1 <= x0 {
        (x0, x1) = (x0 - 1.0, x1 + 1.0);
    }
    let pad = if y1 > y0 { 0.05 * (y1 - y0) } else { 0.5 };
    (y0, y1) = (y0 - pad, y1 + pad);

    register_font()?;
    let mut buf = vec![0u8; width as usize * height as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let font = |size| ("sans-serif", size).into_font().color(&AXIS);
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .light_line_style(WHITE)
            .bold_line_style(GRID)
            .axis_style(AXIS.stroke_width(2))
            .x_labels(TICKS)
            .y_labels(TICKS)
            .x_label_formatter(&|x| format!("{}", x.round() as i64))
            .y_label_formatter(&|y| number(*y))
            .label_style(font(14))
            .axis_desc_style(font(15))
            .x_desc("step")
            .y_desc("loss")
            .draw()
            .map_err(draw_err)?;
        chart
            .draw_series(LineSeries::new(
                train.iter().copied(),
                TRAIN_COLOR.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label("train loss")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], TRAIN_COLOR.stroke_width(2)));
        if !eval.is_empty() {
            chart
                .draw_series(LineSeries::new(
                    eval.iter().copied(),
                    EVAL_COLOR.stroke_width(2),
                ))
                .map_err(draw_err)?
                .label("eval loss")
                .legend(|(x, y)| {
                    PathElement::new([(x, y), (x + 18, y)], EVAL_COLOR.stroke_width(2))
                });
            chart
                .draw_series(eval.iter().map(|&p| Circle::new(p, 3, EVAL_COLOR.filled())))
                .map_err(draw_err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.9))
            .border_style(GRID)
            .label_font(font(14))
            .draw()
            .map_err(draw_err)?;
        root.present().map_err(draw_err)?;
    }
    Ok(buf)
}

/// Writes the loss curve of `metrics` to `path` as a PNG (atomically).
pub fn loss_curve_png(
    path: &Path,
    metrics: &[StepMetrics],
    width: u32,
    height: u32,
) -> Result<(), PlotError> {
    let rgb = render(metrics, width, height)?;
    tinynn_format::atomic_file::write_atomic_io(path, None, |out| -> std::io::Result<()> {
        let mut enc = png::Encoder::new(out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc.write_header().map_err(std::io::Error::other)?;
        w.write_image_data(&rgb).map_err(std::io::Error::other)?;
        w.finish().map_err(std::io::Error::other)
    })
    .map_err(|cause| PlotError::Io {
        path: path.to_path_buf(),
        cause,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(n: u64) -> Vec<StepMetrics> {
        (1..=n)
            .map(|s| StepMetrics {
                step: s,
                loss: 3.0 * (-(s as f32) / 20.0).exp() + 1.0,
                lr: 1e-4,
                grad_norm: None,
                tokens_per_s: 1.0,
                elapsed_s: 1.0,
                eval_loss: s
                    .is_multiple_of(10)
                    .then(|| 3.2 * (-(s as f32) / 20.0).exp() + 1.1),
                skipped: false,
            })
            .collect()
    }

    #[test]
    fn png_decodes_and_shows_both_curves() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loss.png");
        let mut m = metrics(60);
        m[5].loss = f32::NAN; // skipped steps are left out, not drawn as garbage
        loss_curve_png(&path, &m, 640, 400).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let dec = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = dec.read_info().unwrap();
        let mut img = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut img).unwrap();
        assert_eq!((info.width, info.height), (640, 400));
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let px: Vec<[u8; 3]> = img.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        let count = |c: RGBColor| px.iter().filter(|p| **p == [c.0, c.1, c.2]).count();
        assert!(
            count(TRAIN_COLOR) > 500,
            "train curve: {}",
            count(TRAIN_COLOR)
        );
        assert!(count(EVAL_COLOR) > 100, "eval curve: {}", count(EVAL_COLOR));
        assert!(count(AXIS) > 1000, "axes and numbers: {}", count(AXIS));
        assert!(count(WHITE) > px.len() / 2);
        // The training curve falls: its pixels at the left are higher (smaller y) than at the right.
        let px = &px;
        let rows_of = |x: usize| {
            (0..400)
                .filter(move |&y| px[y * 640 + x] == [TRAIN_COLOR.0, TRAIN_COLOR.1, TRAIN_COLOR.2])
        };
        let (left, right) = (rows_of(100).min().unwrap(), rows_of(600).min().unwrap());
        assert!(left + 100 < right, "{left} vs {right}");
        // Text: the axis titles below and left of the plot, tick labels, and a legend in the
        // upper right whose sample lines have the curves' colours.
        let inked = |xs: std::ops::Range<usize>, ys: std::ops::Range<usize>| {
            ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
                .filter(|&(x, y)| px[y * 640 + x] != [255, 255, 255])
                .count()
        };
        assert!(inked(280..420, 372..400) > 20, "x axis title");
        assert!(inked(0..24, 150..250) > 20, "y axis title");
        let legend = |c: RGBColor| {
            (0..70)
                .flat_map(|y| (480..640).map(move |x| (x, y)))
                .filter(|&(x, y)| px[y * 640 + x] == [c.0, c.1, c.2])
                .count()
        };
        assert!(
            legend(TRAIN_COLOR) > 20 && legend(EVAL_COLOR) > 20,
            "legend"
        );
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        assert!(matches!(render(&[], 100, 100), Err(PlotError::NoData)));
        let mut one = metrics(1);
        one[0].loss = f32::INFINITY;
        assert!(matches!(render(&one, 100, 100), Err(PlotError::NoData)));
        // A single point still renders.
        assert!(render(&metrics(1), 100, 80).is_ok());
        assert_eq!(number(0.5), "0.500");
        assert_eq!(number(3.456), "3.46");
        assert_eq!(number(1234.0), "1234");
        assert_eq!(number(2e-5), "2.0e-5");
    }
}
