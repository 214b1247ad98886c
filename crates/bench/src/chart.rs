//! Charts as hand-written SVG, rasterized to PNG with resvg (pure Rust; system fonts are
//! found without fontconfig). Without any font the PNG has no text; the SVG always has.

use resvg::tiny_skia;
use resvg::usvg;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

const FONT: &str = "DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif";
const PALETTE: [&str; 12] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#393b79", "#637939",
];

/// The color of series `i` (the palette repeats after 12).
pub(crate) fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// `s` escaped for SVG text and attributes.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Approximate text width in pixels at `size` (for layout only).
fn text_w(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.58
}

/// "Nice" linear ticks from 0 to at least `max`.
pub(crate) fn nice_ticks(max: f64) -> Vec<f64> {
    let max = if max.is_finite() && max > 0.0 {
        max
    } else {
        1.0
    };
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| s * 5.0 >= max)
        .unwrap_or(10.0 * mag);
    let n = (max / step).ceil() as usize;
    (0..=n).map(|i| i as f64 * step).collect()
}

/// Tick label: compact, no trailing zeros.
pub(crate) fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 {
        format!("{}k", trim(v / 1e3))
    } else {
        trim(v)
    }
}

/// `v` with at most two decimals (one from 10 up), trailing zeros dropped.
fn trim(v: f64) -> String {
    let s = if v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A chart's layout in pixels: the whole image, and the plot area inside it.
struct Frame {
    /// Image width.
    w: f64,
    /// Image height.
    h: f64,
    /// The plot's left edge.
    left: f64,
    /// The plot's top edge.
    top: f64,
    /// Plot width.
    pw: f64,
    /// Plot height.
    ph: f64,
}

/// Opens the SVG document: white background, centered title.
fn header(svg: &mut String, w: f64, h: f64, title: &str) {
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="{FONT}">"#
    );
    let _ = write!(svg, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = write!(
        svg,
        r#"<text x="{}" y="22" font-size="15" font-weight="bold" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
}

/// Width the legend of `names` takes right of the plot.
fn legend_width(names: &[String]) -> f64 {
    names.iter().map(|n| text_w(n, 12.0)).fold(0.0, f64::max) + 40.0
}

/// A color box and name per series, right of the plot.
fn legend(svg: &mut String, f: &Frame, names: &[String]) {
    let x = f.left + f.pw + 16.0;
    for (i, n) in names.iter().enumerate() {
        let y = f.top + 8.0 + i as f64 * 18.0;
        let _ = write!(
            svg,
            r#"<rect x="{x}" y="{}" width="12" height="12" fill="{}"/><text x="{}" y="{}" font-size="12">{}</text>"#,
            y - 10.0,
            color(i),
            x + 17.0,
            y,
            esc(n)
        );
    }
}

/// Y axis with grid lines; `pos` maps a value to a y pixel.
fn y_axis(
    svg: &mut String,
    f: &Frame,
    ticks: &[(f64, String)],
    label: &str,
    pos: &dyn Fn(f64) -> f64,
) {
    for (v, t) in ticks {
        let y = pos(*v);
        let _ = write!(
            svg,
            r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#dddddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            f.left,
            f.left + f.pw,
            f.left - 6.0,
            y + 4.0,
            esc(t)
        );
    }
    let _ = write!(
        svg,
        r##"<line x1="{l}" y1="{t}" x2="{l}" y2="{b}" stroke="#333333"/><line x1="{l}" y1="{b}" x2="{r}" y2="{b}" stroke="#333333"/>"##,
        l = f.left,
        t = f.top,
        b = f.top + f.ph,
        r = f.left + f.pw
    );
    let cy = f.top + f.ph / 2.0;
    let lx = f.left - 54.0;
    let _ = write!(
        svg,
        r#"<text x="{lx}" y="{cy}" font-size="12" text-anchor="middle" transform="rotate(-90 {lx} {cy})">{}</text>"#,
        esc(label)
    );
}

/// One line of a line chart.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    /// The legend entry (a target's label).
    pub(crate) name: String,
    /// (x, y); x values are drawn evenly spaced in sorted order (1, 2, 4, 8 ... jobs).
    pub(crate) points: Vec<(f64, f64)>,
}

/// Lines over evenly spaced x values (throughput by parallel jobs), y from 0.
pub(crate) struct LineChart {
    /// The heading above the plot.
    pub(crate) title: String,
    /// The x axis's label.
    pub(crate) x_label: String,
    /// The y axis's label (the unit).
    pub(crate) y_label: String,
    /// One line each, in legend order.
    pub(crate) series: Vec<Series>,
}

impl LineChart {
    /// The chart as a standalone SVG document.
    pub(crate) fn svg(&self) -> String {
        let xs = self.x_values();
        let ymax = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max);
        let names: Vec<String> = self.series.iter().map(|s| s.name.clone()).collect();
        let f = Frame {
            w: 80.0 + 520.0 + legend_width(&names),
            h: 400.0,
            left: 70.0,
            top: 40.0,
            pw: 520.0,
            ph: 300.0,
        };
        let mut svg = String::new();
        header(&mut svg, f.w, f.h, &self.title);
        let (ticks, ypos) = linear_scale(ymax, &f);
        y_axis(&mut svg, &f, &ticks, &self.y_label, &*ypos);
        let n = xs.len().max(1);
        let xpos = |x: f64| {
            let i = xs.iter().position(|&v| v == x).unwrap_or(0);
            if n == 1 {
                f.left + f.pw / 2.0
            } else {
                f.left + 30.0 + i as f64 * (f.pw - 60.0) / (n - 1) as f64
            }
        };
        self.x_axis(&mut svg, &f, &xs, &xpos);
        for (i, s) in self.series.iter().enumerate() {
            polyline(&mut svg, i, s, &xpos, &*ypos);
        }
        legend(&mut svg, &f, &names);
        svg.push_str("</svg>\n");
        svg
    }

    /// Every x value of any series, sorted, once each.
    fn x_values(&self) -> Vec<f64> {
        let mut xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs
    }

    /// The x values under the plot and the x axis's label.
    fn x_axis(&self, svg: &mut String, f: &Frame, xs: &[f64], xpos: &dyn Fn(f64) -> f64) {
        for &x in xs {
            let _ = write!(
                svg,
                r#"<text x="{:.1}" y="{}" font-size="11" text-anchor="middle">{}</text>"#,
                xpos(x),
                f.top + f.ph + 16.0,
                fmt_num(x)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>"#,
            f.left + f.pw / 2.0,
            f.top + f.ph + 36.0,
            esc(&self.x_label)
        );
    }
}

/// Series `i` as a line with a dot (and a tooltip) at each point.
fn polyline(
    svg: &mut String,
    i: usize,
    s: &Series,
    xpos: &dyn Fn(f64) -> f64,
    ypos: &dyn Fn(f64) -> f64,
) {
    let mut pts = s.points.clone();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let path: Vec<String> = pts
        .iter()
        .map(|&(x, y)| format!("{:.1},{:.1}", xpos(x), ypos(y)))
        .collect();
    let _ = write!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
        path.join(" "),
        color(i)
    );
    for &(x, y) in &pts {
        let _ = write!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"><title>{}: {}</title></circle>"#,
            xpos(x),
            ypos(y),
            color(i),
            esc(&s.name),
            fmt_num(y)
        );
    }
}

