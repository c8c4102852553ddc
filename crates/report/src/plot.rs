//! PNG figures for `nessie bench sweep`: line charts (one or more panels, one line with markers
//! per series) and grouped bar charts, drawn with `plotters` into a bitmap and encoded as PNG.
//!
//! Everything here is pure Rust: text is rendered with `ab_glyph` from fonts embedded in the
//! binary (Ubuntu Light for labels, Hack for monospace), so no system font or graphics library
//! is needed at build or run time. Text is drawn by [`PngBackend`], a thin wrapper around
//! plotters' bitmap backend, because plotters' own `ab_glyph` text path places glyphs without
//! their left side bearing (letters run into each other: "client" reads "dient").
//!
//! The module knows nothing about benchmark results: [`crate::sweep`] turns results into
//! [`Series`] and [`BarGroup`]s and picks titles and labels.

use std::path::{Path, PathBuf};
use std::sync::Once;

use ab_glyph::{point, Font, FontRef, Glyph, GlyphId, PxScale, ScaleFont};
use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::element::{Drawable, PointCollection};
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use plotters_backend::text_anchor::{HPos, Pos, VPos};
use plotters_backend::{BackendColor, BackendTextStyle, DrawingErrorKind};

/// Font family every text style here uses.
const FONT: &str = "sans-serif";

static FONTS: Once = Once::new();

fn sans_font() -> FontRef<'static> {
    FontRef::try_from_slice(epaint_default_fonts::UBUNTU_LIGHT).expect("embedded Ubuntu Light font")
}

fn mono_font() -> FontRef<'static> {
    FontRef::try_from_slice(epaint_default_fonts::HACK_REGULAR).expect("embedded Hack font")
}

/// Registers the embedded fonts with plotters (once per process): [`PngBackend`] draws and
/// measures all text itself, but plotters resolves a font for every text style it builds and
/// reports an error for families it does not know.
fn ensure_fonts() {
    FONTS.call_once(|| {
        let regular = epaint_default_fonts::UBUNTU_LIGHT;
        let mono = epaint_default_fonts::HACK_REGULAR;
        for (family, bytes) in [
            ("sans-serif", regular),
            ("serif", regular),
            ("monospace", mono),
        ] {
            for style in [
                FontStyle::Normal,
                FontStyle::Bold,
                FontStyle::Italic,
                FontStyle::Oblique,
            ] {
                let _ = register_font(family, style, bytes);
            }
        }
    });
}

/// Plotters' bitmap backend writing a PNG, with its own text rendering (see the module docs).
pub struct PngBackend<'a> {
    inner: BitMapBackend<'a>,
    sans: FontRef<'static>,
    mono: FontRef<'static>,
}

impl<'a> PngBackend<'a> {
    pub fn new(path: &'a Path, size: (u32, u32)) -> Self {
        Self {
            inner: BitMapBackend::new(path, size),
            sans: sans_font(),
            mono: mono_font(),
        }
    }

