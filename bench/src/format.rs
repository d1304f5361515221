//! Numbers as the report prints them, and a target judged: what the report and every scenario
//! share (the scenarios fill in their targets; the report lays them out).

use crate::stats::Spread;

/// One target of the issue, judged.
pub struct Target {
    pub scenario: &'static str,
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

/// `1234567.8` → `1,234,568` (0 decimals) or `12.35` (2 decimals); NaN → `–`.
pub fn fmt_num(value: f64, decimals: usize) -> String {
    if !value.is_finite() {
        return "–".to_string();
    }
    let text = format!("{:.*}", decimals, value.abs());
    let (whole, fraction) = match text.split_once('.') {
        Some((w, f)) => (w.to_string(), Some(f.to_string())),
        None => (text, None),
    };
    let mut grouped = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    let sign = if value < 0.0 && text_is_nonzero(&grouped, &fraction) {
        "-"
    } else {
        ""
    };
    match fraction {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

fn text_is_nonzero(whole: &str, fraction: &Option<String>) -> bool {
    whole.chars().any(|c| c.is_ascii_digit() && c != '0')
        || fraction
            .as_ref()
            .is_some_and(|f| f.chars().any(|c| c != '0'))
}

/// `median (min–max)`, or just the median when the repetitions agree to the digits shown.
pub fn fmt_spread(spread: Spread, decimals: usize) -> String {
    let (median, min, max) = (
        fmt_num(spread.median, decimals),
        fmt_num(spread.min, decimals),
        fmt_num(spread.max, decimals),
    );
    if min == max {
        median
    } else {
        format!("{median} ({min}–{max})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_grouped_and_rounded() {
        assert_eq!(fmt_num(1234567.8, 0), "1,234,568");
        assert_eq!(fmt_num(999.0, 0), "999");
        assert_eq!(fmt_num(12.345, 2), "12.35");
        assert_eq!(fmt_num(-1500.0, 0), "-1,500");
        assert_eq!(fmt_num(-0.001, 2), "0.00");
        assert_eq!(fmt_num(f64::NAN, 2), "–");
    }

    #[test]
    fn spreads_collapse_when_repetitions_agree() {
        let same = Spread {
            median: 2.0,
            min: 2.0,
            max: 2.0,
        };
        assert_eq!(fmt_spread(same, 1), "2.0");
        let varied = Spread {
            median: 2.0,
            min: 1.5,
            max: 3.0,
        };
        assert_eq!(fmt_spread(varied, 1), "2.0 (1.5–3.0)");
    }
}
