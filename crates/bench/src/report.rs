//! `report.md` and the charts, from `runs.json` and the raw fio JSON it points to.

use crate::chart::{BarChart, LineChart, Series, write_svg_png};
use crate::fio::{Family, FioResult, Percentiles, Workload, parse_fio_json};
use crate::model::{Index, Meta, Status, TargetRecord};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// min / median / max of the repetitions of one figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Agg {
    /// The smallest value.
    pub(crate) min: f64,
    /// The middle value (the mean of the two middle ones for an even count).
    pub(crate) median: f64,
    /// The largest value.
    pub(crate) max: f64,
}

impl Agg {
    /// The aggregate of `v`; `None` if it is empty.
    pub(crate) fn of(v: &[f64]) -> Option<Agg> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Agg {
            min: s[0],
            median,
            max: s[n - 1],
        })
    }
}

/// The results of one target on one workload.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cell {
    /// One per repetition that produced a result.
    pub(crate) results: Vec<FioResult>,
    /// One per repetition that did not: `rep N: why`.
    pub(crate) errors: Vec<String>,
}

impl Cell {
    /// `f` aggregated over the repetitions; `None` without results.
    pub(crate) fn agg(&self, f: impl Fn(&FioResult) -> f64) -> Option<Agg> {
        Agg::of(&self.results.iter().map(f).collect::<Vec<_>>())
    }

    /// Median of each percentile over the repetitions, for one direction.
    pub(crate) fn percentiles(&self, write: bool) -> Option<Percentiles> {
        let d = |r: &FioResult| if write { r.write } else { r.read };
        if self.results.iter().all(|r| d(r).ios == 0) {
            return None;
        }
        let m = |f: fn(&Percentiles) -> f64| {
            Agg::of(
                &self
                    .results
                    .iter()
                    .map(|r| f(&d(r).clat_us))
                    .collect::<Vec<_>>(),
            )
            .map_or(0.0, |a| a.median)
        };
        Some(Percentiles {
            p50: m(|p| p.p50),
            p99: m(|p| p.p99),
            p999: m(|p| p.p999),
        })
    }
}

/// Everything loaded: (target id, workload id) → cell.
pub(crate) struct Data {
    /// The index the cells were loaded from.
    pub(crate) index: Index,
    /// The runs' results, grouped by target and workload.
    pub(crate) cells: BTreeMap<(String, String), Cell>,
}

impl Data {
    /// Loads `runs.json` of the report directory `dir` and every fio JSON it points to; a
    /// file that cannot be read or parsed is an error of its cell, not of the load.
    pub(crate) fn load(dir: &Path) -> Result<Data, String> {
        let index = Index::load(dir)?;
        let mut cells: BTreeMap<(String, String), Cell> = BTreeMap::new();
        for r in &index.runs {
            let cell = cells
                .entry((r.target.clone(), r.workload.clone()))
                .or_default();
            if let Some(e) = &r.error {
                cell.errors.push(format!("rep {}: {e}", r.rep));
                continue;
            }
            let p = dir.join(&r.file);
            match std::fs::read_to_string(&p)
                .map_err(|e| format!("{}: {e}", p.display()))
                .and_then(|t| parse_fio_json(&t))
            {
                Ok(res) => cell.results.push(res),
                Err(e) => cell.errors.push(format!("rep {}: {e}", r.rep)),
            }
        }
        Ok(Data { index, cells })
    }

    /// The cell of `target` on `workload`, if it has any result.
    pub(crate) fn cell(&self, target: &str, workload: &str) -> Option<&Cell> {
        self.cells
            .get(&(target.to_string(), workload.to_string()))
            .filter(|c| !c.results.is_empty())
    }

    /// The targets of `env` ("host" or "vm") that ran.
    fn targets(&self, env: &str) -> Vec<&TargetRecord> {
        self.index
            .targets
            .iter()
            .filter(|t| t.env == env && t.status == Status::Ok)
            .collect()
    }

    /// Median MB/s of `t` as a percentage of its baseline's.
    pub(crate) fn pct_of_plain(&self, t: &TargetRecord, w: &str) -> Option<f64> {
        let b = t.baseline.as_deref()?;
        let a = self.cell(&t.id, w)?.agg(FioResult::mb_s)?.median;
        let p = self.cell(b, w)?.agg(FioResult::mb_s)?.median;
        (p > 0.0).then(|| a / p * 100.0)
    }
}

/// MB/s, one decimal.
fn mb(v: f64) -> String {
    format!("{v:.1}")
}