    fn font(&self, family: FontFamily<'_>) -> &FontRef<'static> {
        match family {
            FontFamily::Monospace => &self.mono,
            _ => &self.sans,
        }
    }

    /// Glyphs of `text` laid out on one line with the top of the line at y = 0, and the
    /// line's width and height.
    fn layout(&self, text: &str, family: FontFamily<'_>, size: f64) -> (Vec<Glyph>, f32, f32) {
        let font = self.font(family);
        let scale = PxScale::from(size as f32);
        let scaled = font.as_scaled(scale);
        let mut caret = 0.0f32;
        let mut prev: Option<GlyphId> = None;
        let mut glyphs = Vec::with_capacity(text.len());
        for c in text.chars() {
            let id = scaled.glyph_id(c);
            if let Some(p) = prev {
                caret += scaled.kern(p, id);
            }
            glyphs.push(id.with_scale_and_position(scale, point(caret, scaled.ascent())));
            caret += scaled.h_advance(id);
            prev = Some(id);
        }
        (glyphs, caret, scaled.height())
    }
}

/// Drawing methods of [`PngBackend`] that go to the bitmap backend unchanged: only text is
/// drawn differently, and the bitmap backend's own primitives (fast filled rectangles, blending)
/// must stay in use so the figures look the same. `fn name[generics](args);` becomes
/// `fn name<generics>(&mut self, args) -> Result<(), _> { self.inner.name(args) }`.
macro_rules! forward_to_bitmap {
    ($(fn $name:ident $([$($generics:tt)*])? ($($arg:ident: $ty:ty),* $(,)?);)*) => {
        $(
            fn $name $(<$($generics)*>)? (
                &mut self,
                $($arg: $ty),*
            ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
                self.inner.$name($($arg),*)
            }
        )*
    };
}

impl DrawingBackend for PngBackend<'_> {
    type ErrorType = <BitMapBackend<'static> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }
    // `BackendStyle` by path: imported, its `stroke_width` would clash with `Color`'s.
    forward_to_bitmap! {
        fn ensure_prepared();
        fn present();
        fn draw_pixel(point: (i32, i32), color: BackendColor);
        fn draw_line[S: plotters_backend::BackendStyle](
            from: (i32, i32),
            to: (i32, i32),
            style: &S,
        );
        fn draw_rect[S: plotters_backend::BackendStyle](
            upper_left: (i32, i32),
            bottom_right: (i32, i32),
            style: &S,
            fill: bool,
        );
        fn draw_path[S: plotters_backend::BackendStyle, I: IntoIterator<Item = (i32, i32)>](
            path: I,
            style: &S,
        );
        fn draw_circle[S: plotters_backend::BackendStyle](
            center: (i32, i32),
            radius: u32,
            style: &S,
            fill: bool,
        );
        fn fill_polygon[S: plotters_backend::BackendStyle, I: IntoIterator<Item = (i32, i32)>](
            vert: I,
            style: &S,
        );
        fn blit_bitmap(pos: (i32, i32), size: (u32, u32), src: &[u8]);
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let (_, width, height) = self.layout(text, style.family(), style.size());
        Ok((width.ceil() as u32, height.ceil() as u32))
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: (i32, i32),
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 || text.is_empty() {
            return Ok(());
        }
        let (glyphs, width, height) = self.layout(text, style.family(), style.size());
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let transform = style.transform();
        let (w, h) = self.get_size();
        let font = self.font(style.family()).clone();
        let mut pixels = Vec::new();
        for glyph in glyphs {
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let bounds = outline.px_bounds();
            outline.draw(|x, y, coverage| {
                if coverage > 0.0 {
                    let gx = (bounds.min.x + dx).round() as i32 + x as i32;
                    let gy = (bounds.min.y + dy).round() as i32 + y as i32;
                    pixels.push((gx, gy, coverage.min(1.0)));
                }
            });
        }
        for (gx, gy, coverage) in pixels {
            let (tx, ty) = transform.transform(gx, gy);
            let (x, y) = (pos.0 + tx, pos.1 + ty);
            if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
                let c = BackendColor {
                    alpha: color.alpha * f64::from(coverage),
                    rgb: color.rgb,
                };
                self.inner.draw_pixel((x, y), c)?;
            }
        }
        Ok(())
    }
}

/// How the x axis maps values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XScale {
    Linear,
    /// Logarithmic with base 2: one tick per power of two (used for value sizes).
    Log2,
}

/// How x tick labels are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XFormat {
    /// Plain number (integers without decimals).
    Number,
    /// Counts: only whole numbers are labelled.
    Integer,
    /// Bytes in powers of two: 256 B, 1 KiB, 128 KiB.
    Bytes,
    /// Value is a percentage already: `40` → `40%`.
    Percent,
}

/// One line of a line chart. Points need not be sorted; non-finite points are dropped (and, on
/// a logarithmic axis, non-positive ones).
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// One panel (set of axes) of a line figure.
#[derive(Clone, Debug, PartialEq)]
pub struct LinePanel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: XScale,
    pub x_format: XFormat,
    /// Logarithmic (base 10) y axis; otherwise linear from zero.
    pub y_log: bool,
    /// A dashed horizontal reference line (e.g. a ratio of 1).
    pub reference_y: Option<f64>,
    pub series: Vec<Series>,
}

impl LinePanel {
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Self {
        Self {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_scale: XScale::Linear,
            x_format: XFormat::Number,
            y_log: false,
            reference_y: None,
            series: Vec::new(),
        }
    }
}

/// A figure of one or more line panels laid out in a grid under a title and a subtitle.
#[derive(Clone, Debug, PartialEq)]
pub struct LineFigure {
    pub title: String,
    /// Second title line, e.g. the key parameters of the runs.
    pub subtitle: String,
    pub panels: Vec<LinePanel>,
    /// Panels per row.
    pub columns: usize,
    /// Size of one panel in pixels.
    pub panel_size: (u32, u32),
}

/// One group of a grouped bar chart: one bar per entry of [`BarChart::bar_names`] (`None` = no
/// result for that bar).
#[derive(Clone, Debug, PartialEq)]
pub struct BarGroup {
    pub name: String,
    pub values: Vec<Option<f64>>,
}

