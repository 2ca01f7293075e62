//! Server-rendered SVG charts of the console: series in, markup out (pure; no script
//! needed to see them). A chart is a `<figure>` with its title and legend, and an `<svg>`
//! with a y axis from 0 to a round maximum, the first, middle and last x labels, and
//! either stacked bars or lines. Every bar and every line point carries a `<title>` with
//! its period, series and value (the browser shows it on hover; tests read it).

use super::html::esc;
use std::fmt::Write as _;

/// The drawing's size (the SVG scales to its box) and margins, in SVG units.
const W: f64 = 640.0;
const H: f64 = 200.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 22.0;
/// Up to this many x labels are all shown.
const ALL_LABELS: usize = 12;

/// One named series: a value per x label.
#[derive(Clone, Debug)]
pub(super) struct Series {
    pub name: String,
    /// Its fill (bars) or stroke (lines), e.g. `#3b7dd8`.
    pub color: &'static str,
    pub values: Vec<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Bars, the series stacked in each period.
    Bars,
    /// One line per series.
    Lines,
}

#[derive(Clone, Debug)]
pub(super) struct Chart {
    pub id: String,
    pub title: String,
    /// The values' unit, shown after them (`s`, `%`, `jobs`).
    pub unit: String,
    pub labels: Vec<String>,
    pub kind: Kind,
    pub series: Vec<Series>,
}

