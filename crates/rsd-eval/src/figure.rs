//! Figures as data: a [`Figure`] holds exactly the values it plots, and [`Figure::write`] draws it
//! as PNG and SVG and writes those values as JSON beside them (`STEM.png`, `STEM.svg`,
//! `STEM.json`), so a test, or a reader who wants other styling, works from the same numbers.
//!
//! Text is drawn with a bundled font (a DejaVu Sans subset, `assets/fonts/`, registered at run
//! time), so the figures look the same on every machine and nothing depends on system fonts.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rsd_common::safe_fs::{write_file_atomic, FsError};
use serde::{Deserialize, Serialize};

/// Pixel size of every figure (PNG; the SVG has the same user units).
pub const SIZE: (u32, u32) = (900, 560);

/// The bundled font (see `assets/fonts/README.md` for how the subset was made).
static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans-subset.ttf");

/// The family every text style of ours names; the bundled font is registered under it.
const FAMILY: &str = "sans-serif";

/// The most columns and rows of a heat map whose cells get their values written in them (and
/// ticks): beyond, a cell is narrower than its text.
const MAX_LABELLED_COLUMNS: usize = 24;
const MAX_LABELLED_ROWS: usize = 40;

/// Colours of successive series (matplotlib's tab10: distinguishable, also in greyscale print).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// What drawing or writing a figure can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum FigureError {
    /// The bundled font did not parse (a broken build, not a user error).
    #[error("the bundled font (assets/fonts/DejaVuSans-subset.ttf) is not a valid TrueType font")]
    Font,
    /// A file could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file could not be written safely (a link or another file in the way of its temporary).
    #[error(transparent)]
    File(#[from] FsError),
    /// plotters failed to draw or encode.
    #[error("{path}: drawing failed: {message}")]
    Draw {
        /// The figure file.
        path: PathBuf,
        /// plotters' description.
        message: String,
    },
}

/// One line of a line figure: `y[k]` at `x[k]`; `None` where there is no data (not drawn).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// x values, increasing.
    pub x: Vec<f64>,
    /// y values (`null` in JSON where a point has no data).
    pub y: Vec<Option<f64>>,
}

/// Lines with markers over a numeric x axis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lines {
    /// Caption.
    pub title: String,
    /// x-axis description.
    pub x_label: String,
    /// y-axis description.
    pub y_label: String,
    /// Fixed y range (e.g. `[0, 1]` for accuracy); `None` fits the data.
    pub y_range: Option<(f64, f64)>,
    /// The lines.
    pub series: Vec<Series>,
}

/// A matrix of values drawn as coloured cells with each value written in its cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heatmap {
    /// Caption.
    pub title: String,
    /// x-axis (column) description.
    pub x_label: String,
    /// y-axis (row) description.
    pub y_label: String,
    /// Column values, left to right.
    pub columns: Vec<f64>,
    /// Row values, top to bottom.
    pub rows: Vec<f64>,
    /// `values[r][c]` for row `r`, column `c`, in [0, 1]; `null` for an empty cell.
    pub values: Vec<Vec<Option<f64>>>,
}

/// A figure and the values it shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Figure {
    /// Line plot.
    Lines(Lines),
    /// Heat map.
    Heatmap(Heatmap),
}

fn fs_err(e: FsError) -> FigureError {
    FigureError::File(e)
}

/// An RGB image of [`SIZE`] as PNG bytes.
fn encode_png(rgb: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, SIZE.0, SIZE.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(rgb).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

fn register_font() -> Result<(), FigureError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED
        .get_or_init(|| plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).is_ok());
    ok.then_some(()).ok_or(FigureError::Font)
}