/// `median (min–max)`, each formatted with `f`.
fn agg3(a: Agg, f: fn(f64) -> String) -> String {
    format!("{} ({}–{})", f(a.median), f(a.min), f(a.max))
}

/// IOPS, no decimals.
fn iops(v: f64) -> String {
    format!("{v:.0}")
}

/// `p50 / p99 / p99.9` in µs, or "–" without any.
fn lat(p: Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{:.1} / {:.1} / {:.1}", p.p50, p.p99, p.p999),
        None => "–".into(),
    }
}

/// `s` made safe for a Markdown table cell.
fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Bytes as whole GiB when they are, else MiB.
fn human_size(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else {
        format!("{} MiB", b >> 20)
    }
}

/// Writes `report.md` and the charts (under `charts/`) into `dir`; returns the chart
/// files written (SVG and PNG).
pub fn generate(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let data = Data::load(dir)?;
    let mut charts = ChartWriter::new(dir)?;
    let mut md = String::new();
    intro(&mut md, &data.index.meta);
    environment(&mut md, &data.index.meta);
    targets_table(&mut md, &data.index.targets);
    for env in ["host", "vm"] {
        let targets = data.targets(env);
        if targets.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "\n## Results: {}\n",
            if env == "vm" {
                "VM guest (fio on block devices, O_DIRECT)"
            } else {
                "host (fio's nbd engine over a unix socket)"
            }
        );
        section_tables(&mut md, &data, &targets);
        section_charts(&mut md, &data, env, &targets, &mut charts)?;
    }
    failures(&mut md, &data);
    commands(&mut md, &data);
    let p = dir.join("report.md");
    std::fs::write(&p, md).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(charts.written)
}

/// The title, how to read the figures, and the run's caveats.
fn intro(md: &mut String, m: &Meta) {
    let _ = writeln!(md, "# cryptblk bench report\n");
    let _ = writeln!(
        md,
        "Preset **{}**: {} s per fio run, {} repetition{} per figure, {} per device. \
         Figures are the median of the repetitions with (min–max); MB = 10^6 bytes; \
         latencies are fio completion latencies (clat) in µs, p50 / p99 / p99.9 \
         (median over the repetitions). Machines are noisy: compare figures of the same run only.\n",
        m.preset,
        m.runtime,
        m.repeats,
        if m.repeats == 1 { "" } else { "s" },
        human_size(m.size)
    );
    let mut notes = m.notes.clone();
    if !crate::chart::fonts_available() {
        notes.push(
            "No system font found: PNG charts have no text (the SVG charts do). \
             Install fonts-dejavu-core."
                .into(),
        );
    }
    for n in &notes {
        let _ = writeln!(md, "> **Note:** {n}\n");
    }
}

/// The machine the run was on (CPU, kernel, tool versions, ...).
fn environment(md: &mut String, m: &Meta) {
    let _ = writeln!(md, "## Environment\n\n| | |\n|---|---|");
    for (k, v) in &m.env {
        let _ = writeln!(md, "| {} | {} |", md_cell(k), md_cell(v));
    }
}

/// Every target with where it ran, what it is compared with and whether it ran; then
/// those that did not run, with the reason.
fn targets_table(md: &mut String, targets: &[TargetRecord]) {
    let _ = writeln!(md, "\n## Targets\n");
    let _ = writeln!(
        md,
        "| target | where | encrypted | compared with | status |\n|---|---|---|---|---|"
    );
    for t in targets {
        let status = match t.status {
            Status::Ok => "ran".to_string(),
            Status::Skipped => format!(
                "**skipped**: {}",
                md_cell(t.reason.as_deref().unwrap_or("?"))
            ),
            Status::Failed => format!(
                "**failed**: {}",
                md_cell(t.reason.as_deref().unwrap_or("?"))
            ),
        };
        let _ = writeln!(
            md,
            "| {} (`{}`) | {} | {} | {} | {} |",
            md_cell(&t.label),
            t.id,
            if t.env == "vm" {
                "VM guest"
            } else {
                "host, NBD"
            },
            if t.encrypted { "yes" } else { "no" },
            t.baseline.as_deref().unwrap_or("–"),
            status
        );
    }
    let not_run: Vec<&TargetRecord> = targets.iter().filter(|t| t.status != Status::Ok).collect();
    if !not_run.is_empty() {
        let _ = writeln!(md, "\nNot run:\n");
        for t in not_run {
            let _ = writeln!(
                md,
                "- `{}`: {}",
                t.id,
                t.reason.as_deref().unwrap_or("no reason recorded")
            );
        }
    }
}

