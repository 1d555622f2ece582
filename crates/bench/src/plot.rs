//! Charts of bench reports (SVG or PNG), drawn with plotters.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::pingpong::Report;

/// Writes `pingpong-rtt.svg` and `pingpong-cpu.svg`: p99 RTT and server CPU against clients.
pub(crate) fn pingpong(dir: &Path, report: &Report) -> anyhow::Result<()> {
    // A step without the figure (the CPU of a `--target` gateway, which the bench cannot
    // read) has no point: not a point at 0.
    let series = |f: fn(&crate::pingpong::Step) -> Option<f64>| -> Vec<(f64, f64)> {
        report.steps.iter().filter_map(|s| Some((s.clients as f64, f(s)?))).collect()
    };
    line_chart(
        dir,
        "pingpong-rtt.svg",
        "p99 RTT (ms) vs clients",
        &series(|s| Some(s.rtt_ms.p99)),
        &report.machine.line(),
    )?;
    line_chart(
        dir,
        "pingpong-cpu.svg",
        "gateway CPU (% of one core) vs clients",
        &series(|s| s.server_cpu_pct),
        &report.machine.line(),
    )?;
    Ok(())
}

/// One line chart of `points` (x = clients) written to `dir/file`: PNG if the name ends in
/// `.png`, SVG otherwise.
pub(crate) fn line_chart(
    dir: &Path,
    file: &str,
    title: &str,
    points: &[(f64, f64)],
    machine: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file);
    // A pass past the last histogram bucket reads as infinite: it has no place on the axis
    // (the table says `>250`), and would stretch it without end.
    let finite: Vec<(f64, f64)> =
        points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    let points = &finite[..];
    // Both backends draw text with the bundled font (ab_glyph has no system fonts).
    register_font();
    if file.ends_with(".png") {
        draw(BitMapBackend::new(&path, (800, 480)).into_drawing_area(), title, points, machine)
    } else {
        draw(SVGBackend::new(&path, (800, 480)).into_drawing_area(), title, points, machine)
    }
    .with_context(|| format!("drawing {}", path.display()))
}

/// Bitmaps need a font to rasterize text; the bench carries DejaVu Sans (see its LICENSE file).
fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let font = include_bytes!("../assets/DejaVuSans.ttf");
        if plotters::style::register_font("sans-serif", FontStyle::Normal, font).is_err() {
            tracing::warn!("could not load the chart font; PNG text may be missing");
        }
    });
}

/// Writes `ddc-latency.svg`: p50 and p95 of each test beside the report's, on a log scale.
pub(crate) fn ddc(dir: &Path, report: &crate::ddc::DdcReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    register_font();
    let path = dir.join("ddc-latency.svg");
    let root = SVGBackend::new(&path, (1100, 520)).into_drawing_area();
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let tests = &report.tests;
    let names: Vec<String> = tests.iter().map(|t| t.name.clone()).collect();
    let all = tests.iter().flat_map(|t| {
        let anchor = t.report.as_ref().map(|a| [a.p50_ms, a.p95_ms]).unwrap_or([0.0; 2]);
        [t.latency_ms.p50, t.latency_ms.p95, anchor[0], anchor[1]]
    });
    let (lo, hi) = all.filter(|v| *v > 0.0).fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi > 0.0 { (lo / 2.0, hi * 2.0) } else { (0.01, 1.0) };
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("DDC latency, ms (log): tickwire vs the report — {}", report.machine.line()),
            ("sans-serif", 18),
        )
        .margin(16)
        .x_label_area_size(90)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(tests.len() as f64 - 0.5), (lo..hi).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_labels(tests.len().max(1))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 0.01 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 11).into_font().transform(FontTransform::Rotate90))
        .y_desc("ms")
        .draw()
        .map_err(|e| fail(&e))?;
    /// Label, colour, filled, and the figure of a test.
    type Series = (&'static str, RGBColor, bool, fn(&crate::ddc::TestResult) -> Option<f64>);
    let series: [Series; 4] = [
        ("tickwire p50", BLUE, true, |t| Some(t.latency_ms.p50)),
        ("tickwire p95", BLUE, false, |t| Some(t.latency_ms.p95)),
        ("report p50", RED, true, |t| t.report.as_ref().map(|a| a.p50_ms)),
        ("report p95", RED, false, |t| t.report.as_ref().map(|a| a.p95_ms)),
    ];
    for (k, (label, color, filled, value)) in series.into_iter().enumerate() {
        let shift = (k as f64 - 1.5) * 0.12;
        let points: Vec<(f64, f64)> = tests
            .iter()
            .enumerate()
            .filter_map(|(i, t)| value(t).filter(|v| *v > 0.0).map(|v| (i as f64 + shift, v)))
            .collect();
        let style = if filled { color.filled() } else { color.stroke_width(2) };
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 5, style)))
            .map_err(|e| fail(&e))?
            .label(label)
            .legend(move |(x, y)| Circle::new((x, y), 5, style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    points: &[(f64, f64)],
    machine: &str,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let fail = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let max_y = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title} — {machine}"), ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)
        .map_err(|e| fail(&e))?;
    chart.configure_mesh().x_desc("clients").draw().map_err(|e| fail(&e))?;
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE)).map_err(|e| fail(&e))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, BLUE.filled()))).map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_png_and_svg() {
        let dir = std::env::temp_dir().join(format!("tickwire-plot-{}", std::process::id()));
        let points = [(10.0, 1.0), (20.0, 3.0)];
        // SVG first: it must not depend on a PNG having registered the font.
        line_chart(&dir, "a.svg", "t", &points, "m").unwrap();
        line_chart(&dir, "a.png", "t", &points, "m").unwrap();
        let png = std::fs::read(dir.join("a.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        assert!(std::fs::read_to_string(dir.join("a.svg")).unwrap().contains("<svg"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
