//! SVG charts of bench reports, drawn with plotters.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::pingpong::Report;

/// Writes `pingpong-rtt.svg` and `pingpong-cpu.svg`: p99 RTT and server CPU against clients.
pub(crate) fn pingpong(dir: &Path, report: &Report) -> anyhow::Result<()> {
    let series = |f: fn(&crate::pingpong::Step) -> f64| -> Vec<(f64, f64)> {
        report.steps.iter().map(|s| (s.clients as f64, f(s))).collect()
    };
    line_chart(
        dir,
        "pingpong-rtt.svg",
        "p99 RTT (ms) vs clients",
        &series(|s| s.rtt_ms.p99),
        &report.machine.line(),
    )?;
    line_chart(
        dir,
        "pingpong-cpu.svg",
        "gateway CPU (% of one core) vs clients",
        &series(|s| s.server_cpu_pct.unwrap_or(0.0)),
        &report.machine.line(),
    )?;
    Ok(())
}

/// One SVG line chart of `points` (x = clients) written to `dir/file`.
pub(crate) fn line_chart(
    dir: &Path,
    file: &str,
    title: &str,
    points: &[(f64, f64)],
    machine: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(file);
    let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.05;
    let max_y = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title} — {machine}"), ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart.configure_mesh().x_desc("clients").draw()?;
    chart.draw_series(LineSeries::new(points.iter().copied(), &BLUE))?;
    chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))?;
    root.present()?;
    Ok(())
}