/// Maps a value to a y pixel.
type YPos = Box<dyn Fn(f64) -> f64>;

/// A y axis's labelled ticks and its value-to-pixel mapping.
type YScale = (Vec<(f64, String)>, YPos);

/// A linear scale from 0 to a "nice" value at least 5 % above `vmax`.
fn linear_scale(vmax: f64, f: &Frame) -> YScale {
    let t = nice_ticks(vmax * 1.05);
    let top_v = *t.last().unwrap_or(&1.0);
    let (top, ph) = (f.top, f.ph);
    (
        t.iter().map(|&v| (v, fmt_num(v))).collect(),
        Box::new(move |v: f64| top + ph - v / top_v * ph),
    )
}

/// A logarithmic scale over whole decades, from the one holding the least of `values` to
/// at least one decade more, up to `vmax`.
fn log_scale(values: &[f64], vmax: f64, f: &Frame) -> YScale {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let lo = if lo.is_finite() { lo } else { 1.0 };
    let d0 = lo.log10().floor();
    let d1 = vmax.max(lo * 10.0).log10().ceil().max(d0 + 1.0);
    let ticks = (d0 as i32..=d1 as i32)
        .map(|d| (10f64.powi(d), fmt_num(10f64.powi(d))))
        .collect();
    let (top, ph) = (f.top, f.ph);
    (
        ticks,
        Box::new(move |v: f64| {
            let v = v.max(10f64.powf(d0));
            top + ph - (v.log10() - d0) / (d1 - d0) * ph
        }),
    )
}

/// Grouped bars: one group per category, one bar per series in each group.
pub(crate) struct BarChart {
    /// The heading above the plot.
    pub(crate) title: String,
    /// The y axis's label (the unit).
    pub(crate) y_label: String,
    /// The categories along the x axis, in order.
    pub(crate) groups: Vec<String>,
    /// The bars of each group, in legend order.
    pub(crate) series: Vec<String>,
    /// `values[group][series]`; `None` leaves a gap.
    pub(crate) values: Vec<Vec<Option<f64>>>,
    /// Logarithmic y axis (latencies).
    pub(crate) log_y: bool,
    /// A dashed reference line (100 % of plain).
    pub(crate) reference: Option<f64>,
}

