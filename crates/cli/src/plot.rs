//! `--plot FILE`: charts of a `bench` run (throughput, wait, stage busy time and queue depth
//! over time) and of a `doctor` diagnosis (each stage alone, throughput per worker count), as
//! a PNG or, for a name ending in `.html`, a self-contained page with the chart as inline SVG.
//! Text is drawn with DejaVu Sans Mono, embedded (its licence is beside it in `assets/`).

use std::path::Path;

use anyhow::{Context, anyhow, bail};
use chute::doctor::Diagnosis;
use chute::io::write_atomically;
use chute::pipeline::StatsSnapshot;
use plotters::coord::Shift;
use plotters::prelude::*;

/// One point of a run's time series for `--plot`: figures over the interval that ended at
/// `t`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Point {
    /// Seconds since the run started.
    pub(crate) t: f64,
    pub(crate) samples_per_sec: f64,
    /// The fraction of the interval the consumer waited.
    pub(crate) wait_fraction: f64,
    /// Busy time of read, transform and collate as a fraction of the workers' time.
    pub(crate) busy: [f64; 3],
    /// Batches ready and in flight at `t`, and the queue's capacity.
    pub(crate) ready: f64,
    pub(crate) in_flight: f64,
    pub(crate) capacity: f64,
}

impl Point {
    /// The interval from `a` to `b`, `t` seconds into the run.
    pub(crate) fn between(t: f64, a: &StatsSnapshot, b: &StatsSnapshot, workers: usize) -> Point {
        let dt = (b.elapsed_secs - a.elapsed_secs).max(1e-9);
        let busy = |x: f64, y: f64| ((y - x) / (dt * workers.max(1) as f64)).clamp(0.0, 1.0);
        Point {
            t,
            samples_per_sec: (b.samples - a.samples) as f64 / dt,
            wait_fraction: ((b.wait_secs - a.wait_secs) / dt).clamp(0.0, 1.0),
            busy: [
                busy(a.read.busy_secs, b.read.busy_secs),
                busy(a.transform.busy_secs, b.transform.busy_secs),
                busy(a.collate.busy_secs, b.collate.busy_secs),
            ],
            ready: b.queue.ready as f64,
            in_flight: b.queue.in_flight as f64,
            capacity: b.queue.capacity as f64,
        }
    }
}

const WIDTH: u32 = 1000;
const PANEL: u32 = 260;
const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The font is part of the binary; a failure would be a broken build, and the charts
        // would then fail with plotters' own error.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

type Area<DB> = DrawingArea<DB, Shift>;

/// Writes a bench run's charts to `path` (`.png` or `.html`).
pub(crate) fn bench(
    path: &Path,
    title: &str,
    points: &[Point],
    summary: &str,
) -> anyhow::Result<()> {
    if points.is_empty() {
        bail!("--plot: the run was too short to record a point (run more batches or epochs)");
    }
    write(path, title, summary, 4, &|root| draw_bench(root, points))
}

/// Writes a diagnosis's charts to `path` (`.png` or `.html`).
pub(crate) fn doctor(path: &Path, d: &Diagnosis) -> anyhow::Result<()> {
    write(path, "chute doctor", &d.to_text(), 2, &|root| {
        draw_doctor(root, d)
    })
}

/// Writes a plan's bytes per node and epoch to `path` (`.png` or `.html`).
pub(crate) fn plan(path: &Path, job: &chute::core::planner::JobPlan) -> anyhow::Result<()> {
    let summary = format!(
        "{} samples in {} shards, {} ranks on {} nodes, shuffle {}",
        job.total_samples, job.shards, job.world_size, job.nodes, job.shuffle
    );
    write(path, "chute plan", &summary, 1, &|c| match c {
        Charts::Svg(root, _) => plan_panel(root, job),
        Charts::Png(root, _) => plan_panel(root, job),
    })
}