/// The workloads of family `f`, in report order.
fn workloads_of(data: &Data, f: Family) -> Vec<&Workload> {
    data.index
        .workloads
        .iter()
        .filter(|w| w.family == f)
        .collect()
}

/// The Cybozu patterns (rw and block size), in report order: one table or chart each,
/// with the job counts across.
fn cybozu_patterns(cybozu: &[&Workload]) -> Vec<String> {
    let mut patterns: Vec<String> = cybozu.iter().map(|w| w.pattern()).collect();
    patterns.dedup();
    patterns
}

/// The targets that have a baseline (encrypted, and cipher_null): those with a
/// "% of plain".
fn compared<'a>(targets: &[&'a TargetRecord]) -> Vec<&'a TargetRecord> {
    targets
        .iter()
        .copied()
        .filter(|t| t.baseline.is_some())
        .collect()
}

/// "N %" of a percentage, or "–" without one.
fn pct(p: Option<f64>) -> String {
    p.map_or("–".into(), |p| format!("{p:.0} %"))
}

/// A table's header row with `first` and then `columns`, and the separator row.
fn header_row(md: &mut String, first: &str, columns: &[String]) {
    let _ = write!(md, "| {first} |");
    for c in columns {
        let _ = write!(md, " {c} |");
    }
    let _ = write!(md, "\n|---|");
    for _ in columns {
        let _ = write!(md, "---|");
    }
    let _ = writeln!(md);
}

/// The result tables of one environment: per workload, then the Cybozu matrix, then the
/// "% of plain" summary.
fn section_tables(md: &mut String, data: &Data, targets: &[&TargetRecord]) {
    for fam in [Family::Cloudflare, Family::Ceph, Family::Sync] {
        for w in workloads_of(data, fam) {
            workload_table(md, data, fam, w, targets);
        }
    }
    let cy = workloads_of(data, Family::Cybozu);
    for pat in cybozu_patterns(&cy) {
        let ws: Vec<&Workload> = cy.iter().copied().filter(|w| w.pattern() == pat).collect();
        cybozu_table(md, data, &pat, &ws, targets);
    }
    let cmp = compared(targets);
    if !cmp.is_empty() {
        pct_of_plain_table(md, data, &cmp);
    }
}

/// One workload: a row per target with throughput, IOPS, latencies and % of plain.
fn workload_table(
    md: &mut String,
    data: &Data,
    fam: Family,
    w: &Workload,
    targets: &[&TargetRecord],
) {
    let _ = writeln!(md, "### {}: {}\n", fam.title(), w.describe());
    let _ = writeln!(
        md,
        "| target | MB/s | IOPS | read clat µs p50 / p99 / p99.9 | write clat µs p50 / p99 / p99.9 | % of plain |\n|---|---|---|---|---|---|"
    );
    for t in targets {
        let Some(c) = data.cell(&t.id, &w.id) else {
            let _ = writeln!(md, "| {} | no result | | | | |", md_cell(&t.label));
            continue;
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} |",
            md_cell(&t.label),
            c.agg(FioResult::mb_s).map_or("–".into(), |a| agg3(a, mb)),
            c.agg(FioResult::iops).map_or("–".into(), |a| agg3(a, iops)),
            lat(c.percentiles(false)),
            lat(c.percentiles(true)),
            pct(data.pct_of_plain(t, &w.id))
        );
    }
    let _ = writeln!(md);
}