/// A grouped bar chart: groups along x, one coloured bar per [`BarChart::bar_names`] entry in
/// each group, with the value written above each bar.
#[derive(Clone, Debug, PartialEq)]
pub struct BarChart {
    pub title: String,
    pub subtitle: String,
    pub y_label: String,
    pub bar_names: Vec<String>,
    pub groups: Vec<BarGroup>,
    pub size: (u32, u32),
}

const TITLE_HEIGHT: u32 = 70;

/// Colour and marker of a series: the modes keep the same look in every figure (CD blue circles,
/// SD red triangles, HY green squares, Pilaf purple diamonds); other series take palette entries
/// in order.
fn series_look(name: &str, index: usize) -> (RGBColor, usize) {
    let first = name
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    match first.as_str() {
        "cd" => (MODE_COLORS[0], 0),
        "sd" => (MODE_COLORS[1], 1),
        "hy" => (MODE_COLORS[2], 2),
        "pilaf" => (MODE_COLORS[3], 4),
        _ => (PALETTE[index % PALETTE.len()], index % 5),
    }
}

const MODE_COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(214, 39, 40),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// A data-point marker of one of five shapes (circle, triangle, square, cross, diamond), drawn
/// in pixels around its anchor so that it keeps its size on any axis.
struct Marker<C> {
    at: C,
    kind: usize,
    color: RGBColor,
}

impl<C> Marker<C> {
    fn new(at: C, kind: usize, color: RGBColor) -> Self {
        Self { at, kind, color }
    }
}

impl<'a, C> PointCollection<'a, C> for &'a Marker<C> {
    type Point = &'a C;
    type IntoIter = std::iter::Once<&'a C>;
    fn point_iter(self) -> Self::IntoIter {
        std::iter::once(&self.at)
    }
}

impl<C, DB: DrawingBackend> Drawable<DB> for Marker<C> {
    fn draw<I: Iterator<Item = (i32, i32)>>(
        &self,
        mut points: I,
        backend: &mut DB,
        _: (u32, u32),
    ) -> Result<(), DrawingErrorKind<DB::ErrorType>> {
        let Some((x, y)) = points.next() else {
            return Ok(());
        };
        let fill = self.color.filled();
        match self.kind % 5 {
            0 => backend.draw_circle((x, y), 5, &fill, true),
            1 => backend.fill_polygon(vec![(x, y - 7), (x + 6, y + 4), (x - 6, y + 4)], &fill),
            2 => backend.draw_rect((x - 4, y - 4), (x + 4, y + 4), &fill, true),
            3 => {
                let stroke = self.color.stroke_width(2);
                backend.draw_line((x - 5, y - 5), (x + 5, y + 5), &stroke)?;
                backend.draw_line((x - 5, y + 5), (x + 5, y - 5), &stroke)
            }
            _ => backend.fill_polygon(vec![(x, y - 6), (x + 6, y), (x, y + 6), (x - 6, y)], &fill),
        }
    }
}

/// Formats a byte count in powers of two: `256 B`, `1 KiB`, `1.5 MiB`.
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{} {}", format_number(value), UNITS[unit])
}

/// A short human number: integers without decimals, otherwise up to three significant digits.
pub fn format_number(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    if (v - v.round()).abs() < 1e-9 && v.abs() < 1e15 {
        return format!("{}", v.round() as i64);
    }
    let magnitude = v.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn format_x(v: f64, scale: XScale, format: XFormat) -> String {
    let value = match scale {
        XScale::Linear => v,
        XScale::Log2 => {
            // Label only exact powers of two, so the axis shows 256 B, 512 B, 1 KiB, …
            if (v - v.round()).abs() > 1e-6 {
                return String::new();
            }
            2f64.powf(v.round())
        }
    };
    match format {
        XFormat::Number => format_number(value),
        XFormat::Integer if (value - value.round()).abs() > 1e-9 => String::new(),
        XFormat::Integer => format_number(value.round()),
        XFormat::Bytes => format_bytes(value),
        XFormat::Percent => format!("{}%", format_number(value)),
    }
}

/// What every drawing call here fails with.
pub type DrawError = DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>;

/// Why a figure could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// A drawing step (`axes`, `legend`, `bars`, …) failed.
    #[error("{step}: {err}")]
    Draw { step: &'static str, err: DrawError },
    /// The finished image could not be encoded or written to `path`.
    #[error("writing {}: {err}", path.display())]
    Write { path: PathBuf, err: DrawError },
}

/// Names the drawing step that failed.
fn err(step: &'static str) -> impl FnOnce(DrawError) -> PlotError {
    move |err| PlotError::Draw { step, err }
}

/// Names the file that could not be written.
fn write_err(path: &Path) -> impl FnOnce(DrawError) -> PlotError + '_ {
    move |err| PlotError::Write {
        path: path.to_path_buf(),
        err,
    }
}

