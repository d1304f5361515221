//! The contention chart, as a hand-written SVG: critical sections/s (linear) and server
//! commands per acquisition (log scale) against N, one line per approach.

use std::fmt::Write;

use crate::format::fmt_num;
use crate::scenarios::contention::{ChartPoint, Series};
use crate::Plan;

const PANEL_WIDTH: f64 = 420.0;
const PANEL_HEIGHT: f64 = 260.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_TOP: f64 = 60.0;
const GAP: f64 = 110.0;

pub fn contention_svg(series: &[Series], plan: &Plan) -> String {
    let width = MARGIN_LEFT * 2.0 + PANEL_WIDTH * 2.0 + GAP;
    let height = MARGIN_TOP + PANEL_HEIGHT + 90.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="24" font-size="16" text-anchor="middle">One key, N clients: acquire → 100 µs critical section → release ({})</text>"#,
        width / 2.0,
        if plan.quick { "quick run" } else { "full run" }
    );
    let left = MARGIN_LEFT;
    let right = MARGIN_LEFT + PANEL_WIDTH + GAP;
    panel(
        &mut svg,
        series,
        left,
        "critical sections / s",
        Scale::Linear,
        |p| p.sections_per_sec,
    );
    panel(
        &mut svg,
        series,
        right,
        "server commands per acquisition (log)",
        Scale::Log,
        |p| p.commands_per_acquisition,
    );
    // Legend.
    let legend_y = MARGIN_TOP + PANEL_HEIGHT + 62.0;
    for (i, line) in series.iter().enumerate() {
        let approach = line.approach;
        let x = MARGIN_LEFT + i as f64 * 260.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{x}" y1="{legend_y}" x2="{}" y2="{legend_y}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            x + 24.0,
            approach.colour(),
            x + 30.0,
            legend_y + 4.0,
            escape(approach.label())
        );
    }
    svg.push_str("</svg>\n");
    svg
}

#[derive(Clone, Copy)]
enum Scale {
    Linear,
    Log,
}

fn panel(
    svg: &mut String,
    series: &[Series],
    x0: f64,
    title: &str,
    scale: Scale,
    value: impl Fn(&ChartPoint) -> f64,
) {
    let ns: Vec<usize> = series
        .first()
        .map(|line| line.points.iter().map(|p| p.clients).collect())
        .unwrap_or_default();
    let highest = series
        .iter()
        .flat_map(|line| line.points.iter().map(&value))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let (top, ticks) = match scale {
        Scale::Linear => linear_ticks(highest),
        Scale::Log => log_ticks(highest),
    };
    let y_of = |v: f64| -> f64 {
        let fraction = match scale {
            Scale::Linear => v / top,
            Scale::Log => v.max(1.0).log10() / top.log10(),
        };
        MARGIN_TOP + PANEL_HEIGHT * (1.0 - fraction)
    };
    // N is spaced ×4 (2, 8, 32, 128): evenly spaced positions are its log scale.
    let x_of = |i: usize| -> f64 { x0 + PANEL_WIDTH * (i as f64 + 0.5) / ns.len().max(1) as f64 };
    let _ = writeln!(
        svg,
        r##"<text x="{}" y="{}" font-size="14" text-anchor="middle">{}</text><rect x="{x0}" y="{MARGIN_TOP}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##,
        x0 + PANEL_WIDTH / 2.0,
        MARGIN_TOP - 12.0,
        escape(title)
    );
    for tick in ticks {
        let y = y_of(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            x0 + PANEL_WIDTH,
            x0 - 6.0,
            y + 4.0,
            fmt_num(tick, 0)
        );
    }
    for (i, n) in ns.iter().enumerate() {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{n}</text>"#,
            x_of(i),
            MARGIN_TOP + PANEL_HEIGHT + 18.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">N clients</text>"#,
        x0 + PANEL_WIDTH / 2.0,
        MARGIN_TOP + PANEL_HEIGHT + 36.0
    );
    for line in series {
        let approach = line.approach;
        let coords: Vec<(f64, f64)> = line
            .points
            .iter()
            .enumerate()
            .filter(|(_, p)| value(p).is_finite())
            .map(|(i, p)| (x_of(i), y_of(value(p))))
            .collect();
        let path: Vec<String> = coords
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2.5"/>"#,
            path.join(" "),
            approach.colour()
        );
        for (x, y) in coords {
            let _ = writeln!(
                svg,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{}"/>"#,
                approach.colour()
            );
        }
    }
}

/// A round top above `highest` and about five ticks from 0.
fn linear_ticks(highest: f64) -> (f64, Vec<f64>) {
    if highest <= 0.0 {
        return (1.0, vec![0.0, 1.0]);
    }
    let rough = highest / 5.0;
    let magnitude = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= rough)
        .unwrap_or(10.0 * magnitude);
    let top = (highest / step).ceil() * step;
    let count = (top / step).round() as usize;
    (top, (0..=count).map(|i| i as f64 * step).collect())
}

/// Powers of ten from 1 to the first one above `highest`.
fn log_ticks(highest: f64) -> (f64, Vec<f64>) {
    let decades = highest.max(10.0).log10().ceil() as i32;
    let ticks: Vec<f64> = (0..=decades).map(|d| 10f64.powi(d)).collect();
    (10f64.powi(decades), ticks)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_ticks_are_round_and_cover_the_highest_value() {
        let (top, ticks) = linear_ticks(4_321.0);
        assert_eq!(top, 5_000.0);
        assert_eq!(
            ticks,
            vec![0.0, 1_000.0, 2_000.0, 3_000.0, 4_000.0, 5_000.0]
        );
    }

    #[test]
    fn log_ticks_are_decades() {
        let (top, ticks) = log_ticks(65.0);
        assert_eq!(top, 100.0);
        assert_eq!(ticks, vec![1.0, 10.0, 100.0]);
    }
}