/// One Cybozu pattern: MB/s (IOPS) per target (rows) and job count (columns).
fn cybozu_table(
    md: &mut String,
    data: &Data,
    pat: &str,
    ws: &[&Workload],
    targets: &[&TargetRecord],
) {
    let _ = writeln!(
        md,
        "### {}: {pat}, MB/s (IOPS) by parallel jobs\n",
        Family::Cybozu.title()
    );
    let columns: Vec<String> = ws
        .iter()
        .map(|w| format!("{} job{}", w.numjobs, if w.numjobs == 1 { "" } else { "s" }))
        .collect();
    header_row(md, "target", &columns);
    for t in targets {
        let _ = write!(md, "| {} |", md_cell(&t.label));
        for w in ws {
            match data.cell(&t.id, &w.id) {
                Some(c) => {
                    let a = c.agg(FioResult::mb_s);
                    let i = c.agg(FioResult::iops);
                    let _ = write!(
                        md,
                        " {} ({}) |",
                        a.map_or("–".into(), |a| agg3(a, mb)),
                        i.map_or("–".into(), |a| iops(a.median))
                    );
                }
                None => {
                    let _ = write!(md, " no result |");
                }
            }
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md);
}

/// Every workload (rows) of every compared target (columns) as % of its baseline.
fn pct_of_plain_table(md: &mut String, data: &Data, cmp: &[&TargetRecord]) {
    let _ = writeln!(
        md,
        "### Throughput as % of plain (median MB/s of the target / median MB/s of its baseline)\n"
    );
    let columns: Vec<String> = cmp
        .iter()
        .map(|t| {
            format!(
                "{} (vs {})",
                md_cell(&t.label),
                t.baseline.as_deref().unwrap_or("")
            )
        })
        .collect();
    header_row(md, "workload", &columns);
    for w in &data.index.workloads {
        let _ = write!(md, "| {} |", w.id);
        for t in cmp {
            let _ = write!(md, " {} |", pct(data.pct_of_plain(t, &w.id)));
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md);
}

/// Writes charts as SVG and PNG under `charts/` and links them from the report.
struct ChartWriter {
    /// The report directory (links are relative to it).
    dir: PathBuf,
    /// `dir/charts`.
    charts_dir: PathBuf,
    /// The files written so far.
    written: Vec<PathBuf>,
}

impl ChartWriter {
    /// Creates `dir/charts`.
    fn new(dir: &Path) -> Result<Self, String> {
        let charts_dir = dir.join("charts");
        std::fs::create_dir_all(&charts_dir)
            .map_err(|e| format!("{}: {e}", charts_dir.display()))?;
        Ok(ChartWriter {
            dir: dir.to_path_buf(),
            charts_dir,
            written: Vec::new(),
        })
    }

    /// Writes `charts/name.svg` and `.png` and links the PNG (and the SVG) in `md`.
    fn emit(&mut self, md: &mut String, name: &str, svg: &str, alt: &str) -> Result<(), String> {
        let base = self.charts_dir.join(name);
        write_svg_png(svg, &base)?;
        self.written.push(base.with_extension("svg"));
        self.written.push(base.with_extension("png"));
        let rel = base.strip_prefix(&self.dir).unwrap_or(&base);
        let _ = writeln!(
            md,
            "![{}]({}.png) ([SVG]({}.svg))\n",
            alt,
            rel.display(),
            rel.display()
        );
        Ok(())
    }
}

/// The charts of one environment: Cybozu throughput and IOPS by jobs, latency
/// percentiles per workload and direction, and "% of plain".
fn section_charts(
    md: &mut String,
    data: &Data,
    env: &str,
    targets: &[&TargetRecord],
    charts: &mut ChartWriter,
) -> Result<(), String> {
    let _ = writeln!(md, "### Charts ({env})\n");
    cybozu_charts(md, data, env, targets, charts)?;
    latency_charts(md, data, env, targets, charts)?;
    let cmp = compared(targets);
    if !cmp.is_empty() {
        let c = pct_of_plain_chart(data, env, &cmp);
        charts.emit(md, &format!("{env}-pct-of-plain"), &c.svg(), "% of plain")?;
    }
    Ok(())
}

/// Per Cybozu pattern, MB/s and IOPS by job count: a line per target.
fn cybozu_charts(
    md: &mut String,
    data: &Data,
    env: &str,
    targets: &[&TargetRecord],
    charts: &mut ChartWriter,
) -> Result<(), String> {
    let cy = workloads_of(data, Family::Cybozu);
    for pat in &cybozu_patterns(&cy) {
        let ws: Vec<&Workload> = cy.iter().copied().filter(|w| &w.pattern() == pat).collect();
        for (metric, unit, f) in [
            ("mbs", "MB/s", FioResult::mb_s as fn(&FioResult) -> f64),
            ("iops", "IOPS", FioResult::iops),
        ] {
            let series = jobs_series(data, targets, &ws, f);
            if series.is_empty() {
                continue;
            }
            let c = LineChart {
                title: format!("{pat}: {unit} by parallel jobs ({env})"),
                x_label: "parallel jobs (one NBD connection or psync thread each, QD1)".into(),
                y_label: unit.into(),
                series,
            };
            let name = format!("{env}-cybozu-{}-{metric}", pat.replace(' ', "-"));
            charts.emit(md, &name, &c.svg(), &format!("{pat} {unit}"))?;
        }
    }
    Ok(())
}

/// Per target with results, the median of `f` by job count over the workloads `ws`.
fn jobs_series(
    data: &Data,
    targets: &[&TargetRecord],
    ws: &[&Workload],
    f: fn(&FioResult) -> f64,
) -> Vec<Series> {
    targets
        .iter()
        .map(|t| Series {
            name: t.label.clone(),
            points: ws
                .iter()
                .filter_map(|w| {
                    let a = data.cell(&t.id, &w.id)?.agg(f)?;
                    Some((w.numjobs as f64, a.median))
                })
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// Latency percentiles per target, for the latency-bound (non-Cybozu) workloads: a chart
/// per workload and direction it does.
fn latency_charts(
    md: &mut String,
    data: &Data,
    env: &str,
    targets: &[&TargetRecord],
    charts: &mut ChartWriter,
) -> Result<(), String> {
    for w in data
        .index
        .workloads
        .iter()
        .filter(|w| w.family != Family::Cybozu)
    {
        for write in [false, true] {
            if (write && !w.writes()) || (!write && !w.reads()) {
                continue;
            }
            let Some(c) = latency_chart(data, env, targets, w, write) else {
                continue;
            };
            let dname = if write { "write" } else { "read" };
            charts.emit(
                md,
                &format!("{env}-lat-{}-{dname}", w.id),
                &c.svg(),
                &format!("{} {dname} latency", w.id),
            )?;
        }
    }
    Ok(())
}

/// p50 / p99 / p99.9 of one direction of `w`, a group per target with results (none:
/// no chart).
fn latency_chart(
    data: &Data,
    env: &str,
    targets: &[&TargetRecord],
    w: &Workload,
    write: bool,
) -> Option<BarChart> {
    let rows: Vec<(String, Percentiles)> = targets
        .iter()
        .filter_map(|t| {
            Some((
                t.label.clone(),
                data.cell(&t.id, &w.id)?.percentiles(write)?,
            ))
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let dname = if write { "write" } else { "read" };
    Some(BarChart {
        title: format!("{}: {dname} latency ({env})", w.describe()),
        y_label: "clat µs (log scale)".into(),
        groups: rows.iter().map(|r| r.0.clone()).collect(),
        series: vec!["p50".into(), "p99".into(), "p99.9".into()],
        values: rows
            .iter()
            .map(|r| vec![Some(r.1.p50), Some(r.1.p99), Some(r.1.p999)])
            .collect(),
        log_y: true,
        reference: None,
    })
}

/// Every workload (groups) of every compared target (bars) as % of its baseline.
fn pct_of_plain_chart(data: &Data, env: &str, cmp: &[&TargetRecord]) -> BarChart {
    BarChart {
        title: format!("Throughput as % of plain ({env}; dashed line = 100 %)"),
        y_label: "% of the baseline's MB/s".into(),
        groups: data.index.workloads.iter().map(|w| w.id.clone()).collect(),
        series: cmp
            .iter()
            .map(|t| format!("{} vs {}", t.label, t.baseline.as_deref().unwrap_or("")))
            .collect(),
        values: data
            .index
            .workloads
            .iter()
            .map(|w| cmp.iter().map(|t| data.pct_of_plain(t, &w.id)).collect())
            .collect(),
        log_y: false,
        reference: Some(100.0),
    }
}

/// Every run that gave no result, with the reason.
fn failures(md: &mut String, data: &Data) {
    let bad: Vec<(&(String, String), &Cell)> = data
        .cells
        .iter()
        .filter(|(_, c)| !c.errors.is_empty())
        .collect();
    if bad.is_empty() {
        return;
    }
    let _ = writeln!(md, "## Failed runs\n");
    for ((t, w), c) in bad {
        for e in &c.errors {
            let _ = writeln!(md, "- `{t}` / `{w}` {}", md_cell(e));
        }
    }
    let _ = writeln!(md);
}

/// How each target was set up and the fio command lines, folded away.
fn commands(md: &mut String, data: &Data) {
    let _ = writeln!(
        md,
        "## Commands\n\nSetup of each target, then the fio command line of each figure's first repetition \
         (the others differ only in the output file).\n\n<details><summary>command lines</summary>\n\n```"
    );
    for t in &data.index.targets {
        for s in &t.setup {
            let _ = writeln!(md, "# {}: {s}", t.id);
        }
    }
    for r in data.index.runs.iter().filter(|r| r.rep == 1) {
        let _ = writeln!(md, "{}", r.command);
    }
    let _ = writeln!(md, "```\n\n</details>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agg_median() {
        let a = Agg::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((a.min, a.median, a.max), (1.0, 2.0, 3.0));
        assert_eq!(Agg::of(&[1.0, 2.0]).unwrap().median, 1.5);
        assert!(Agg::of(&[]).is_none());
    }
}