/// Draws the title and subtitle at the top of `root` and returns the area below them.
fn draw_titles<'a>(
    root: &DrawingArea<PngBackend<'a>, plotters::coord::Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<PngBackend<'a>, plotters::coord::Shift>, PlotError> {
    root.fill(&WHITE).map_err(err("fill"))?;
    let (width, _) = root.dim_in_pixel();
    let center = (width / 2) as i32;
    let title_style = anchored_text(26, &BLACK, HPos::Center, VPos::Top);
    root.draw_text(title, &title_style, (center, 8))
        .map_err(err("title"))?;
    let sub_style = anchored_text(18, &RGBColor(70, 70, 70), HPos::Center, VPos::Top);
    root.draw_text(subtitle, &sub_style, (center, 42))
        .map_err(err("subtitle"))?;
    let (_, below) = root.split_vertically(TITLE_HEIGHT);
    Ok(below)
}

/// Renders a line figure as a PNG at `path`.
pub fn line_figure(path: &Path, figure: &LineFigure) -> Result<(), PlotError> {
    ensure_fonts();
    let columns = figure.columns.max(1);
    let rows = figure.panels.len().max(1).div_ceil(columns);
    let (pw, ph) = figure.panel_size;
    let size = (pw * columns as u32, ph * rows as u32 + TITLE_HEIGHT);
    let root = PngBackend::new(path, size).into_drawing_area();
    let body = draw_titles(&root, &figure.title, &figure.subtitle)?;
    let areas = body.split_evenly((rows, columns));
    for (panel, area) in figure.panels.iter().zip(areas.iter()) {
        draw_line_panel(area, panel)?;
    }
    root.present().map_err(write_err(path))?;
    Ok(())
}

/// A series with its index (for its look) and its points after the axis transform.
type Line<'s> = (usize, &'s Series, Vec<(f64, f64)>);

/// Points of a panel after the axis transform, with unusable points dropped.
fn transformed(panel: &LinePanel) -> Vec<Line<'_>> {
    panel
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut points: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .filter(|(x, _)| panel.x_scale == XScale::Linear || *x > 0.0)
                .filter(|(_, y)| !panel.y_log || *y > 0.0)
                .map(|&(x, y)| match panel.x_scale {
                    XScale::Linear => (x, y),
                    XScale::Log2 => (x.log2(), y),
                })
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            (i, s, points)
        })
        .collect()
}

fn draw_line_panel(
    area: &DrawingArea<PngBackend<'_>, plotters::coord::Shift>,
    panel: &LinePanel,
) -> Result<(), PlotError> {
    let lines = transformed(panel);
    let all: Vec<(f64, f64)> = lines
        .iter()
        .flat_map(|(_, _, p)| p.iter().copied())
        .collect();
    let (mut x0, mut x1) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
            (lo.min(p.0), hi.max(p.0))
        });
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    let pad = if x1 > x0 { (x1 - x0) * 0.04 } else { 0.5 };
    let (x0, x1) = match (panel.x_scale, panel.x_format) {
        (XScale::Log2, _) => (x0 - 0.3, x1 + 0.3),
        // Percentages read best on an axis from 0%.
        (XScale::Linear, XFormat::Percent) if x0 >= 0.0 => (0.0, x1 + pad),
        (XScale::Linear, _) => (x0 - pad, x1 + pad),
    };
    let mut ys: Vec<f64> = all.iter().map(|p| p.1).collect();
    if let Some(r) = panel.reference_y {
        if r.is_finite() && (!panel.y_log || r > 0.0) {
            ys.push(r);
        }
    }
    let y_max = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let y_min = ys.iter().copied().fold(f64::INFINITY, f64::min);

    let mut builder = ChartBuilder::on(area);
    builder
        .caption(&panel.title, (FONT, 21))
        .margin(12)
        .margin_right(24)
        .x_label_area_size(50)
        .y_label_area_size(78);
    if panel.y_log {
        let (lo, hi) = if y_max.is_finite() {
            (y_min / 1.6, y_max * 1.6)
        } else {
            (0.1, 10.0)
        };
        let chart = builder
            .build_cartesian_2d(x0..x1, (lo..hi).log_scale())
            .map_err(err("chart"))?;
        fill_line_chart(chart, panel, &lines)
    } else {
        let hi = if y_max.is_finite() && y_max > 0.0 {
            y_max * 1.12
        } else {
            1.0
        };
        let lo = if y_min.is_finite() && y_min < 0.0 {
            y_min * 1.12
        } else {
            0.0
        };
        let chart = builder
            .build_cartesian_2d(x0..x1, lo..hi)
            .map_err(err("chart"))?;
        fill_line_chart(chart, panel, &lines)
    }
}