fn plan_panel<DB: DrawingBackend>(
    root: &Area<DB>,
    job: &chute::core::planner::JobPlan,
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled("chute plan: bytes each node downloads", ("sans-serif", 22))
        .map_err(err)?;
    let nodes = job.nodes.max(1) as f64;
    let top = job
        .epochs
        .iter()
        .flat_map(|e| e.nodes.iter().map(|k| k.bytes as f64))
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..nodes, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc("node")
        .y_desc("bytes per epoch")
        // A label under each bar's middle (node k's bars span k..k+1); every few for many.
        .x_labels(if job.nodes <= 32 {
            2 * job.nodes as usize + 1
        } else {
            11
        })
        .x_label_formatter(&|x| {
            let k = x.floor();
            if job.nodes > 32 || (x - k - 0.5).abs() < 0.26 {
                format!("{k:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| compact(*y))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let epochs = job.epochs.len().max(1) as f64;
    for (i, e) in job.epochs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(e.nodes.iter().map(|k| {
                let x0 = k.node as f64 + 0.1 + 0.8 * i as f64 / epochs;
                let x1 = x0 + 0.8 / epochs;
                Rectangle::new([(x0, 0.0), (x1, k.bytes as f64)], color.filled())
            }))
            .map_err(err)?
            .label(format!("epoch {}", e.epoch))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// Refuses a `--plot` name that is neither `.png` nor `.html` before anything runs.
pub(crate) fn check_name(path: &Path) -> anyhow::Result<()> {
    let name = path.to_string_lossy().to_ascii_lowercase();
    if [".png", ".html", ".htm"].iter().any(|e| name.ends_with(e)) {
        Ok(())
    } else {
        bail!(
            "--plot {}: the name must end in .png (a picture) or .html (a page with the chart)",
            path.display()
        )
    }
}

/// Renders `panels` charts with `draw` on a PNG or an SVG and writes the file.
fn write(
    path: &Path,
    title: &str,
    summary: &str,
    panels: u32,
    draw: &dyn Fn(Charts<'_, '_>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    check_name(path)?;
    register_font();
    let size = (WIDTH, PANEL * panels + 40);
    let name = path.to_string_lossy().to_ascii_lowercase();
    let bytes = if name.ends_with(".html") || name.ends_with(".htm") {
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            draw(Charts::Svg(&root, title))?;
            root.present()
                .map_err(|e| anyhow!("drawing the chart: {e}"))?;
        }
        html(title, &svg, summary).into_bytes()
    } else {
        let mut rgb = vec![0u8; (size.0 * size.1 * 3) as usize];
        {
            let root = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
            draw(Charts::Png(&root, title))?;
            root.present()
                .map_err(|e| anyhow!("drawing the chart: {e}"))?;
        }
        encode_png(&rgb, size)?
    };
    write_atomically(path, &bytes).with_context(|| format!("writing {}", path.display()))
}

/// The drawing area of either backend: the chart code is generic, this picks the instance.
enum Charts<'a, 'b> {
    Svg(&'a Area<SVGBackend<'b>>, &'a str),
    Png(&'a Area<BitMapBackend<'b>>, &'a str),
}

fn draw_bench(c: Charts<'_, '_>, points: &[Point]) -> anyhow::Result<()> {
    match c {
        Charts::Svg(root, title) => bench_panels(root, title, points),
        Charts::Png(root, title) => bench_panels(root, title, points),
    }
}

fn draw_doctor(c: Charts<'_, '_>, d: &Diagnosis) -> anyhow::Result<()> {
    match c {
        Charts::Svg(root, _) => doctor_panels(root, d),
        Charts::Png(root, _) => doctor_panels(root, d),
    }
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("drawing the chart: {e}")
}

/// One line chart over time: `lines` are (label, values at each point's `t`).
fn line_panel<DB: DrawingBackend>(
    area: &Area<DB>,
    caption: &str,
    y_desc: &str,
    t: &[f64],
    lines: &[(&str, Vec<f64>)],
    y_max: Option<f64>,
) -> anyhow::Result<()> {
    let t_max = t.iter().copied().fold(0.0, f64::max).max(1e-3);
    let top = y_max.unwrap_or_else(|| {
        lines
            .iter()
            .flat_map(|(_, v)| v.iter().copied())
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.1
    });
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..t_max, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .y_label_formatter(&|y| compact(*y))
        .x_desc("seconds")
        .y_desc(y_desc)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (k, (label, values)) in lines.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                t.iter().copied().zip(values.iter().copied()),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(*label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    if lines.len() > 1 {
        chart
            .configure_series_labels()
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn bench_panels<DB: DrawingBackend>(
    root: &Area<DB>,
    title: &str,
    points: &[Point],
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
    let panels = root.split_evenly((4, 1));
    let t: Vec<f64> = points.iter().map(|p| p.t).collect();
    let col = |f: fn(&Point) -> f64| points.iter().map(f).collect::<Vec<f64>>();
    line_panel(
        &panels[0],
        "throughput",
        "samples/s",
        &t,
        &[("samples/s", col(|p| p.samples_per_sec))],
        None,
    )?;
    line_panel(
        &panels[1],
        "time the training step waited for data",
        "fraction",
        &t,
        &[("wait", col(|p| p.wait_fraction))],
        Some(1.0),
    )?;
    line_panel(
        &panels[2],
        "worker time per stage",
        "fraction",
        &t,
        &[
            ("read", col(|p| p.busy[0])),
            ("transform", col(|p| p.busy[1])),
            ("collate", col(|p| p.busy[2])),
        ],
        Some(1.0),
    )?;
    let cap = points.iter().map(|p| p.capacity).fold(1.0, f64::max);
    line_panel(
        &panels[3],
        "queue depth",
        "batches",
        &t,
        &[
            ("ready", col(|p| p.ready)),
            ("in flight", col(|p| p.in_flight)),
            ("capacity", col(|p| p.capacity)),
        ],
        Some(cap + 1.0),
    )
}

fn doctor_panels<DB: DrawingBackend>(root: &Area<DB>, d: &Diagnosis) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let title = format!("chute doctor: the {} stage binds", d.bottleneck);
    let root = root.titled(&title, ("sans-serif", 22)).map_err(err)?;
    let panels = root.split_evenly((2, 1));
    let required = d.required_samples_per_sec;

    // Each stage alone, one thread: its time per sample (the tallest bar binds).
    let stages: Vec<_> = d.stages.iter().filter(|s| s.samples > 0).collect();
    let top = stages
        .iter()
        .map(|s| s.secs_per_sample * 1e6)
        .fold(1e-3, f64::max)
        * 1.15;
    let n = stages.len().max(1);
    let mut chart = ChartBuilder::on(&panels[0])
        .caption(
            "each stage alone, one thread: microseconds per sample (red: the bottleneck)",
            ("sans-serif", 18),
        )
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)
        .map_err(err)?;
    let names: Vec<String> = stages.iter().map(|s| s.stage.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.26 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| compact(*y))
        .y_desc("us per sample")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(stages.iter().enumerate().map(|(i, s)| {
            let color = if s.stage == d.bottleneck {
                COLORS[3]
            } else {
                COLORS[0]
            };
            Rectangle::new(
                [
                    (i as f64 + 0.2, 0.0),
                    (i as f64 + 0.8, s.secs_per_sample * 1e6),
                ],
                color.filled(),
            )
        }))
        .map_err(err)?;

    // The whole loader per worker count.
    let max_w = d.trials.iter().map(|t| t.workers).max().unwrap_or(1) as f64;
    let top = d
        .trials
        .iter()
        .map(|t| t.samples_per_sec)
        .chain(required)
        .fold(1.0, f64::max)
        * 1.15;
    let mut chart = ChartBuilder::on(&panels[1])
        .caption(
            "the whole loader per worker count (samples/s; the line: what the step needs)",
            ("sans-serif", 18),
        )
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..max_w + 0.5, 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(max_w as usize + 2)
        .x_label_formatter(&|x| {
            if (x - x.round()).abs() < 1e-6 {
                format!("{x:.0}")
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| compact(*y))
        .x_desc("workers")
        .y_desc("samples/s")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let pts: Vec<(f64, f64)> = d
        .trials
        .iter()
        .map(|t| (t.workers as f64, t.samples_per_sec))
        .collect();
    chart
        .draw_series(LineSeries::new(
            pts.iter().copied(),
            COLORS[0].stroke_width(2),
        ))
        .map_err(err)?;
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 4, COLORS[0].filled())))
        .map_err(err)?;
    if let Some(r) = required {
        chart
            .draw_series(LineSeries::new(
                [(0.0, r), (max_w + 0.5, r)],
                COLORS[3].stroke_width(1),
            ))
            .map_err(err)?;
    }
    Ok(())
}

/// An axis value in few characters: 0.25, 12, 3.4k, 1.2M.
fn compact(y: f64) -> String {
    let a = y.abs();
    if a >= 1e6 {
        format!("{:.1}M", y / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", y / 1e3)
    } else if a >= 1e3 {
        format!("{:.1}k", y / 1e3)
    } else if a >= 10.0 || a == 0.0 {
        format!("{y:.0}")
    } else {
        format!("{y:.2}")
    }
}

fn html(title: &str, svg: &str, summary: &str) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:2em}}pre{{background:#f6f6f6;padding:1em}}\
         </style></head><body>\n<h1>{t}</h1>\n{svg}\n<pre>{s}</pre>\n</body></html>\n",
        t = esc(title),
        s = esc(summary)
    )
}

fn encode_png(rgb: &[u8], (w, h): (u32, u32)) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().context("encoding the PNG")?;
        writer.write_image_data(rgb).context("encoding the PNG")?;
    }
    Ok(out)
}
