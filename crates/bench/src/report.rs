//! `report.md` and the charts, from `runs.json` and the raw fio JSON it points to.

use crate::chart::{BarChart, LineChart, Series, write_svg_png};
use crate::fio::{Family, FioResult, Percentiles, Workload, parse_fio_json};
use crate::model::{Index, Status, TargetRecord};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// min / median / max of the repetitions of one figure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agg {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Agg {
    pub fn of(v: &[f64]) -> Option<Agg> {
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
pub struct Cell {
    pub results: Vec<FioResult>,
    pub errors: Vec<String>,
}

impl Cell {
    pub fn agg(&self, f: impl Fn(&FioResult) -> f64) -> Option<Agg> {
        Agg::of(&self.results.iter().map(f).collect::<Vec<_>>())
    }

    /// Median of each percentile over the repetitions, for one direction.
    pub fn percentiles(&self, write: bool) -> Option<Percentiles> {
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
pub struct Data {
    pub index: Index,
    pub cells: BTreeMap<(String, String), Cell>,
}

impl Data {
    pub fn load(dir: &Path) -> Result<Data, String> {
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

    pub fn cell(&self, target: &str, workload: &str) -> Option<&Cell> {
        self.cells
            .get(&(target.to_string(), workload.to_string()))
            .filter(|c| !c.results.is_empty())
    }

    fn targets(&self, env: &str) -> Vec<&TargetRecord> {
        self.index
            .targets
            .iter()
            .filter(|t| t.env == env && t.status == Status::Ok)
            .collect()
    }

    /// Median MB/s of `t` as a percentage of its baseline's.
    pub fn pct_of_plain(&self, t: &TargetRecord, w: &str) -> Option<f64> {
        let b = t.baseline.as_deref()?;
        let a = self.cell(&t.id, w)?.agg(FioResult::mb_s)?.median;
        let p = self.cell(b, w)?.agg(FioResult::mb_s)?.median;
        (p > 0.0).then(|| a / p * 100.0)
    }
}

fn mb(v: f64) -> String {
    format!("{v:.1}")
}

fn agg3(a: Agg, f: fn(f64) -> String) -> String {
    format!("{} ({}–{})", f(a.median), f(a.min), f(a.max))
}

fn iops(v: f64) -> String {
    format!("{v:.0}")
}

fn lat(p: Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{:.1} / {:.1} / {:.1}", p.p50, p.p99, p.p999),
        None => "–".into(),
    }
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

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
    let charts_dir = dir.join("charts");
    std::fs::create_dir_all(&charts_dir).map_err(|e| format!("{}: {e}", charts_dir.display()))?;
    let mut charts = Vec::new();
    let m = &data.index.meta;
    let mut md = String::new();
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
    let _ = writeln!(md, "## Environment\n\n| | |\n|---|---|");
    for (k, v) in &m.env {
        let _ = writeln!(md, "| {} | {} |", md_cell(k), md_cell(v));
    }
    let _ = writeln!(md, "\n## Targets\n");
    let _ = writeln!(
        md,
        "| target | where | encrypted | compared with | status |\n|---|---|---|---|---|"
    );
    for t in &data.index.targets {
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
    let not_run: Vec<&TargetRecord> = data
        .index
        .targets
        .iter()
        .filter(|t| t.status != Status::Ok)
        .collect();
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
        section_charts(&mut md, &data, env, &targets, &charts_dir, &mut charts)?;
    }
    failures(&mut md, &data);
    commands(&mut md, &data);
    let p = dir.join("report.md");
    std::fs::write(&p, md).map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(charts)
}

fn workloads_of(data: &Data, f: Family) -> Vec<&Workload> {
    data.index
        .workloads
        .iter()
        .filter(|w| w.family == f)
        .collect()
}

fn section_tables(md: &mut String, data: &Data, targets: &[&TargetRecord]) {
    for fam in [Family::Cloudflare, Family::Ceph, Family::Sync] {
        for w in workloads_of(data, fam) {
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
                    data.pct_of_plain(t, &w.id)
                        .map_or("–".into(), |p| format!("{p:.0} %"))
                );
            }
            let _ = writeln!(md);
        }
    }
    // Cybozu: one table per pattern, jobs across.
    let cy = workloads_of(data, Family::Cybozu);
    let mut patterns: Vec<String> = cy.iter().map(|w| w.pattern()).collect();
    patterns.dedup();
    for pat in patterns {
        let ws: Vec<&&Workload> = cy.iter().filter(|w| w.pattern() == pat).collect();
        let _ = writeln!(
            md,
            "### {}: {pat}, MB/s (IOPS) by parallel jobs\n",
            Family::Cybozu.title()
        );
        let _ = write!(md, "| target |");
        for w in &ws {
            let _ = write!(
                md,
                " {} job{} |",
                w.numjobs,
                if w.numjobs == 1 { "" } else { "s" }
            );
        }
        let _ = write!(md, "\n|---|");
        for _ in &ws {
            let _ = write!(md, "---|");
        }
        let _ = writeln!(md);
        for t in targets {
            let _ = write!(md, "| {} |", md_cell(&t.label));
            for w in &ws {
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
    // Encrypted (and cipher_null) as % of plain.
    let cmp: Vec<&&TargetRecord> = targets.iter().filter(|t| t.baseline.is_some()).collect();
    if !cmp.is_empty() {
        let _ = writeln!(
            md,
            "### Throughput as % of plain (median MB/s of the target / median MB/s of its baseline)\n"
        );
        let _ = write!(md, "| workload |");
        for t in &cmp {
            let _ = write!(
                md,
                " {} (vs {}) |",
                md_cell(&t.label),
                t.baseline.as_deref().unwrap_or("")
            );
        }
        let _ = write!(md, "\n|---|");
        for _ in &cmp {
            let _ = write!(md, "---|");
        }
        let _ = writeln!(md);
        for w in &data.index.workloads {
            let _ = write!(md, "| {} |", w.id);
            for t in &cmp {
                let _ = write!(
                    md,
                    " {} |",
                    data.pct_of_plain(t, &w.id)
                        .map_or("–".into(), |p| format!("{p:.0} %"))
                );
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
    }
}

fn chart_link(md: &mut String, dir: &Path, base: &Path, alt: &str) {
    let rel = base.strip_prefix(dir).unwrap_or(base);
    let _ = writeln!(
        md,
        "![{}]({}.png) ([SVG]({}.svg))\n",
        alt,
        rel.display(),
        rel.display()
    );
}

fn section_charts(
    md: &mut String,
    data: &Data,
    env: &str,
    targets: &[&TargetRecord],
    charts_dir: &Path,
    out: &mut Vec<PathBuf>,
) -> Result<(), String> {
    let dir = charts_dir.parent().unwrap_or(charts_dir);
    let mut emit = |md: &mut String, name: String, svg: String, alt: &str| -> Result<(), String> {
        let base = charts_dir.join(name);
        write_svg_png(&svg, &base)?;
        out.push(base.with_extension("svg"));
        out.push(base.with_extension("png"));
        chart_link(md, dir, &base, alt);
        Ok(())
    };
    let _ = writeln!(md, "### Charts ({env})\n");
    let cy = workloads_of(data, Family::Cybozu);
    let mut patterns: Vec<String> = cy.iter().map(|w| w.pattern()).collect();
    patterns.dedup();
    for pat in &patterns {
        for (metric, unit, f) in [
            ("mbs", "MB/s", FioResult::mb_s as fn(&FioResult) -> f64),
            ("iops", "IOPS", FioResult::iops),
        ] {
            let series: Vec<Series> = targets
                .iter()
                .map(|t| Series {
                    name: t.label.clone(),
                    points: cy
                        .iter()
                        .filter(|w| &w.pattern() == pat)
                        .filter_map(|w| {
                            let a = data.cell(&t.id, &w.id)?.agg(f)?;
                            Some((w.numjobs as f64, a.median))
                        })
                        .collect(),
                })
                .filter(|s| !s.points.is_empty())
                .collect();
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
            emit(md, name, c.svg(), &format!("{pat} {unit}"))?;
        }
    }
    // Latency percentiles per target, for the latency-bound workloads.
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
                continue;
            }
            let dname = if write { "write" } else { "read" };
            let c = BarChart {
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
            };
            emit(
                md,
                format!("{env}-lat-{}-{dname}", w.id),
                c.svg(),
                &format!("{} {dname} latency", w.id),
            )?;
        }
    }
    let cmp: Vec<&&TargetRecord> = targets.iter().filter(|t| t.baseline.is_some()).collect();
    if !cmp.is_empty() {
        let c = BarChart {
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
        };
        emit(md, format!("{env}-pct-of-plain"), c.svg(), "% of plain")?;
    }
    Ok(())
}

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