/// The axes of one line panel: linear x (log2 values already transformed), y of type `Y`.
type LineAxes<'a, Y> = ChartContext<'a, PngBackend<'a>, Cartesian2d<RangedCoordf64, Y>>;

/// Draws a panel's mesh, reference line, lines and legend (or "no data") on its axes.
fn fill_line_chart<'a, Y>(
    mut chart: LineAxes<'a, Y>,
    panel: &LinePanel,
    lines: &[Line<'_>],
) -> Result<(), PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    draw_line_mesh(&mut chart, panel)?;
    if let Some(r) = panel.reference_y {
        draw_reference_line(&mut chart, r)?;
    }
    if draw_lines(&mut chart, lines)? == 0 {
        draw_no_data(&mut chart, panel)
    } else {
        draw_line_legend(&mut chart, panel, lines)
    }
}

/// Axis labels, tick labels and grid of a line panel.
fn draw_line_mesh<'a, Y>(chart: &mut LineAxes<'a, Y>, panel: &LinePanel) -> Result<(), PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let x_fmt = |v: &f64| format_x(*v, panel.x_scale, panel.x_format);
    let y_fmt = |v: &f64| format_number(*v);
    let x_labels = match panel.x_scale {
        XScale::Log2 => 14,
        XScale::Linear => 8,
    };
    chart
        .configure_mesh()
        .x_desc(&panel.x_label)
        .y_desc(&panel.y_label)
        .x_labels(x_labels)
        .y_labels(8)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err("axes"))
}

/// A dashed horizontal line at `y` across the whole x range.
fn draw_reference_line<'a, Y>(chart: &mut LineAxes<'a, Y>, y: f64) -> Result<(), PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let xr = chart.x_range();
    let style = RGBColor(90, 90, 90).stroke_width(1);
    chart
        .draw_series(DashedLineSeries::new(
            vec![(xr.start, y), (xr.end, y)],
            8,
            6,
            style,
        ))
        .map_err(err("reference line"))?;
    Ok(())
}

/// Each non-empty line with its markers and legend entry; returns how many were drawn.
fn draw_lines<'a, Y>(chart: &mut LineAxes<'a, Y>, lines: &[Line<'_>]) -> Result<usize, PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut drawn = 0;
    for (index, series, points) in lines {
        if points.is_empty() {
            continue;
        }
        drawn += 1;
        let (color, kind) = series_look(&series.name, *index);
        let line_style = color.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().copied(), line_style))
            .map_err(err("line"))?
            .label(series.name.clone())
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(-12, 0), (12, 0)], line_style)
                    + Marker::new((0, 0), kind, color)
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|p| EmptyElement::at(*p) + Marker::new((0, 0), kind, color)),
            )
            .map_err(err("markers"))?;
    }
    Ok(drawn)
}

/// "no data" in the middle of a panel without a single usable point.
fn draw_no_data<'a, Y>(chart: &mut LineAxes<'a, Y>, panel: &LinePanel) -> Result<(), PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let (xr, yr) = (chart.x_range(), chart.y_range());
    let mid_x = (xr.start + xr.end) / 2.0;
    let mid_y = match panel.y_log {
        true => (yr.start * yr.end).sqrt(),
        false => (yr.start + yr.end) / 2.0,
    };
    chart
        .draw_series(std::iter::once(Text::new(
            "no data",
            (mid_x, mid_y),
            (FONT, 22).into_font().color(&RGBColor(120, 120, 120)),
        )))
        .map_err(err("no data"))?;
    Ok(())
}

/// The legend of the lines, in the corner where it hides the least (see [`legend_position`]).
fn draw_line_legend<'a, Y>(
    chart: &mut LineAxes<'a, Y>,
    panel: &LinePanel,
    lines: &[Line<'_>],
) -> Result<(), PlotError>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let position = legend_position(chart, panel, lines);
    chart
        .configure_series_labels()
        .position(position)
        .margin(10)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err("legend"))
}