impl Figure {
    /// Writes `dir/STEM.png`, `dir/STEM.svg` and `dir/STEM.json`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<Vec<PathBuf>, FigureError> {
        register_font()?;
        std::fs::create_dir_all(dir).map_err(|source| FigureError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let png = dir.join(format!("{stem}.png"));
        let svg = dir.join(format!("{stem}.svg"));
        let json = dir.join(format!("{stem}.json"));
        let draw_err = |path: &Path| {
            let path = path.to_path_buf();
            move |e: String| FigureError::Draw {
                path: path.clone(),
                message: e,
            }
        };
        // Every file is drawn into memory, then written under a temporary name (created new, so
        // a link planted there is not followed) and renamed into place: a link planted at the
        // final name is replaced, its target never written.
        let mut rgb = vec![0u8; SIZE.0 as usize * SIZE.1 as usize * 3];
        self.draw(BitMapBackend::with_buffer(&mut rgb, SIZE).into_drawing_area())
            .map_err(draw_err(&png))?;
        let encoded = encode_png(&rgb).map_err(draw_err(&png))?;
        write_file_atomic(&png, &encoded).map_err(fs_err)?;
        let mut svg_text = String::new();
        self.draw(SVGBackend::with_string(&mut svg_text, SIZE).into_drawing_area())
            .map_err(draw_err(&svg))?;
        write_file_atomic(&svg, svg_text.as_bytes()).map_err(fs_err)?;
        let text = serde_json::to_string_pretty(self).map_err(|e| FigureError::Draw {
            path: json.clone(),
            message: e.to_string(),
        })?;
        write_file_atomic(&json, (text + "\n").as_bytes()).map_err(fs_err)?;
        Ok(vec![png, svg, json])
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), String> {
        let result = match self {
            Figure::Lines(f) => draw_lines(&root, f),
            Figure::Heatmap(f) => draw_heatmap(&root, f),
        };
        result.map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The y range drawn: the fixed one, or the data's with 5% room (1 around a constant).
fn y_bounds(f: &Lines) -> (f64, f64) {
    if let Some(r) = f.y_range {
        return r;
    }
    let ys = f.series.iter().flat_map(|s| s.y.iter().flatten().copied());
    let (lo, hi) = ys
        .filter(|y| y.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), y| {
            (lo.min(y), hi.max(y))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { 0.05 * (hi - lo) } else { 1.0 };
    (lo - pad, hi + pad)
}

fn x_bounds(f: &Lines) -> (f64, f64) {
    let xs = f.series.iter().flat_map(|s| s.x.iter().copied());
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let pad = if hi > lo { 0.03 * (hi - lo) } else { 0.5 };
    (lo - pad, hi + pad)
}

fn draw_lines<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, f: &Lines) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (x0, x1) = x_bounds(f);
    let (y0, y1) = y_bounds(f);
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x0..x1, y0..y1)?;
    chart
        .configure_mesh()
        .x_desc(f.x_label.as_str())
        .y_desc(f.y_label.as_str())
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (k, s) in f.series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let points: Vec<(f64, f64)> =
            s.x.iter()
                .zip(&s.y)
                .filter_map(|(&x, y)| y.filter(|y| y.is_finite()).map(|y| (x, y)))
                .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(2))
            });
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerLeft)
        .draw()?;
    Ok(())
}