impl BarChart {
    /// The chart as a standalone SVG document.
    pub(crate) fn svg(&self) -> String {
        let all = self.drawable_values();
        let vmax = all
            .iter()
            .copied()
            .fold(self.reference.unwrap_or(0.0), f64::max);
        let group_w = (self.series.len().max(1) as f64 * 14.0 + 16.0).max(50.0);
        let f = self.frame(group_w);
        let mut svg = String::new();
        header(&mut svg, f.w, f.h, &self.title);
        let (ticks, pos) = if self.log_y {
            log_scale(&all, vmax, &f)
        } else {
            linear_scale(vmax, &f)
        };
        y_axis(&mut svg, &f, &ticks, &self.y_label, &*pos);
        self.bars(&mut svg, &f, group_w, &*pos);
        if let Some(r) = self.reference {
            let y = pos(r);
            let _ = write!(
                svg,
                r##"<line x1="{}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#000000" stroke-dasharray="6,4"/>"##,
                f.left,
                f.left + f.pw
            );
        }
        legend(&mut svg, &f, &self.series);
        svg.push_str("</svg>\n");
        svg
    }

    /// The values that get a bar: finite and positive.
    fn drawable_values(&self) -> Vec<f64> {
        self.values
            .iter()
            .flatten()
            .flatten()
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .collect()
    }

    /// The layout for groups `group_w` pixels wide, with room below the plot for the
    /// rotated group labels.
    fn frame(&self, group_w: f64) -> Frame {
        let pw = (group_w * self.groups.len().max(1) as f64).max(360.0);
        let longest = self
            .groups
            .iter()
            .map(|g| text_w(g, 11.0))
            .fold(0.0, f64::max);
        let bottom = 20.0 + longest * 0.6;
        // Labels are rotated 35°: the first one reaches left of the plot.
        let left = 70f64.max(longest * 0.82 - group_w / 2.0 + 10.0);
        let ph = 300.0;
        Frame {
            w: left + 10.0 + pw + legend_width(&self.series),
            h: 40.0 + ph + bottom + 10.0,
            left,
            top: 40.0,
            pw,
            ph,
        }
    }

    /// Each group's bars (with tooltips) and its rotated label.
    fn bars(&self, svg: &mut String, f: &Frame, group_w: f64, pos: &dyn Fn(f64) -> f64) {
        let nb = self.series.len().max(1) as f64;
        let base_y = f.top + f.ph;
        for (gi, g) in self.groups.iter().enumerate() {
            let gx = f.left + gi as f64 * group_w + 8.0;
            for (si, v) in self.values.get(gi).into_iter().flatten().enumerate() {
                let Some(v) = v.filter(|v| v.is_finite() && *v > 0.0) else {
                    continue;
                };
                let y = pos(v);
                let _ = write!(
                    svg,
                    r#"<rect x="{:.1}" y="{y:.1}" width="12" height="{:.1}" fill="{}"><title>{} / {}: {}</title></rect>"#,
                    gx + si as f64 * 14.0,
                    (base_y - y).max(0.0),
                    color(si),
                    esc(g),
                    esc(self.series.get(si).map_or("", |s| s.as_str())),
                    fmt_num(v)
                );
            }
            let cx = gx + nb * 7.0;
            let ty = base_y + 14.0;
            let _ = write!(
                svg,
                r#"<text x="{cx:.1}" y="{ty:.1}" font-size="11" text-anchor="end" transform="rotate(-35 {cx:.1} {ty:.1})">{}</text>"#,
                esc(g)
            );
        }
    }
}

/// The system fonts, loaded once; sans-serif is the first of the usual families found.
fn fontdb() -> &'static Arc<usvg::fontdb::Database> {
    static DB: OnceLock<Arc<usvg::fontdb::Database>> = OnceLock::new();
    DB.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_system_fonts();
        let families: Vec<String> = db
            .faces()
            .flat_map(|f| f.families.iter().map(|(n, _)| n.clone()))
            .collect();
        let pick = ["DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"]
            .iter()
            .map(|s| s.to_string())
            .find(|p| families.contains(p))
            .or_else(|| families.first().cloned());
        if let Some(p) = pick {
            db.set_sans_serif_family(p);
        }
        Arc::new(db)
    })
}

/// Whether PNG charts get text (some system font was found).
pub(crate) fn fonts_available() -> bool {
    !fontdb().is_empty()
}