/// The corner of the plotting area where the legend hides the fewest line samples (points,
/// segments and the reference line), preferring the upper corners on ties.
fn legend_position<'a, Y>(
    chart: &LineAxes<'a, Y>,
    panel: &LinePanel,
    lines: &[Line<'_>],
) -> SeriesLabelPosition
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let (w, h) = chart.plotting_area().dim_in_pixel();
    let area = (f64::from(w.max(1)), f64::from(h.max(1)));
    let samples = line_samples(chart, panel, lines);
    least_hidden_corner(&samples, area, legend_box_size(lines))
}

/// Pixel positions (relative to the plotting area) of samples along every line and along the
/// reference line.
fn line_samples<'a, Y>(
    chart: &LineAxes<'a, Y>,
    panel: &LinePanel,
    lines: &[Line<'_>],
) -> Vec<(f64, f64)>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut samples = Vec::new();
    for (_, _, points) in lines {
        sample_polyline(chart, points, &mut samples);
    }
    if let Some(r) = panel.reference_y {
        let xr = chart.x_range();
        let in_range = if panel.y_log { r > 0.0 } else { r.is_finite() };
        if in_range {
            sample_polyline(chart, &[(xr.start, r), (xr.end, r)], &mut samples);
        }
    }
    samples
}

/// Adds the vertices of the polyline through `points` and 25 samples along each segment.
fn sample_polyline<'a, Y>(
    chart: &LineAxes<'a, Y>,
    points: &[(f64, f64)],
    samples: &mut Vec<(f64, f64)>,
) where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let (px0, py0) = chart.backend_coord(&(chart.x_range().start, chart.y_range().end));
    let pixels: Vec<(f64, f64)> = points
        .iter()
        .map(|p| {
            let (x, y) = chart.backend_coord(p);
            (f64::from(x - px0), f64::from(y - py0))
        })
        .collect();
    for pair in pixels.windows(2) {
        for i in 0..=24 {
            let t = f64::from(i) / 24.0;
            samples.push((
                pair[0].0 + (pair[1].0 - pair[0].0) * t,
                pair[0].1 + (pair[1].1 - pair[0].1) * t,
            ));
        }
    }
    samples.extend(pixels.iter().copied());
}

/// Estimated pixel size of the legend box: one row per drawn line, as wide as the longest name.
fn legend_box_size(lines: &[Line<'_>]) -> (f64, f64) {
    let entries = lines.iter().filter(|(_, _, p)| !p.is_empty()).count() as f64;
    let longest = lines
        .iter()
        .map(|(_, s, _)| s.name.chars().count())
        .max()
        .unwrap_or(0) as f64;
    (longest * 9.0 + 60.0, entries * 21.0 + 20.0)
}

/// The corner of an `area`-sized plotting area where a `legend`-sized box (plus a little
/// padding) covers the fewest `samples`; on ties the first of upper right, upper left, lower
/// right, lower left.
fn least_hidden_corner(
    samples: &[(f64, f64)],
    (w, h): (f64, f64),
    (bw, bh): (f64, f64),
) -> SeriesLabelPosition {
    let margin = 10.0;
    let candidates = [
        (SeriesLabelPosition::UpperRight, (w - margin - bw, margin)),
        (SeriesLabelPosition::UpperLeft, (margin, margin)),
        (
            SeriesLabelPosition::LowerRight,
            (w - margin - bw, h - margin - bh),
        ),
        (SeriesLabelPosition::LowerLeft, (margin, h - margin - bh)),
    ];
    let pad = 6.0;
    candidates
        .into_iter()
        .enumerate()
        .min_by_key(|(order, (_, (x, y)))| {
            let hidden = samples
                .iter()
                .filter(|(sx, sy)| {
                    *sx >= x - pad && *sx <= x + bw + pad && *sy >= y - pad && *sy <= y + bh + pad
                })
                .count();
            (hidden, *order)
        })
        .map(|(_, (position, _))| position)
        .unwrap_or(SeriesLabelPosition::UpperRight)
}

/// The axes of a bar chart: groups along x (one unit each), values up y.
/// `'b` borrows the drawing area, `'p` the output path.
type BarAxes<'b, 'p> =
    ChartContext<'b, PngBackend<'p>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

impl BarGroup {
    /// The value of bar `b`, if there is a finite one.
    fn value(&self, b: usize) -> Option<f64> {
        self.values
            .get(b)
            .copied()
            .flatten()
            .filter(|v| v.is_finite())
    }
}

impl BarChart {
    /// Width of one bar's slot: each group spans one unit of x, its bars share the middle 80%.
    fn slot(&self) -> f64 {
        0.8 / self.bar_names.len().max(1) as f64
    }

    /// x of the left edge of bar `b`'s slot in group `g`.
    fn slot_left(&self, g: usize, b: usize) -> f64 {
        g as f64 + 0.1 + self.slot() * b as f64
    }

    /// x of the middle of bar `b`'s slot in group `g`.
    fn slot_center(&self, g: usize, b: usize) -> f64 {
        g as f64 + 0.1 + self.slot() * (b as f64 + 0.5)
    }

    /// Top of the y axis: 30% above the highest bar, leaving room for its value label.
    fn y_top(&self) -> f64 {
        let y_max = self
            .groups
            .iter()
            .flat_map(|g| g.values.iter().flatten().copied())
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max);
        if y_max > 0.0 {
            y_max * 1.3
        } else {
            1.0
        }
    }
}