/// Cell colour for a value in [0, 1]: YlGnBu's light yellow (0), teal (0.5) and dark blue (1),
/// interpolated linearly (a two-colour blend would pass through grey).
fn cell_color(v: f64) -> RGBColor {
    const STOPS: [(f64, f64, f64); 3] = [
        (255.0, 255.0, 204.0),
        (65.0, 182.0, 196.0),
        (37.0, 52.0, 148.0),
    ];
    let t = v.clamp(0.0, 1.0) * 2.0;
    let (a, b, u) = if t <= 1.0 {
        (STOPS[0], STOPS[1], t)
    } else {
        (STOPS[1], STOPS[2], t - 1.0)
    };
    let mix = |x: f64, y: f64| (x + (y - x) * u).round() as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn draw_heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, f: &Heatmap) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (nc, nr) = (f.columns.len().max(1), f.rows.len().max(1));
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(56)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..nc as f64, 0f64..nr as f64)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(0)
        .y_labels(0)
        .x_desc(f.x_label.as_str())
        .y_desc(f.y_label.as_str())
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    // Row 0 at the top, as in the paper's heat maps (depth 0 = the start of the context).
    let top = |r: usize| (nr - r) as f64;
    // A value is written in its cell only where the cell can hold it: a many-celled map stays
    // a picture (its values are in the JSON beside it), and its size stays linear in the cells.
    let values_fit = nc <= MAX_LABELLED_COLUMNS && nr <= MAX_LABELLED_ROWS;
    for (r, row) in f.values.iter().enumerate() {
        for (c, v) in row.iter().enumerate() {
            let (x, y) = (c as f64, top(r));
            let fill = v.map_or(RGBColor(220, 220, 220), cell_color);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, y - 1.0), (x + 1.0, y)],
                fill.filled(),
            )))?;
            if !values_fit {
                continue;
            }
            let text = v.map_or("–".to_string(), |v| format!("{v:.2}"));
            let ink = if v.is_some_and(|v| v > 0.55) {
                WHITE
            } else {
                BLACK
            };
            let style = TextStyle::from((FAMILY, 14).into_font())
                .color(&ink)
                .pos(Pos::new(HPos::Center, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(text, (x + 0.5, y - 0.5), style)))?;
        }
    }
    let tick = TextStyle::from((FAMILY, 14).into_font()).color(&BLACK);
    if !values_fit {
        // Tick labels would overlap too; the axis descriptions and the JSON say what is where.
        return Ok(());
    }
    for (c, v) in f.columns.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(c as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            short_number(*v),
            (px, py + 6),
            tick.pos(Pos::new(HPos::Center, VPos::Top)),
        ))?;
    }
    for (r, v) in f.rows.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(0.0, top(r) - 0.5));
        root.draw(&Text::new(
            short_number(*v),
            (px - 6, py),
            tick.pos(Pos::new(HPos::Right, VPos::Center)),
        ))?;
    }
    Ok(())
}

/// `1024` → "1024", `0.25` → "0.25": tick labels without trailing zeros.
fn short_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_png_svg_and_the_values() {
        let dir = tempfile::tempdir().unwrap();
        let fig = Figure::Heatmap(Heatmap {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            columns: vec![1024.0, 2048.0],
            rows: vec![0.0, 0.5],
            values: vec![vec![Some(1.0), None], vec![Some(0.25), Some(0.5)]],
        });
        let paths = fig.write(dir.path(), "h").unwrap();
        let png = std::fs::read(&paths[0]).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(&paths[1]).unwrap();
        assert!(svg.contains("<svg") && svg.contains("0.25"), "{svg}");
        let back: Figure =
            serde_json::from_str(&std::fs::read_to_string(&paths[2]).unwrap()).unwrap();
        assert_eq!(back, fig);
    }

    #[test]
    fn planted_links_are_replaced_and_their_targets_never_written() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious.txt");
        std::fs::write(&target, "keep me").unwrap();
        let plots = dir.path().join("plots");
        std::fs::create_dir_all(&plots).unwrap();
        for ext in ["png", "svg", "json"] {
            std::os::unix::fs::symlink(&target, plots.join(format!("h.{ext}"))).unwrap();
        }
        let fig = Figure::Lines(Lines {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            y_range: None,
            series: vec![Series {
                name: "s".into(),
                x: vec![0.0, 1.0],
                y: vec![Some(0.5), None],
            }],
        });
        fig.write(&plots, "h").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        for ext in ["png", "svg", "json"] {
            let meta = std::fs::symlink_metadata(plots.join(format!("h.{ext}"))).unwrap();
            assert!(meta.file_type().is_file(), "h.{ext} is still a link");
        }
        // A link planted at the temporary name stops the write, naming it.
        std::os::unix::fs::symlink(&target, plots.join("h.png.tmp")).unwrap();
        let e = fig.write(&plots, "h").unwrap_err().to_string();
        assert!(
            e.contains("h.png.tmp: a symbolic link where rsd writes its temporary file"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn tick_labels_drop_trailing_zeros() {
        assert_eq!(short_number(4096.0), "4096");
        assert_eq!(short_number(0.25), "0.25");
        assert_eq!(short_number(0.1), "0.1");
    }
}
