//! `tests/bench/chart.svg`: the main comparisons as grouped bar panels, drawn by hand.

use std::fmt::Write as _;

use super::results::{Results, TrafficRow};
use crate::{
    measure::stats::Summary,
    scenario::traffic::{Mode, Scenario},
};

const COLORS: [(&str, Mode); 6] = [
    ("#9e9e9e", Mode::Direct),
    ("#e6862e", Mode::IptablesNft),
    ("#c0392b", Mode::IptablesLegacy),
    ("#2e86de", Mode::Ebpf),
    ("#27ae60", Mode::Fallback),
    ("#85c1e9", Mode::EbpfBaseline),
];

fn color(mode: Mode) -> &'static str {
    COLORS
        .iter()
        .find(|(_, m)| *m == mode)
        .map(|(c, _)| *c)
        .unwrap_or("#000")
}

/// A group of bars in a panel: its label, and its bars (label, colour, value).
type BarGroup<'a> = (String, Vec<(String, &'a str, Option<Summary>)>);

/// A grouped bar panel with min–max whiskers. `groups`: (label, bars (label, colour, value)).
fn panel(svg: &mut String, x: f64, y: f64, w: f64, h: f64, title: &str, groups: &[BarGroup<'_>]) {
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="14" font-weight="bold">{title}</text>"#,
        x,
        y + 14.0
    );
    let (top, bottom) = (y + 28.0, y + h - 34.0);
    let max = groups
        .iter()
        .flat_map(|(_, b)| b.iter().filter_map(|(_, _, s)| s.map(|s| s.max)))
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let _ = writeln!(
        svg,
        r##"<line x1="{x:.1}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/>"##,
        x + w
    );
    for t in 0..=4 {
        let v = max * f64::from(t) / 4.0;
        let ty = bottom - (bottom - top) * f64::from(t) / 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{ty:.1}" x2="{:.1}" y2="{ty:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" font-size="10" fill="#555">{}</text>"##,
            x + w,
            x + 2.0,
            ty - 2.0,
            fmt_num(v)
        );
    }
    let gw = w / groups.len().max(1) as f64;
    for (gi, (glabel, bars)) in groups.iter().enumerate() {
        let gx = x + gw * gi as f64;
        let bw = (gw - 16.0) / bars.len().max(1) as f64;
        for (bi, (blabel, colour, s)) in bars.iter().enumerate() {
            let bx = gx + 8.0 + bw * bi as f64;
            match s {
                Some(s) => {
                    let bh = (bottom - top) * s.median / max;
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{colour}"><title>{blabel}: {} ({}–{})</title></rect>"#,
                        bx + 1.0,
                        bottom - bh,
                        bw - 2.0,
                        fmt_num(s.median),
                        fmt_num(s.min),
                        fmt_num(s.max)
                    );
                    let (ymin, ymax) = (
                        bottom - (bottom - top) * s.min / max,
                        bottom - (bottom - top) * s.max / max,
                    );
                    let cx = bx + bw / 2.0;
                    let _ = writeln!(
                        svg,
                        r##"<line x1="{cx:.1}" y1="{ymin:.1}" x2="{cx:.1}" y2="{ymax:.1}" stroke="#222"/><line x1="{:.1}" y1="{ymin:.1}" x2="{:.1}" y2="{ymin:.1}" stroke="#222"/><line x1="{:.1}" y1="{ymax:.1}" x2="{:.1}" y2="{ymax:.1}" stroke="#222"/>"##,
                        cx - 3.0,
                        cx + 3.0,
                        cx - 3.0,
                        cx + 3.0
                    );
                    let _ = writeln!(
                        svg,
                        r#"<text x="{cx:.1}" y="{:.1}" font-size="9" text-anchor="middle">{}</text>"#,
                        ymax - 3.0,
                        fmt_num(s.median)
                    );
                }
                None => {
                    let _ = writeln!(
                        svg,
                        r##"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle" fill="#888" transform="rotate(-90 {:.1} {:.1})">not yet implemented</text>"##,
                        bx + bw / 2.0,
                        bottom - 6.0,
                        bx + bw / 2.0,
                        bottom - 6.0
                    );
                }
            }
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle">{glabel}</text>"#,
            gx + gw / 2.0,
            bottom + 14.0
        );
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Renders the chart.
pub fn svg(r: &Results) -> String {
    let (w, h) = (1000.0, 760.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    // The chart's modes: ebpf-baseline and fallback only in a run that has them (results
    // from before the fallback existed keep their chart).
    let modes: Vec<Mode> = COLORS
        .iter()
        .map(|(_, m)| *m)
        .filter(|m| {
            (Mode::ALL.contains(m) && *m != Mode::Fallback)
                || r.traffic.iter().any(|x| x.mode == *m)
        })
        .collect();
    let traffic = |scenario: Scenario,
                   f: fn(&TrafficRow) -> Summary|
     -> Vec<(String, &str, Option<Summary>)> {
        modes
            .iter()
            .map(|&m| {
                let row = r
                    .traffic
                    .iter()
                    .find(|x| x.scenario == scenario && x.mode == m);
                (
                    m.label().to_string(),
                    color(m),
                    row.filter(|x| x.status == "measured").map(f),
                )
            })
            .collect()
    };
    panel(
        &mut s,
        20.0,
        40.0,
        460.0,
        330.0,
        "Connections per second (higher is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundConnections, |x| x.rate),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundConnections, |x| x.rate),
            ),
        ],
    );
    panel(
        &mut s,
        520.0,
        40.0,
        460.0,
        330.0,
        "p99 connection latency, µs (lower is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundConnections, |x| x.p99_us),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundConnections, |x| x.p99_us),
            ),
        ],
    );
    panel(
        &mut s,
        20.0,
        400.0,
        460.0,
        330.0,
        "Throughput, Gbit/s (higher is better)",
        &[
            (
                "outbound".into(),
                traffic(Scenario::OutboundThroughput, |x| x.gbps),
            ),
            (
                "inbound".into(),
                traffic(Scenario::InboundThroughput, |x| x.gbps),
            ),
        ],
    );
    let pods: Vec<BarGroup<'_>> = r
        .pod_setup
        .checkpoints
        .iter()
        .map(|c| {
            let one = |v: f64| {
                Some(Summary {
                    median: v,
                    min: v,
                    max: v,
                })
            };
            (
                format!("{} pods", c.registered),
                vec![
                    ("ADD p50".to_string(), "#2e86de", one(c.add_p50_ms)),
                    ("ADD p99".to_string(), "#1b4f72", one(c.add_p99_ms)),
                    ("DEL p50".to_string(), "#58d68d", one(c.del_p50_ms)),
                    ("DEL p99".to_string(), "#1e8449", one(c.del_p99_ms)),
                ],
            )
        })
        .collect();
    panel(
        &mut s,
        520.0,
        400.0,
        460.0,
        330.0,
        "CNI ADD / DEL latency, ms (lower is better)",
        &pods,
    );
    // Legends.
    for (i, &m) in modes.iter().enumerate() {
        let c = color(m);
        let step = if modes.len() > 4 { 110.0 } else { 130.0 };
        let lx = 20.0 + step * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="8" width="12" height="12" fill="{c}"/><text x="{:.0}" y="18" font-size="12">{}</text>"#,
            lx + 16.0,
            m.label()
        );
    }
    for (i, (c, l)) in [
        ("#2e86de", "ADD p50"),
        ("#1b4f72", "ADD p99"),
        ("#58d68d", "DEL p50"),
        ("#1e8449", "DEL p99"),
    ]
    .iter()
    .enumerate()
    {
        let lx = 560.0 + 105.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{lx}" y="745" width="12" height="12" fill="{c}"/><text x="{:.0}" y="755" font-size="12">{l}</text>"#,
            lx + 16.0
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="20" y="755" font-size="11" fill="#555">bars: median of rounds; whiskers: min–max. {}</text>"##,
        r.machine
            .uname
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let _ = writeln!(s, "</svg>");
    s
}