/// `v` for a label: at most two decimals, no trailing zeros.
fn number(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// The smallest of 1, 2, 5 x 10^k at or above `v` (the y axis' top); 1 for nothing.
fn round_up(v: f64) -> f64 {
    if !(v.is_finite() && v > 0.0) {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|t| *t >= v * (1.0 - 1e-12)).unwrap_or(10.0 * mag)
}

/// A value made drawable: finite and not negative.
fn clean(v: f64) -> f64 {
    if v.is_finite() {
        v.max(0.0)
    } else {
        0.0
    }
}

/// The chart as a `<figure id="{id}">` holding its SVG.
pub(super) fn figure(c: &Chart) -> String {
    let n = c.labels.len();
    let at = |s: &Series, i: usize| clean(s.values.get(i).copied().unwrap_or(0.0));
    let max = match c.kind {
        Kind::Bars => (0..n).map(|i| c.series.iter().map(|s| at(s, i)).sum::<f64>()).fold(0.0, f64::max),
        Kind::Lines => (0..n).flat_map(|i| c.series.iter().map(move |s| at(s, i))).fold(0.0, f64::max),
    };
    let top = round_up(max);
    let (plot_w, plot_h) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let y = |v: f64| TOP + plot_h * (1.0 - v / top);
    let slot = plot_w / n.max(1) as f64;
    let x_mid = |i: usize| LEFT + slot * (i as f64 + 0.5);
    let unit = esc(&c.unit);
    let mut s = format!(
        "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\" data-max=\"{}\" data-points=\"{n}\">",
        number(max)
    );
    // Axes, the middle grid line and the y labels.
    let _ = write!(
        s,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\
         <line class=\"grid\" x1=\"{LEFT}\" y1=\"{m:.1}\" x2=\"{r}\" y2=\"{m:.1}\" stroke=\"#ddd\"/>\
         <text class=\"ylabel\" x=\"{tx}\" y=\"{t2}\" text-anchor=\"end\" font-size=\"10\">{top} {unit}</text>\
         <text class=\"ylabel\" x=\"{tx}\" y=\"{m2:.1}\" text-anchor=\"end\" font-size=\"10\">{half}</text>\
         <text class=\"ylabel\" x=\"{tx}\" y=\"{b}\" text-anchor=\"end\" font-size=\"10\">0</text>",
        b = TOP + plot_h,
        r = W - RIGHT,
        m = y(top / 2.0),
        m2 = y(top / 2.0) + 3.0,
        tx = LEFT - 4.0,
        t2 = TOP + 8.0,
        top = number(top),
        half = number(top / 2.0),
    );
    // Every label when they are few (cut to their slot), else the first, middle and last.
    let (mut shown, fit): (Vec<usize>, usize) =
        if n <= ALL_LABELS { ((0..n).collect(), ((slot / 6.0) as usize).max(3)) } else { (vec![0, n / 2, n - 1], 16) };
    shown.dedup();
    for i in shown {
        let text: String = c.labels[i].chars().take(fit).collect();
        let _ = write!(
            s,
            "<text class=\"xlabel\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\" font-size=\"10\">{}</text>",
            x_mid(i),
            H - 6.0,
            esc(&text)
        );
    }
    if max <= 0.0 {
        let _ = write!(
            s,
            "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\" fill=\"#888\">no data</text>",
            LEFT + plot_w / 2.0,
            TOP + plot_h / 2.0
        );
    }
    match c.kind {
        Kind::Bars => bars(&mut s, c, &at, &y, slot),
        Kind::Lines => lines(&mut s, c, &at, &y, &x_mid),
    }
    s.push_str("</svg>");
    let legend: String = c
        .series
        .iter()
        .map(|x| format!("<span class=\"key\"><i style=\"background:{}\"></i>{}</span>", x.color, esc(&x.name)))
        .collect();
    format!(
        "<figure class=\"chart\" id=\"{}\"><figcaption><b>{}</b> {legend}</figcaption>{s}</figure>",
        esc(&c.id),
        esc(&c.title)
    )
}

/// Stacked bars: one `<rect class="bar">` per positive value.
fn bars(s: &mut String, c: &Chart, at: &dyn Fn(&Series, usize) -> f64, y: &dyn Fn(f64) -> f64, slot: f64) {
    let width = (slot * 0.8).max(0.5);
    for (i, label) in c.labels.iter().enumerate() {
        let x = LEFT + slot * i as f64 + (slot - width) / 2.0;
        let mut base = 0.0;
        for series in &c.series {
            let v = at(series, i);
            if v <= 0.0 {
                continue;
            }
            let (y0, y1) = (y(base + v), y(base));
            let _ = write!(
                s,
                "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y0:.1}\" width=\"{width:.1}\" height=\"{:.1}\" fill=\"{}\" \
                 data-value=\"{}\">{}</rect>",
                (y1 - y0).max(0.0),
                series.color,
                number(v),
                title(c, label, series, v)
            );
            base += v;
        }
    }
}

/// A mark's tooltip: its period, series, value and unit.
fn title(c: &Chart, label: &str, series: &Series, v: f64) -> String {
    format!("<title>{} · {}: {} {}</title>", esc(label), esc(&series.name), number(v), esc(&c.unit))
}

/// Lines: a `<polyline>` per series and a point (`<circle>`) per value.
fn lines(
    s: &mut String,
    c: &Chart,
    at: &dyn Fn(&Series, usize) -> f64,
    y: &dyn Fn(f64) -> f64,
    x_mid: &dyn Fn(usize) -> f64,
) {
    for series in &c.series {
        let points: Vec<String> =
            (0..c.labels.len()).map(|i| format!("{:.1},{:.1}", x_mid(i), y(at(series, i)))).collect();
        let _ = write!(
            s,
            "<polyline class=\"line\" data-series=\"{}\" points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"/>",
            esc(&series.name),
            points.join(" "),
            series.color
        );
        for (i, label) in c.labels.iter().enumerate() {
            let v = at(series, i);
            let _ = write!(
                s,
                "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{}\" data-value=\"{}\">\
                 {}</circle>",
                x_mid(i),
                y(v),
                series.color,
                number(v),
                title(c, label, series, v)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chart(kind: Kind, series: Vec<Series>, n: usize) -> Chart {
        Chart {
            id: "c".into(),
            title: "Jobs <by> outcome".into(),
            unit: "jobs".into(),
            labels: (0..n).map(|i| format!("h{i}")).collect(),
            kind,
            series,
        }
    }

    fn series(name: &str, values: Vec<f64>) -> Series {
        Series { name: name.into(), color: "#123456", values }
    }

    /// The values of `attr` on every element whose markup starts with `tag`.
    fn attrs(svg: &str, tag: &str, attr: &str) -> Vec<f64> {
        svg.split(tag)
            .skip(1)
            .map(|el| {
                let at = el.find(&format!(" {attr}=\"")).expect(attr) + attr.len() + 3;
                el[at..].split('"').next().unwrap().parse().unwrap()
            })
            .collect()
    }

    #[test]
    fn bars_stack_per_period_up_to_a_round_axis() {
        let c = chart(Kind::Bars, vec![series("ok", vec![3.0, 0.0, 5.0]), series("failed", vec![1.0, 0.0, 2.0])], 3);
        let f = figure(&c);
        assert_eq!(f.matches("<rect class=\"bar\"").count(), 4, "zeros draw nothing: {f}");
        assert!(f.contains("data-max=\"7\""), "{f}");
        assert!(f.contains(">10 jobs</text>"), "the axis tops at 10: {f}");
        assert!(f.contains("<title>h2 · failed: 2 jobs</title>"), "{f}");
        // The stacked bar of h2 reaches 7/10 of the plot: y = TOP + plot_h * 0.3.
        let ys = attrs(&f, "<rect", "y");
        let want = TOP + (H - TOP - BOTTOM) * 0.3;
        assert!(ys.iter().any(|y| (y - want).abs() < 0.06), "{ys:?} vs {want}");
        assert!(!f.contains("no data"));
    }

    #[test]
    fn lines_draw_a_point_per_value_and_labels_are_escaped() {
        let mut c = chart(Kind::Lines, vec![series("p99 <ms>", vec![10.0, 250.5, 40.0, 0.0])], 4);
        c.labels[0] = "a&b".into();
        let f = figure(&c);
        assert_eq!(f.matches("<circle").count(), 4);
        assert_eq!(f.matches("<polyline").count(), 1);
        assert!(f.contains("p99 &lt;ms&gt;") && f.contains("a&amp;b") && f.contains("Jobs &lt;by&gt; outcome"), "{f}");
        assert!(!f.contains("<ms>") && !f.contains("<by>"));
        assert!(f.contains("data-value=\"250.5\""), "{f}");
        assert_eq!([number(2.5), number(3.0), number(0.126), number(-0.0)], ["2.5", "3", "0.13", "0"]);
        assert!(f.contains(">500 jobs</text>"), "{f}");
    }

    #[test]
    fn an_empty_or_idle_chart_says_no_data() {
        for c in [chart(Kind::Bars, vec![series("ok", vec![0.0, 0.0])], 2), chart(Kind::Lines, vec![], 0)] {
            let f = figure(&c);
            assert!(f.contains("no data"), "{f}");
            assert_eq!(f.matches("<rect").count(), 0);
            assert!(f.contains("data-max=\"0\""));
        }
    }

    #[test]
    fn axes_top_at_1_2_or_5_times_a_power_of_ten() {
        assert_eq!(
            [0.0, 0.3, 1.0, 1.5, 2.0, 7.0, 12.0, 999.0, f64::NAN].map(round_up),
            [1.0, 0.5, 1.0, 2.0, 2.0, 10.0, 20.0, 1000.0, 1.0]
        );
    }

    proptest! {
        /// Whatever the values (negative, infinite and NaN ones included), every bar and
        /// point stays inside the plot, and each positive value draws one bar.
        #[test]
        fn every_mark_stays_inside_the_plot(
            a in proptest::collection::vec(prop_oneof![-1e9f64..1e12, Just(f64::NAN), Just(f64::INFINITY)], 0..50),
            b in proptest::collection::vec(0f64..1e6, 0..50),
        ) {
            let n = a.len().max(b.len());
            let c = chart(Kind::Bars, vec![series("a", a.clone()), series("b", b.clone())], n);
            let f = figure(&c);
            let positive = a.iter().chain(&b).filter(|v| v.is_finite() && **v > 0.0).count();
            prop_assert_eq!(f.matches("<rect class=\"bar\"").count(), positive);
            let (ys, hs) = (attrs(&f, "<rect", "y"), attrs(&f, "<rect", "height"));
            for (y, h) in ys.iter().zip(&hs) {
                prop_assert!(*y >= TOP - 0.1 && y + h <= H - BOTTOM + 0.1, "y {} h {}", y, h);
            }
            let l = figure(&Chart { kind: Kind::Lines, ..c });
            for cy in attrs(&l, "<circle", "cy") {
                prop_assert!((TOP - 0.1..=H - BOTTOM + 0.1).contains(&cy), "cy {}", cy);
            }
        }
    }
}