/// A text style of `size` pixels in `color`, placed by the point (`h`, `v`) of the text.
fn anchored_text(size: u32, color: &'static RGBColor, h: HPos, v: VPos) -> TextStyle<'static> {
    TextStyle::from((FONT, size).into_font())
        .color(color)
        .pos(Pos::new(h, v))
}

/// Renders a grouped bar chart as a PNG at `path`.
pub fn bar_chart(path: &Path, chart_spec: &BarChart) -> Result<(), PlotError> {
    ensure_fonts();
    let root = PngBackend::new(path, (chart_spec.size.0, chart_spec.size.1 + TITLE_HEIGHT))
        .into_drawing_area();
    let body = draw_titles(&root, &chart_spec.title, &chart_spec.subtitle)?;
    let mut chart = bar_axes(&body, chart_spec)?;
    draw_bars(&mut chart, chart_spec)?;
    draw_missing_bars(&mut chart, chart_spec)?;
    draw_group_names(&root, &chart, chart_spec)?;
    draw_bar_legend(&root, &chart, chart_spec)?;
    root.present().map_err(write_err(path))?;
    Ok(())
}

/// The y axis and its grid, with room on the right for the legend; x is labelled by
/// [`draw_group_names`].
fn bar_axes<'b, 'p>(
    body: &'b DrawingArea<PngBackend<'p>, plotters::coord::Shift>,
    chart_spec: &BarChart,
) -> Result<BarAxes<'b, 'p>, PlotError> {
    let legend_width = chart_spec
        .bar_names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0) as u32
        * 10
        + 70;
    let groups = chart_spec.groups.len().max(1);
    let mut chart = ChartBuilder::on(body)
        .margin(12)
        .margin_right(24 + legend_width)
        .x_label_area_size(56)
        .y_label_area_size(78)
        .build_cartesian_2d(0.0..groups as f64, 0.0..chart_spec.y_top())
        .map_err(err("chart"))?;
    let y_fmt = |v: &f64| format_number(*v);
    let no_x = |_: &f64| String::new();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_label_formatter(&no_x)
        .y_labels(8)
        .y_label_formatter(&y_fmt)
        .y_desc(&chart_spec.y_label)
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 18))
        .light_line_style(TRANSPARENT)
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err("axes"))?;
    Ok(chart)
}

/// Every bar with its value written above it, one bar name (colour) at a time.
fn draw_bars(chart: &mut BarAxes<'_, '_>, chart_spec: &BarChart) -> Result<(), PlotError> {
    let (slot, y_hi) = (chart_spec.slot(), chart_spec.y_top());
    for b in 0..chart_spec.bar_names.len() {
        let color = PALETTE[b % PALETTE.len()];
        // (group index, value) of every group that has this bar.
        let present = || {
            let groups = chart_spec.groups.iter().enumerate();
            groups.filter_map(move |(g, group)| group.value(b).map(|v| (g, v)))
        };
        let rects: Vec<_> = present()
            .map(|(g, v)| {
                let left = chart_spec.slot_left(g, b);
                Rectangle::new(
                    [(left + slot * 0.06, 0.0), (left + slot * 0.94, v)],
                    color.filled(),
                )
            })
            .collect();
        chart.draw_series(rects).map_err(err("bars"))?;
        let style = anchored_text(15, &BLACK, HPos::Center, VPos::Bottom);
        let value_labels: Vec<_> = present()
            .map(|(g, v)| {
                let at = (chart_spec.slot_center(g, b), v + y_hi * 0.01);
                Text::new(format_number(v), at, style.clone())
            })
            .collect();
        chart.draw_series(value_labels).map_err(err("bar labels"))?;
    }
    Ok(())
}