/// Rasterizes an SVG document to PNG bytes.
pub(crate) fn svg_to_png(svg: &str) -> Result<Vec<u8>, String> {
    let opt = usvg::Options {
        fontdb: fontdb().clone(),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_str(svg, &opt).map_err(|e| format!("SVG: {e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| "chart has no area".to_string())?;
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    pixmap.encode_png().map_err(|e| format!("PNG: {e}"))
}

/// Writes `base.svg` and `base.png`.
pub fn write_svg_png(svg: &str, base: &Path) -> Result<(), String> {
    let s = base.with_extension("svg");
    std::fs::write(&s, svg).map_err(|e| format!("{}: {e}", s.display()))?;
    let p = base.with_extension("png");
    std::fs::write(&p, svg_to_png(svg)?).map_err(|e| format!("{}: {e}", p.display()))
}

/// One figure of `cryptblk benchmark`.
#[derive(Clone, Debug)]
pub struct CipherRow {
    /// The cipher, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Key size in bits.
    pub key_bits: usize,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// Bytes per encrypt or decrypt call.
    pub request_size: usize,
    /// Encryption speed in MB/s (MB = 10^6 bytes).
    pub encrypt_mb_s: f64,
    /// Decryption speed in MB/s (MB = 10^6 bytes).
    pub decrypt_mb_s: f64,
}

/// Where `--chart DIR|FILE` puts the chart: FILE.svg/.png names it, anything else is a
/// directory that gets `cipher-speed.svg` and `.png`.
pub fn chart_base(arg: &Path) -> Result<std::path::PathBuf, String> {
    match arg.extension().and_then(|e| e.to_str()) {
        Some("svg" | "png") => {
            if let Some(parent) = arg.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("{}: {e}", parent.display()))?;
            }
            Ok(arg.with_extension(""))
        }
        _ => {
            std::fs::create_dir_all(arg).map_err(|e| format!("{}: {e}", arg.display()))?;
            Ok(arg.join("cipher-speed"))
        }
    }
}

/// Encrypt and decrypt bars per cipher, key size, sector size and request size. cipher_null
/// (a memory copy, orders of magnitude faster) is named in the title instead of drawn.
pub fn cipher_chart(rows: &[CipherRow], backend: &str) -> String {
    let (null, real): (Vec<&CipherRow>, Vec<&CipherRow>) = rows
        .iter()
        .partition(|r| r.cipher.starts_with("cipher_null"));
    let mut title = format!("cryptblk benchmark: cipher speed, one core, backend {backend}");
    if let Some(n) = null.iter().map(|r| r.encrypt_mb_s).reduce(f64::max) {
        title.push_str(&format!(
            " (cipher_null not drawn: up to {} MB/s)",
            fmt_num(n.round())
        ));
    }
    BarChart {
        title,
        y_label: "MB/s (10^6 bytes)".into(),
        groups: real
            .iter()
            .map(|r| {
                format!(
                    "{} {}b sector {} req {}",
                    r.cipher, r.key_bits, r.sector_size, r.request_size
                )
            })
            .collect(),
        series: vec!["encrypt".into(), "decrypt".into()],
        values: real
            .iter()
            .map(|r| vec![Some(r.encrypt_mb_s), Some(r.decrypt_mb_s)])
            .collect(),
        log_y: false,
        reference: None,
    }
    .svg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_cover_the_maximum() {
        for m in [0.3, 1.0, 7.0, 99.0, 1234.0, 5e6] {
            let t = nice_ticks(m);
            assert_eq!(t[0], 0.0);
            assert!(*t.last().unwrap() >= m, "{m}: {t:?}");
            assert!(t.len() <= 7, "{m}: {t:?}");
        }
        assert_eq!(fmt_num(2500.0), "2500");
        assert_eq!(fmt_num(25000.0), "25k");
        assert_eq!(fmt_num(0.25), "0.25");
    }

    #[test]
    fn charts_render_to_png() {
        let l = LineChart {
            title: "t <&>".into(),
            x_label: "jobs".into(),
            y_label: "MB/s".into(),
            series: vec![Series {
                name: "a".into(),
                points: vec![(1.0, 10.0), (2.0, 20.0)],
            }],
        };
        let svg = l.svg();
        assert!(svg.contains("t &lt;&amp;&gt;"));
        let png = svg_to_png(&svg).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let b = BarChart {
            title: "lat".into(),
            y_label: "us".into(),
            groups: vec!["g1".into(), "g2".into()],
            series: vec!["p50".into(), "p99".into()],
            values: vec![vec![Some(10.0), Some(100.0)], vec![None, Some(1000.0)]],
            log_y: true,
            reference: None,
        };
        let svg = b.svg();
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 2,
            "3 bars + 2 legend boxes"
        );
        assert_eq!(&svg_to_png(&svg).unwrap()[1..4], b"PNG");
    }
}