/// Writes "n/a" where a bar has no value, so that an absent result is not read as zero.
fn draw_missing_bars(chart: &mut BarAxes<'_, '_>, chart_spec: &BarChart) -> Result<(), PlotError> {
    let y_hi = chart_spec.y_top();
    for (g, group) in chart_spec.groups.iter().enumerate() {
        for b in 0..chart_spec.bar_names.len().max(1) {
            if group.value(b).is_some() {
                continue;
            }
            let style = anchored_text(14, &RGBColor(150, 150, 150), HPos::Center, VPos::Bottom);
            let at = (chart_spec.slot_center(g, b), y_hi * 0.01);
            chart
                .draw_series(std::iter::once(Text::new("n/a", at, style)))
                .map_err(err("n/a label"))?;
        }
    }
    Ok(())
}

/// Group names under the x axis, in pixels of the whole image.
fn draw_group_names(
    root: &DrawingArea<PngBackend<'_>, plotters::coord::Shift>,
    chart: &BarAxes<'_, '_>,
    chart_spec: &BarChart,
) -> Result<(), PlotError> {
    let style = anchored_text(19, &BLACK, HPos::Center, VPos::Top);
    for (g, group) in chart_spec.groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
        root.draw_text(&group.name, &style, (px, py + 12))
            .map_err(err("group label"))?;
    }
    Ok(())
}

/// The legend right of the plotting area, where it cannot hide a bar.
fn draw_bar_legend(
    root: &DrawingArea<PngBackend<'_>, plotters::coord::Shift>,
    chart: &BarAxes<'_, '_>,
    chart_spec: &BarChart,
) -> Result<(), PlotError> {
    let style = anchored_text(17, &BLACK, HPos::Left, VPos::Center);
    let groups = chart_spec.groups.len().max(1);
    let (top_right_x, top_y) = chart.backend_coord(&(groups as f64, chart_spec.y_top()));
    for (b, bar_name) in chart_spec.bar_names.iter().enumerate() {
        let color = PALETTE[b % PALETTE.len()];
        let (x, y) = (top_right_x + 24, top_y + 14 + 28 * b as i32);
        root.draw(&Rectangle::new(
            [(x, y - 8), (x + 18, y + 8)],
            color.filled(),
        ))
        .map_err(err("legend"))?;
        root.draw_text(bar_name, &style, (x + 28, y))
            .map_err(err("legend"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bytes_and_numbers() {
        assert_eq!(format_bytes(256.0), "256 B");
        assert_eq!(format_bytes(1024.0), "1 KiB");
        assert_eq!(format_bytes(131072.0), "128 KiB");
        assert_eq!(format_bytes(1536.0 * 1024.0), "1.5 MiB");
        assert_eq!(format_number(1234.0), "1234");
        assert_eq!(format_number(0.0123456), "0.0123");
        assert_eq!(format_number(12.345), "12.3");
        assert_eq!(format_x(10.0, XScale::Log2, XFormat::Bytes), "1 KiB");
        assert_eq!(format_x(10.5, XScale::Log2, XFormat::Bytes), "");
        assert_eq!(format_x(40.0, XScale::Linear, XFormat::Percent), "40%");
        assert_eq!(format_x(2.0, XScale::Linear, XFormat::Integer), "2");
        assert_eq!(format_x(0.4, XScale::Linear, XFormat::Integer), "");
    }

    #[test]
    fn empty_panels_and_groups_still_render() {
        let dir = std::env::temp_dir().join(format!("nessie-plot-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let line = dir.join("line.png");
        let mut panel = LinePanel::new("empty", "x", "y");
        panel.series.push(Series {
            name: "cd".into(),
            points: vec![(f64::NAN, 1.0)],
        });
        let mut log_panel = LinePanel::new("log", "size", "y");
        log_panel.x_scale = XScale::Log2;
        log_panel.y_log = true;
        log_panel.series.push(Series {
            name: "sd".into(),
            points: vec![(0.0, 0.0)],
        });
        let figure = LineFigure {
            title: "t".into(),
            subtitle: "s".into(),
            panels: vec![panel, log_panel],
            columns: 2,
            panel_size: (400, 300),
        };
        line_figure(&line, &figure).unwrap();
        let bars = dir.join("bars.png");
        bar_chart(
            &bars,
            &BarChart {
                title: "t".into(),
                subtitle: "s".into(),
                y_label: "y".into(),
                bar_names: vec!["a".into(), "b".into()],
                groups: vec![BarGroup {
                    name: "g".into(),
                    values: vec![None, Some(f64::INFINITY)],
                }],
                size: (500, 400),
            },
        )
        .unwrap();
        for p in [&line, &bars] {
            let bytes = std::fs::read(p).unwrap();
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                "{} is not a PNG",
                p.display()
            );
        }
        if std::env::var_os("NESSIE_KEEP_TEST_OUTPUT").is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}
