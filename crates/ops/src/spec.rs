//! Transforms declared as data: for each field, a list of ops with parameters, written as
//! JSON (a config file, the CLI's `--transform`, Python's `transforms=`), the same wherever
//! it comes from.
//!
//! ```json
//! {
//!   "jpg;png": {"as": "image", "ops": [
//!     {"op": "decode"},
//!     {"op": "random_resized_crop", "size": 224},
//!     {"op": "horizontal_flip", "p": 0.5},
//!     {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
//!     {"op": "chw"}
//!   ]},
//!   "cls": [{"op": "label"}]
//! }
//! ```
//!
//! A key names a field, or several separated by `;` (the first one a sample has is used, as
//! in `webdataset`'s `to_tuple("jpg;png")`); its value is the op list, or an object with
//! `ops`, `as` (the output field's name) and `optional` (a sample without the field passes).
//! Fields are processed in sorted key order; fields not named pass through unchanged.
//!
//! The ops, by what they take:
//!
//! | op | takes | gives |
//! | --- | --- | --- |
//! | `decode` (`mode`: `rgb` or `gray`; `reduced`: default true, see [`Op::Decode`]) | JPEG or PNG bytes | image, `uint8 [H, W, C]` |
//! | `resize` (`size`: shorter side, or `[h, w]`; `max_size`) | image | image |
//! | `center_crop` (`size`) | image | image (zero-padded if larger) |
//! | `random_resized_crop` (`size`, `scale` = `[0.08, 1]`, `ratio` = `[3/4, 4/3]`) | image | image |
//! | `horizontal_flip` (`p` = 0.5) | image | image |
//! | `normalize` (`mean`, `std` per channel, in `[0, 1]` units as torchvision's) | image | `float32 [H, W, C]`: `(x / 255 - mean) / std` |
//! | `chw` | image or normalized | `[C, H, W]` |
//! | `cast` (`dtype`) | image, normalized or array | the same values as `dtype` |
//! | `label` | bytes holding an integer (`cls`, `txt`) | `int64` scalar |
//! | `npy` | `.npy` bytes | the array |
//! | `text` | UTF-8 bytes | text |
//! | `json` | JSON bytes: a number, a list of numbers or a string | scalar, 1-D array or text |
//!
//! Randomness (`random_resized_crop`, `horizontal_flip`) comes only from the sample's RNG, so
//! crops and flips depend on (seed, epoch, sample), never on the worker. When `decode` is
//! followed by `random_resized_crop` or `resize`, the crop is drawn from the image's header
//! size before decoding, so the decoder may decode at a reduced size where the output is much
//! smaller: the same crop either way.

use std::str::FromStr;

use bytes::Bytes;
use chute_core::{Array, BoxError, ConfigError, DType, Field, FieldName, Sample, SampleRng};

use serde::Deserialize;

use crate::image::{self, ColorMode, Image};
use crate::{Slot, Transform};

/// An output size: one number (square, or the shorter side for `resize`) or `[h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Size {
    /// One number.
    One(usize),
    /// Height and width.
    Two([usize; 2]),
}

impl Size {
    fn square(self) -> (usize, usize) {
        match self {
            Size::One(n) => (n, n),
            Size::Two([h, w]) => (h, w),
        }
    }
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}

fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}

fn half() -> f64 {
    0.5
}

/// One op (see the module docs for what each takes and gives).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
#[non_exhaustive]
pub enum Op {
    /// JPEG or PNG bytes to `uint8 [H, W, C]`.
    Decode {
        /// `rgb` (default) or `gray`.
        #[serde(default)]
        mode: ColorMode,
        /// When a crop or resize follows, decode only the crop's region and at a reduced size
        /// (JPEG DCT scaling to 1/2, 1/4, 1/8) where that still covers the output (default
        /// true). `false` decodes the whole picture at full size first, as torchvision does:
        /// slower, with pixels closer to torchvision's.
        #[serde(default = "yes")]
        reduced: bool,
    },
    /// torchvision's `Resize`: the shorter side to `size` (or exactly `[h, w]`).
    Resize {
        /// Shorter side, or `[h, w]`.
        size: Size,
        /// Cap on the longer side (with a single `size`).
        #[serde(default)]
        max_size: Option<usize>,
    },
    /// torchvision's `CenterCrop`.
    CenterCrop {
        /// Side, or `[h, w]`.
        size: Size,
    },
    /// torchvision's `RandomResizedCrop` (bilinear, antialiased).
    RandomResizedCrop {
        /// Output side, or `[h, w]`.
        size: Size,
        /// Range of the crop's area as a fraction of the image's.
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        /// Range of the crop's aspect ratio (width / height).
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    /// torchvision's `RandomHorizontalFlip`.
    #[serde(alias = "random_horizontal_flip")]
    HorizontalFlip {
        /// Probability of flipping.
        #[serde(default = "half")]
        p: f64,
    },
    /// `ToTensor` then `Normalize`: `(x / 255 - mean) / std` per channel, as `float32`.
    Normalize {
        /// Per-channel mean, in `[0, 1]` units.
        mean: Vec<f32>,
        /// Per-channel standard deviation, in `[0, 1]` units.
        std: Vec<f32>,
    },
    /// `[H, W, C]` to `[C, H, W]`.
    Chw,
    /// A dtype for the batch (`float16`, `int64`, ...).
    Cast {
        /// numpy name of the dtype.
        dtype: String,
    },
    /// Bytes holding an integer (`cls`, `txt`) to an `int64` scalar.
    Label,
    /// `.npy` bytes to the array they hold.
    Npy,
    /// UTF-8 bytes to text (checked).
    Text,
    /// JSON bytes: a number, a list of numbers or a string.
    Json,
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Decode { .. } => "decode",
            Op::Resize { .. } => "resize",
            Op::CenterCrop { .. } => "center_crop",
            Op::RandomResizedCrop { .. } => "random_resized_crop",
            Op::HorizontalFlip { .. } => "horizontal_flip",
            Op::Normalize { .. } => "normalize",
            Op::Chw => "chw",
            Op::Cast { .. } => "cast",
            Op::Label => "label",
            Op::Npy => "npy",
            Op::Text => "text",
            Op::Json => "json",
        }
    }
}

/// What a field holds between ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bytes,
    Image,
    /// Normalized pixels, `float32 [H, W, C]`.
    Float,
    Array,
    Text,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Bytes => "encoded bytes",
            Kind::Image => "a decoded image",
            Kind::Float => "normalized pixels",
            Kind::Array => "an array",
            Kind::Text => "text",
        }
    }
}

/// The kind `op` gives from `input`, or why it cannot take it.
fn step(op: &Op, input: Kind) -> Result<Kind, String> {
    let out = match (op, input) {
        (Op::Decode { .. } | Op::Label | Op::Npy | Op::Json, Kind::Bytes) => match op {
            Op::Decode { .. } => Kind::Image,
            _ => Kind::Array,
        },
        (Op::Text, Kind::Bytes) => Kind::Text,
        (
            Op::Resize { .. }
            | Op::CenterCrop { .. }
            | Op::RandomResizedCrop { .. }
            | Op::HorizontalFlip { .. },
            Kind::Image,
        ) => Kind::Image,
        (Op::Normalize { .. }, Kind::Image) => Kind::Float,
        (Op::Chw | Op::Cast { .. }, Kind::Image | Kind::Float | Kind::Array) => Kind::Array,
        _ => {
            let needs = match op {
                Op::Decode { .. } | Op::Label | Op::Npy | Op::Json | Op::Text => {
                    "the field's bytes (put it first)"
                }
                Op::Normalize { .. } => "a decoded image (after decode and the geometric ops)",
                Op::Chw | Op::Cast { .. } => "an image, normalized pixels or an array",
                _ => "a decoded image (after decode, before normalize, chw and cast)",
            };
            return Err(format!(
                "{} needs {needs}, but gets {}",
                op.name(),
                input.describe()
            ));
        }
    };
    Ok(out)
}

/// One field's ops.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldOps {
    /// Names to look for, in order (the first one present is used).
    pub names: Vec<String>,
    /// The output field's name; by default the name found.
    pub output: Option<String>,
    /// The ops, in order.
    pub ops: Vec<Op>,
    /// Whether a sample without the field passes unchanged (otherwise it is an error).
    pub optional: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum FieldEntry {
    Ops(Vec<Op>),
    Full {
        ops: Vec<Op>,
        #[serde(default, rename = "as")]
        output: Option<String>,
        #[serde(default)]
        optional: bool,
    },
}

/// Ops per field, declared as data; a [`Transform`].
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    fields: Vec<FieldOps>,
    /// Batch columns written in place (see [`Transform::slots`]).
    slots: Vec<Slot>,
    /// Per field: its slot index and the op that writes into the slot, if it has one.
    direct: Vec<Option<Direct>>,
}

/// How a field with a fixed output shape is written into its batch slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Direct {
    slot: usize,
    /// The op whose output goes straight into the slot (later ops only flip it in place);
    /// `None`: the final value is converted into the slot.
    writer: Option<usize>,
}

impl Pipeline {
    /// A pipeline of `fields`, checked: every op must take what the op before it gives.
    pub fn new(fields: Vec<FieldOps>) -> Result<Pipeline, ConfigError> {
        for f in &fields {
            let field = f.names.join(";");
            if f.names.is_empty() || f.names.iter().any(String::is_empty) {
                return Err(ConfigError::new(
                    "transform",
                    format!("field {field:?}: an empty field name"),
                ));
            }
            let mut kind = Kind::Bytes;
            for (i, op) in f.ops.iter().enumerate() {
                kind = step(op, kind).map_err(|why| {
                    ConfigError::new("transform", format!("field {field:?}, op {}: {why}", i + 1))
                })?;
                check_params(op).map_err(|why| {
                    ConfigError::new(
                        "transform",
                        format!("field {field:?}, op {} ({}): {why}", i + 1, op.name()),
                    )
                })?;
            }
        }
        let mut slots = Vec::new();
        let direct = fields
            .iter()
            .map(|f| {
                // Written in place only when the output's name and shape are known up front.
                let name = f.output.clone().or_else(|| match &f.names[..] {
                    [one] => Some(one.clone()),
                    _ => None,
                })?;
                let (dtype, shape) = static_output(&f.ops)?;
                if f.optional || slots.iter().any(|s: &Slot| s.name == name) {
                    return None;
                }
                slots.push(Slot { name, dtype, shape });
                Some(Direct {
                    slot: slots.len() - 1,
                    writer: writer(&f.ops),
                })
            })
            .collect();
        Ok(Pipeline {
            fields,
            slots,
            direct,
        })
    }

    /// Parses the JSON form (see the module docs).
    pub fn from_json(text: &str) -> Result<Pipeline, ConfigError> {
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|e| {
                ConfigError::new(
                    "transform",
                    format!(
                        "not a JSON object of field -> ops ({e}); write e.g. \
                         {{\"jpg\": [{{\"op\": \"decode\"}}], \"cls\": [{{\"op\": \"label\"}}]}}"
                    ),
                )
            })?;
        let mut fields = Vec::new();
        for (key, value) in map {
            let entry: FieldEntry = serde_json::from_value(value.clone()).map_err(|_| {
                // Untagged enums hide the cause: parse the ops alone for a useful message.
                let ops = value.get("ops").cloned().unwrap_or(value);
                let why = serde_json::from_value::<Vec<Op>>(ops).err().map_or_else(
                    || "unknown keys (use ops, as, optional)".into(),
                    |e| e.to_string(),
                );
                ConfigError::new("transform", format!("field {key:?}: {why}"))
            })?;
            let (ops, output, optional) = match entry {
                FieldEntry::Ops(ops) => (ops, None, false),
                FieldEntry::Full {
                    ops,
                    output,
                    optional,
                } => (ops, output, optional),
            };
            fields.push(FieldOps {
                names: key.split(';').map(|s| s.trim().to_string()).collect(),
                output,
                ops,
                optional,
            });
        }
        Pipeline::new(fields)
    }

    /// The fields and their ops.
    pub fn fields(&self) -> &[FieldOps] {
        &self.fields
    }
}

impl FromStr for Pipeline {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pipeline::from_json(s)
    }
}

/// The batch dtype and per-sample shape `ops` always produce, if fixed by the ops alone.
fn static_output(ops: &[Op]) -> Option<(DType, Vec<usize>)> {
    let (mut channels, mut size, mut dtype, mut chw) = (None, None, DType::U8, false);
    let mut scalar = false;
    for op in ops {
        match op {
            Op::Decode { mode, .. } => channels = Some(mode.channels()),
            Op::Resize {
                size: Size::Two([h, w]),
                ..
            } => size = Some((*h, *w)),
            Op::Resize { .. } => size = None,
            Op::CenterCrop { size: s } | Op::RandomResizedCrop { size: s, .. } => {
                size = Some(s.square());
            }
            Op::HorizontalFlip { .. } => {}
            Op::Normalize { mean, .. } => {
                // A mean per channel that does not match is an error at run time.
                if mean.len() != 1 && Some(mean.len()) != channels {
                    return None;
                }
                dtype = DType::F32;
            }
            Op::Chw => chw = true,
            Op::Cast { dtype: d } => dtype = DType::from_str(d).ok()?,
            Op::Label => {
                scalar = true;
                dtype = DType::I64;
            }
            Op::Npy | Op::Text | Op::Json => return None,
        }
    }
    if scalar {
        return Some((dtype, Vec::new()));
    }
    let (c, (h, w)) = (channels?, size?);
    Some((dtype, if chw { vec![c, h, w] } else { vec![h, w, c] }))
}

/// The op of `ops` that can write its output straight into the batch slot: a trailing
/// `normalize` (optionally followed by `chw`), or the last resize/crop when only flips follow
/// it.
fn writer(ops: &[Op]) -> Option<usize> {
    let last = ops.len().checked_sub(1)?;
    match &ops[last] {
        Op::Normalize { .. } => return Some(last),
        Op::Chw if last > 0 && matches!(ops[last - 1], Op::Normalize { .. }) => {
            return Some(last - 1);
        }
        _ => {}
    }
    let j = ops
        .iter()
        .rposition(|op| !matches!(op, Op::HorizontalFlip { .. }))?;
    match &ops[j] {
        Op::RandomResizedCrop { .. }
        | Op::CenterCrop { .. }
        | Op::Resize {
            size: Size::Two(_), ..
        } => Some(j),
        _ => None,
    }
}

fn yes() -> bool {
    true
}

fn check_params(op: &Op) -> Result<(), String> {
    let positive = |s: Size| {
        let (h, w) = s.square();
        if h == 0 || w == 0 {
            Err("a size of 0".to_string())
        } else {
            Ok(())
        }
    };
    match op {
        Op::Resize { size, max_size } => {
            positive(*size)?;
            if let (Size::One(n), Some(m)) = (size, max_size)
                && m <= n
            {
                return Err(format!("max_size {m} must be larger than size {n}"));
            }
        }
        Op::CenterCrop { size } => positive(*size)?,
        Op::RandomResizedCrop { size, scale, ratio } => {
            positive(*size)?;
            if !(scale[0] > 0.0 && scale[0] <= scale[1]) {
                return Err(format!("scale {scale:?}: want 0 < lo <= hi"));
            }
            if !(ratio[0] > 0.0 && ratio[0] <= ratio[1]) {
                return Err(format!("ratio {ratio:?}: want 0 < lo <= hi"));
            }
        }
        Op::HorizontalFlip { p } if !(0.0..=1.0).contains(p) => {
            return Err(format!("p = {p}: a probability is in [0, 1]"));
        }
        Op::Normalize { mean, std } => {
            if mean.is_empty() || mean.len() != std.len() {
                return Err(format!(
                    "{} means and {} standard deviations; give one of each per channel",
                    mean.len(),
                    std.len()
                ));
            }
            if std.iter().any(|&s| s == 0.0 || !s.is_finite()) {
                return Err("a standard deviation of 0 (or not finite)".into());
            }
        }
        Op::Cast { dtype } => {
            DType::from_str(dtype).map_err(|e| e.to_string())?;
        }
        _ => {}
    }
    Ok(())
}

/// A field's value between ops.
enum Value {
    Bytes(Bytes),
    Image(Image),
    Float {
        h: usize,
        w: usize,
        c: usize,
        data: Vec<f32>,
    },
    Array(Array),
    Text(Bytes),
    /// An `h x w x c` `uint8` image (or the final value) already in the batch slot.
    InSlot {
        h: usize,
        w: usize,
        c: usize,
    },
}

/// A sample whose data an op cannot use: an undecodable image, a label that is not a number,
/// a missing field. The loader reports it with the sample's key and shard; with
/// `on_error = skip` the sample is counted and replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadData(pub String);

impl std::fmt::Display for BadData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadData {}

impl Transform for Pipeline {
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        self.apply_fields(sample, rng, None)
            .map_err(|e| Box::new(BadData(e)) as BoxError)
    }

    fn name(&self) -> &str {
        "transform"
    }

    /// Fields with a fixed output shape and name: image ops ending in a crop or a fixed-size
    /// resize (then flips, normalize, chw, cast), and labels.
    fn slots(&self) -> &[Slot] {
        &self.slots
    }

    fn apply_into(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRng,
        out: &mut [&mut [u8]],
    ) -> Result<(), BoxError> {
        self.apply_fields(sample, rng, Some(out))
            .map_err(|e| Box::new(BadData(e)) as BoxError)
    }
}

impl Pipeline {
    /// Runs every field's ops; with `out`, fields that have a slot are written into it.
    fn apply_fields(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRng,
        mut out: Option<&mut [&mut [u8]]>,
    ) -> Result<(), String> {
        for (f, direct) in self.fields.iter().zip(&self.direct) {
            let Some(name) = f.names.iter().find(|n| sample.get(n).is_some()) else {
                if f.optional {
                    continue;
                }
                let have: Vec<&str> = sample.fields.iter().map(|(n, _)| n.as_ref()).collect();
                return Err(format!(
                    "no field {:?} (the sample has {have:?}); name the field the data has, or \
                     mark it optional",
                    f.names.join(";")
                ));
            };
            let name = name.clone();
            let field = sample.remove(&name).expect("present");
            let value = match field {
                Field::Bytes(b) | Field::Text(b) => Value::Bytes(b),
                Field::Array(a) => Value::Array(a),
                other => {
                    return Err(format!("field {name:?} holds {other:?}, not bytes"));
                }
            };
            let in_slot = match (direct, out.as_deref_mut()) {
                (Some(d), Some(out)) => Some((d, &mut *out[d.slot])),
                _ => None,
            };
            let context = |e: String| format!("field {name:?}: {e}");
            if let Some((d, dst)) = in_slot {
                let slot = &self.slots[d.slot];
                // The slot's column replaces a field of that name, as setting it would.
                sample.remove(&slot.name);
                let value =
                    run(&f.ops, value, rng, Some((&mut *dst, d.writer))).map_err(context)?;
                if !matches!(value, Value::InSlot { .. }) {
                    let mut tmp = Sample::new(sample.index);
                    tmp.set(FieldName::Owned(slot.name.clone()), into_field(value));
                    slot.fill_from(&mut tmp, dst)
                        .map_err(|e| context(e.to_string()))?;
                }
                continue;
            }
            let value = run(&f.ops, value, rng, None).map_err(context)?;
            let output = f.output.clone().unwrap_or(name);
            sample.set(FieldName::Owned(output), into_field(value));
        }
        Ok(())
    }
}

/// A final value as a sample field.
fn into_field(value: Value) -> Field {
    match value {
        Value::Bytes(b) => Field::Bytes(b),
        Value::Text(b) => Field::Text(b),
        Value::Array(a) => Field::Array(a),
        Value::Image(img) => Field::Array(Array::new(
            DType::U8,
            vec![img.height, img.width, img.channels],
            img.data.into(),
        )),
        Value::Float { h, w, c, data } => Field::Array(float_array(vec![h, w, c], &data)),
        Value::InSlot { .. } => unreachable!("values in a slot are never fields"),
    }
}

fn float_array(shape: Vec<usize>, data: &[f32]) -> Array {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    Array::new(DType::F32, shape, bytes.into())
}

/// A batch slot and the op that writes into it (see [`Direct`]).
type SlotOut<'a> = Option<(&'a mut [u8], Option<usize>)>;

/// The slot, when op `at` is the one that writes into it.
fn slot_for<'s>(slot: &'s mut SlotOut<'_>, at: usize) -> Option<&'s mut [u8]> {
    match slot {
        Some((dst, Some(w))) if *w == at => Some(&mut **dst),
        _ => None,
    }
}

/// Runs `ops` on `value` (already checked to fit together). With `slot`, the writer op puts
/// its output straight into the slot (the result is then [`Value::InSlot`]).
fn run(
    ops: &[Op],
    mut value: Value,
    rng: &mut SampleRng,
    mut slot: SlotOut<'_>,
) -> Result<Value, String> {
    let mut i = 0;
    while i < ops.len() {
        let op = &ops[i];
        let here = i;
        i += 1;
        value = match (op, value) {
            (Op::Decode { mode, reduced }, Value::Bytes(b)) => {
                // Fused with the op after it where that lets the decoder shrink the work.
                match ops.get(i).filter(|_| *reduced) {
                    Some(Op::RandomResizedCrop { size, scale, ratio }) => {
                        i += 1;
                        let (h, w) = image::image_size(&b)?;
                        let crop = image::random_resized_crop_params(h, w, *scale, *ratio, rng);
                        let (oh, ow) = size.square();
                        decode_crop_resize(
                            &b,
                            *mode,
                            (h, w),
                            crop,
                            (oh, ow),
                            slot_for(&mut slot, here + 1),
                        )?
                    }
                    Some(Op::Resize { size, max_size }) => {
                        i += 1;
                        let (h, w) = image::image_size(&b)?;
                        let (oh, ow) = match size {
                            Size::One(n) => image::resize_shorter(h, w, *n, *max_size),
                            Size::Two([h, w]) => (*h, *w),
                        };
                        let full = image::Rect {
                            top: 0,
                            left: 0,
                            height: h,
                            width: w,
                        };
                        decode_crop_resize(
                            &b,
                            *mode,
                            (h, w),
                            full,
                            (oh, ow),
                            slot_for(&mut slot, here + 1),
                        )?
                    }
                    _ => Value::Image(image::decode(&b, *mode, None)?),
                }
            }
            (Op::Resize { size, max_size }, Value::Image(img)) => {
                let (oh, ow) = match size {
                    Size::One(n) => image::resize_shorter(img.height, img.width, *n, *max_size),
                    Size::Two([h, w]) => (*h, *w),
                };
                match slot_for(&mut slot, here) {
                    Some(dst) => {
                        img.resize_into(None, oh, ow, dst)?;
                        Value::InSlot {
                            h: oh,
                            w: ow,
                            c: img.channels,
                        }
                    }
                    None => Value::Image(img.resize(None, oh, ow)?),
                }
            }
            (Op::CenterCrop { size }, Value::Image(img)) => {
                let (ch, cw) = size.square();
                let (top, left) = image::center_crop_offsets(img.height, img.width, ch, cw);
                let cropped = img.padded_crop(top, left, ch, cw);
                match slot_for(&mut slot, here) {
                    Some(dst) => {
                        dst.copy_from_slice(&cropped.data);
                        Value::InSlot {
                            h: ch,
                            w: cw,
                            c: img.channels,
                        }
                    }
                    None => Value::Image(cropped),
                }
            }
            (Op::RandomResizedCrop { size, scale, ratio }, Value::Image(img)) => {
                let crop =
                    image::random_resized_crop_params(img.height, img.width, *scale, *ratio, rng);
                let (oh, ow) = size.square();
                match slot_for(&mut slot, here) {
                    Some(dst) => {
                        img.resize_into(Some(crop), oh, ow, dst)?;
                        Value::InSlot {
                            h: oh,
                            w: ow,
                            c: img.channels,
                        }
                    }
                    None => Value::Image(img.resize(Some(crop), oh, ow)?),
                }
            }
            (Op::HorizontalFlip { p }, Value::Image(mut img)) => {
                if rng.chance(*p) {
                    img.flip_horizontal();
                }
                Value::Image(img)
            }
            (Op::HorizontalFlip { p }, Value::InSlot { h, w, c }) => {
                if rng.chance(*p)
                    && let Some((dst, _)) = &mut slot
                {
                    image::flip_horizontal(dst, w, c);
                }
                Value::InSlot { h, w, c }
            }
            (Op::Normalize { mean, std }, Value::Image(img)) => {
                let c = img.channels;
                if mean.len() != c && mean.len() != 1 {
                    return Err(format!(
                        "normalize has {} means for an image of {c} channels",
                        mean.len()
                    ));
                }
                let (h, w) = (img.height, img.width);
                match slot_for(&mut slot, here) {
                    Some(dst) => {
                        // Straight into the slot, as [C, H, W] when chw follows.
                        let chw = matches!(ops.get(i), Some(Op::Chw));
                        if chw {
                            i += 1;
                        }
                        normalize(&img, mean, std, chw, |at, v| {
                            dst[at * 4..at * 4 + 4].copy_from_slice(&v.to_le_bytes());
                        });
                        Value::InSlot { h, w, c }
                    }
                    None => {
                        let mut data = vec![0f32; h * w * c];
                        normalize(&img, mean, std, false, |at, v| data[at] = v);
                        Value::Float { h, w, c, data }
                    }
                }
            }
            (Op::Chw, Value::Image(img)) => Value::Array(Array::new(
                DType::U8,
                vec![img.channels, img.height, img.width],
                hwc_to_chw(&img.data, img.height, img.width, img.channels, 1).into(),
            )),
            (Op::Chw, Value::Float { h, w, c, data }) => {
                let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::Array(Array::new(
                    DType::F32,
                    vec![c, h, w],
                    hwc_to_chw(&bytes, h, w, c, 4).into(),
                ))
            }
            (Op::Chw, Value::Array(a)) => {
                let [h, w, c] = a.shape[..] else {
                    return Err(format!("chw needs [H, W, C], the array is {:?}", a.shape));
                };
                let size = a.dtype.size();
                let data = hwc_to_chw(&a.data, h, w, c, size);
                let mut out = Array::new(a.dtype, vec![c, h, w], data.into());
                out.cast = a.cast;
                Value::Array(out)
            }
            (Op::Cast { dtype }, v) => {
                let dtype = DType::from_str(dtype).map_err(|e| e.to_string())?;
                let mut a = match v {
                    Value::Image(img) => Array::new(
                        DType::U8,
                        vec![img.height, img.width, img.channels],
                        img.data.into(),
                    ),
                    Value::Float { h, w, c, data } => float_array(vec![h, w, c], &data),
                    Value::Array(a) => a,
                    _ => unreachable!("checked when the pipeline was built"),
                };
                a.cast = Some(dtype);
                Value::Array(a)
            }
            (Op::Label, Value::Bytes(b)) => Value::Array(Array::scalar_i64(parse_label(&b)?)),
            (Op::Npy, Value::Bytes(b)) => {
                let (header, data) =
                    chute_formats::read_npy(&b, "the field").map_err(|e| e.to_string())?;
                let start = data.as_ptr() as usize - b.as_ptr() as usize;
                Value::Array(Array::new(
                    header.dtype(),
                    header.shape().to_vec(),
                    b.slice(start..start + data.len()),
                ))
            }
            (Op::Text, Value::Bytes(b)) => {
                std::str::from_utf8(&b).map_err(|e| format!("not UTF-8 text: {e}"))?;
                Value::Text(b)
            }
            (Op::Json, Value::Bytes(b)) => json_value(&b)?,
            (op, _) => {
                return Err(format!(
                    "{} got a value it does not take (a bug: the pipeline was checked)",
                    op.name()
                ));
            }
        };
    }
    Ok(value)
}

/// Decodes `data` (an `h` x `w` image) and resizes its region `crop` to `out`, letting the
/// decoder work at a reduced size and on the crop's region alone where it can. With `dst`,
/// the result goes there (a batch slot) instead of into a new image.
fn decode_crop_resize(
    data: &[u8],
    mode: ColorMode,
    (h, w): (usize, usize),
    crop: image::Rect,
    (oh, ow): (usize, usize),
    dst: Option<&mut [u8]>,
) -> Result<Value, String> {
    let jpeg = image::sniff(data) == Some(image::ImageFormat::Jpeg);
    let decoded = if jpeg {
        crate::jpeg::decode_crop(data, mode, (h, w), crop, (oh, ow))?
    } else {
        None
    };
    let (img, at) = match decoded {
        Some(decoded) => decoded,
        None => {
            let img = image::decode(data, mode, None)?;
            let at = [
                crop.top as f64,
                crop.left as f64,
                crop.height as f64,
                crop.width as f64,
            ];
            (img, at)
        }
    };
    let c = img.channels;
    let resize_into = |dst: &mut [u8]| {
        if at.iter().all(|v| v.fract() == 0.0) {
            let rect = image::Rect {
                top: at[0] as usize,
                left: at[1] as usize,
                height: at[2] as usize,
                width: at[3] as usize,
            };
            img.resize_into(Some(rect), oh, ow, dst)
        } else {
            img.resize_f_into(at, oh, ow, dst)
        }
    };
    match dst {
        Some(dst) => {
            resize_into(dst)?;
            Ok(Value::InSlot { h: oh, w: ow, c })
        }
        None => {
            let mut out = Image::zeros(oh, ow, c);
            resize_into(&mut out.data)?;
            Ok(Value::Image(out))
        }
    }
}

/// `ToTensor` + `Normalize`: `(x / 255 - mean) / std` per channel, as one multiply-add per
/// value; `put(index, value)` receives each value at its `[H, W, C]` (or `[C, H, W]`) index.
fn normalize(img: &Image, mean: &[f32], std: &[f32], chw: bool, mut put: impl FnMut(usize, f32)) {
    let c = img.channels;
    let (scale, shift): (Vec<f32>, Vec<f32>) = (0..c)
        .map(|k| {
            let (m, s) = if mean.len() == 1 {
                (mean[0], std[0])
            } else {
                (mean[k], std[k])
            };
            (1.0 / (255.0 * s), -m / s)
        })
        .unzip();
    let plane = img.height * img.width;
    for (p, px) in img.data.chunks_exact(c).enumerate() {
        for k in 0..c {
            let at = if chw { k * plane + p } else { p * c + k };
            put(at, f32::from(px[k]) * scale[k] + shift[k]);
        }
    }
}

/// `[H, W, C]` elements of `size` bytes to `[C, H, W]`.
fn hwc_to_chw(data: &[u8], h: usize, w: usize, c: usize, size: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    let plane = h * w * size;
    for (p, px) in data.chunks_exact(c * size).enumerate() {
        for k in 0..c {
            let dst = k * plane + p * size;
            out[dst..dst + size].copy_from_slice(&px[k * size..(k + 1) * size]);
        }
    }
    out
}

/// An integer label from bytes such as `b"3"` or `b" 7\n"`.
fn parse_label(b: &[u8]) -> Result<i64, String> {
    let text = std::str::from_utf8(b).map_err(|_| format!("label bytes {b:?} are not text"))?;
    text.trim().parse::<i64>().map_err(|_| {
        format!(
            "label {:?} is not an integer (a cls or txt field holding a class index is)",
            text.chars().take(40).collect::<String>()
        )
    })
}

fn json_value(b: &[u8]) -> Result<Value, String> {
    use serde_json::Value as J;
    let v: J = serde_json::from_slice(b).map_err(|e| format!("not JSON: {e}"))?;
    let numbers = |items: &[J]| -> Option<Value> {
        if items.iter().all(J::is_i64) {
            let data: Vec<u8> = items
                .iter()
                .flat_map(|x| x.as_i64().unwrap_or_default().to_le_bytes())
                .collect();
            Some(Value::Array(Array::new(
                DType::I64,
                vec![items.len()],
                data.into(),
            )))
        } else if items.iter().all(J::is_number) {
            let data: Vec<u8> = items
                .iter()
                .flat_map(|x| x.as_f64().unwrap_or(f64::NAN).to_le_bytes())
                .collect();
            Some(Value::Array(Array::new(
                DType::F64,
                vec![items.len()],
                data.into(),
            )))
        } else {
            None
        }
    };
    match &v {
        J::Number(n) if n.is_i64() => Ok(Value::Array(Array::scalar_i64(n.as_i64().unwrap_or(0)))),
        J::Number(n) => Ok(Value::Array(Array::new(
            DType::F64,
            Vec::new(),
            Bytes::copy_from_slice(&n.as_f64().unwrap_or(f64::NAN).to_le_bytes()),
        ))),
        J::Bool(x) => Ok(Value::Array(Array::new(
            DType::Bool,
            Vec::new(),
            Bytes::copy_from_slice(&[u8::from(*x)]),
        ))),
        J::String(s) => Ok(Value::Text(Bytes::copy_from_slice(s.as_bytes()))),
        J::Array(items) => numbers(items).ok_or_else(|| {
            "a JSON list that is not all numbers; a batch column needs numbers".to_string()
        }),
        _ => Err(
            "a JSON object or null; json gives numbers, lists of numbers or strings (keep the \
             field as bytes and parse it in a transform of your own)"
                .into(),
        ),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A `w` x `h` RGB test picture (gradients and a square) as JPEG bytes.
    pub(crate) fn jpeg(h: u16, w: u16) -> Vec<u8> {
        let mut px = Vec::with_capacity(h as usize * w as usize * 3);
        for y in 0..h {
            for x in 0..w {
                let inside = (w / 4..w / 2).contains(&x) && (h / 4..h / 2).contains(&y);
                px.extend([
                    (x * 255 / w) as u8,
                    (y * 255 / h) as u8,
                    if inside { 250 } else { 20 },
                ]);
            }
        }
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 90)
            .encode(&px, w, h, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        out
    }

    fn sample(img: Vec<u8>) -> Sample {
        Sample::new(5)
            .with("jpg", Field::Bytes(img.into()))
            .with("cls", Field::Bytes(Bytes::from_static(b"7\n")))
    }

    const IMAGENET: &str = r#"{
        "jpg;png": {"as": "image", "ops": [
            {"op": "decode"},
            {"op": "random_resized_crop", "size": 32},
            {"op": "horizontal_flip"},
            {"op": "normalize", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
            {"op": "chw"}
        ]},
        "cls": [{"op": "label"}]
    }"#;

    #[test]
    fn imagenet_style_pipeline_gives_chw_floats_and_labels() {
        let p = Pipeline::from_json(IMAGENET).unwrap();
        let mut s = sample(jpeg(60, 80));
        p.apply(&mut s, &mut SampleRng::for_sample(1, 0, 5))
            .unwrap();
        let Some(Field::Array(img)) = s.get("image") else {
            panic!("{s:?}")
        };
        assert_eq!(
            (img.dtype, img.shape.as_slice()),
            (DType::F32, &[3, 32, 32][..])
        );
        assert!(s.get("jpg").is_none(), "renamed");
        let Some(Field::Array(label)) = s.get("cls") else {
            panic!()
        };
        assert_eq!(&label.data[..], &7i64.to_le_bytes());
        // Normalized values of 8-bit pixels stay within (0 - mean) / std .. (1 - mean) / std.
        let v: Vec<f32> = img
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(v.iter().all(|x| (-2.2..=2.7).contains(x)));
    }

    #[test]
    fn randomness_comes_from_the_sample_rng_only() {
        let p = Pipeline::from_json(IMAGENET).unwrap();
        let run = |epoch| {
            let mut s = sample(jpeg(60, 80));
            p.apply(&mut s, &mut SampleRng::for_sample(1, epoch, 5))
                .unwrap();
            match s.get("image") {
                Some(Field::Array(a)) => a.data.clone(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(run(0), run(0));
        assert_ne!(run(0), run(1), "another epoch, another crop");
    }

    #[test]
    fn fused_decode_and_crop_match_the_separate_ops() {
        // decode + random_resized_crop draws the crop from the header: the same draw as
        // after a full decode.
        let img = jpeg(64, 48);
        let fused = Pipeline::from_json(
            r#"{"jpg": [{"op": "decode"}, {"op": "random_resized_crop", "size": [20, 24]}]}"#,
        )
        .unwrap();
        let mut a = sample(img.clone());
        fused
            .apply(&mut a, &mut SampleRng::for_sample(3, 1, 2))
            .unwrap();
        let mut rng = SampleRng::for_sample(3, 1, 2);
        let full = image::decode(&img, ColorMode::Rgb, None).unwrap();
        let crop =
            image::random_resized_crop_params(64, 48, default_scale(), default_ratio(), &mut rng);
        let want = full.resize(Some(crop), 20, 24).unwrap();
        let Some(Field::Array(got)) = a.get("jpg") else {
            panic!()
        };
        assert_eq!(got.shape, [20, 24, 3]);
        // The fused path decodes only the crop's region (and may decode scaled): the same
        // picture up to rounding and chroma upsampling at the region's edges.
        let diffs: Vec<u32> = (got.data.iter().zip(&want.data))
            .map(|(a, b)| u32::from(a.abs_diff(*b)))
            .collect();
        let mean = f64::from(diffs.iter().sum::<u32>()) / diffs.len() as f64;
        eprintln!(
            "fused vs separate: mean {mean:.3}, max {:?}",
            diffs.iter().max()
        );
        assert!(mean < 1.0, "mean difference {mean}");
    }

    #[test]
    fn writing_into_slots_gives_what_apply_gives() {
        let cases = [
            // decode + crop fused, flips in place in the slot
            r#"{"jpg": [{"op": "decode"}, {"op": "random_resized_crop", "size": 24},
                        {"op": "horizontal_flip", "p": 0.5}], "cls": [{"op": "label"}]}"#,
            // normalize (+ chw) writes float32 straight into the slot
            r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": [20, 30]},
                        {"op": "horizontal_flip"},
                        {"op": "normalize", "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.2, 0.3]},
                        {"op": "chw"}]}"#,
            r#"{"jpg": [{"op": "decode", "mode": "gray"}, {"op": "resize", "size": 40},
                        {"op": "center_crop", "size": 32}, {"op": "cast", "dtype": "float32"}]}"#,
            r#"{"jpg": {"ops": [{"op": "decode"}, {"op": "center_crop", "size": [70, 10]}],
                        "as": "image"}}"#,
        ];
        for spec in cases {
            let p = Pipeline::from_json(spec).unwrap();
            assert!(!p.slots().is_empty(), "{spec}");
            for index in 0..6 {
                let mut s = sample(jpeg(60, 80));
                s.index = index;
                s.set("cls", Field::Bytes(Bytes::from_static(b"7")));
                let mut want = s.clone();
                p.apply(&mut want, &mut SampleRng::for_sample(1, 2, index))
                    .unwrap();
                let mut bufs: Vec<Vec<u8>> =
                    p.slots().iter().map(|sl| vec![0xAB; sl.nbytes()]).collect();
                let mut out: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
                p.apply_into(&mut s, &mut SampleRng::for_sample(1, 2, index), &mut out)
                    .unwrap();
                for (slot, got) in p.slots().iter().zip(&bufs) {
                    assert!(
                        s.get(&slot.name).is_none(),
                        "{} went to the slot",
                        slot.name
                    );
                    let Some(Field::Array(a)) = want.get(&slot.name) else {
                        panic!("{spec}: no {}", slot.name)
                    };
                    assert_eq!(
                        (a.out_dtype(), &a.shape),
                        (slot.dtype, &slot.shape),
                        "{spec}"
                    );
                    let mut expect = vec![0u8; slot.nbytes()];
                    chute_core::cast_into(a.dtype, &a.data, slot.dtype, &mut expect);
                    assert_eq!(got, &expect, "{spec}, sample {index}");
                }
            }
        }
        // Shapes that depend on the image get no slot.
        for spec in [
            r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": 30}]}"#,
            r#"{"jpg;png": [{"op": "decode"}, {"op": "center_crop", "size": 8}]}"#,
            r#"{"jpg": {"ops": [{"op": "decode"}, {"op": "center_crop", "size": 8}],
                        "optional": true}}"#,
        ] {
            assert!(
                Pipeline::from_json(spec).unwrap().slots().is_empty(),
                "{spec}"
            );
        }
    }

    #[test]
    fn png_takes_the_fused_crop_and_resize_too() {
        let (h, w) = (30u32, 40u32);
        let px: Vec<u8> = (0..h * w * 3).map(|i| (i % 251) as u8).collect();
        let mut data = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut data, w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().unwrap();
            writer.write_image_data(&px).unwrap();
        }
        for spec in [
            r#"{"img": [{"op": "decode"}, {"op": "random_resized_crop", "size": 12}]}"#,
            r#"{"img": [{"op": "decode"}, {"op": "resize", "size": 15}]}"#,
        ] {
            let p = Pipeline::from_json(spec).unwrap();
            let mut s = Sample::new(0).with("img", Field::Bytes(data.clone().into()));
            p.apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
                .unwrap_or_else(|e| panic!("{spec}: {e}"));
            let Some(Field::Array(a)) = s.get("img") else {
                panic!()
            };
            assert_eq!(a.shape[2], 3, "{spec}");
        }
    }

    #[test]
    fn resize_center_crop_gray_and_cast() {
        let p = Pipeline::from_json(
            r#"{"jpg": [{"op": "decode", "mode": "gray"}, {"op": "resize", "size": 30},
                        {"op": "center_crop", "size": 28}, {"op": "cast", "dtype": "float32"}]}"#,
        )
        .unwrap();
        let mut s = sample(jpeg(60, 80));
        p.apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap();
        let Some(Field::Array(a)) = s.get("jpg") else {
            panic!()
        };
        assert_eq!(
            (a.dtype, a.shape.clone(), a.cast),
            (DType::U8, vec![28, 28, 1], Some(DType::F32))
        );
    }

    #[test]
    fn misordered_or_unknown_ops_are_refused_when_built() {
        let e = Pipeline::from_json(r#"{"jpg": [{"op": "resize", "size": 3}]}"#).unwrap_err();
        assert!(
            e.to_string().contains("resize needs a decoded image"),
            "{e}"
        );
        let e = Pipeline::from_json(
            r#"{"jpg": [{"op": "decode"}, {"op": "normalize", "mean": [0.5], "std": [0.5]},
                        {"op": "horizontal_flip"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("op 3"), "{e}");
        let e = Pipeline::from_json(r#"{"jpg": [{"op": "sharpen"}]}"#).unwrap_err();
        assert!(e.to_string().contains("sharpen"), "{e}");
        let e = Pipeline::from_json(r#"{"jpg": [{"op": "decode", "mdoe": "rgb"}]}"#).unwrap_err();
        assert!(e.to_string().contains("mdoe"), "{e}");
        let e = Pipeline::from_json(r#"{"jpg": [{"op": "horizontal_flip", "p": 2}]}"#);
        assert!(e.is_err());
        let e = Pipeline::from_json(r#"[1, 2]"#).unwrap_err();
        assert!(e.to_string().contains("JSON object"), "{e}");
    }

    #[test]
    fn bad_samples_say_what_is_wrong() {
        let p = Pipeline::from_json(IMAGENET).unwrap();
        let mut img = jpeg(60, 80);
        img.truncate(img.len() / 3);
        let e = p
            .apply(&mut sample(img), &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("field \"jpg\"") && e.contains("JPEG"), "{e}");
        let mut s = Sample::new(0).with("txt", Field::Bytes(Bytes::from_static(b"x")));
        let e = p
            .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no field \"cls\"") && e.contains("txt"), "{e}");
        let label = Pipeline::from_json(r#"{"cls": [{"op": "label"}]}"#).unwrap();
        let mut s = Sample::new(0).with("cls", Field::Bytes(Bytes::from_static(b"dog")));
        let e = label
            .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an integer"), "{e}");
    }

    #[test]
    fn json_npy_and_text_fields() {
        let p = Pipeline::from_json(
            r#"{"a": [{"op": "json"}], "b": [{"op": "json"}], "n": [{"op": "npy"}],
                "t": [{"op": "text"}]}"#,
        )
        .unwrap();
        let npy = chute_formats::write_npy(DType::I16, &[2], &[1, 0, 2, 0]).unwrap();
        let mut s = Sample::new(0)
            .with("a", Field::Bytes(Bytes::from_static(b"[1, 2.5]")))
            .with("b", Field::Bytes(Bytes::from_static(b"3")))
            .with("n", Field::Bytes(npy.into()))
            .with("t", Field::Bytes(Bytes::from_static("héllo".as_bytes())));
        p.apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap();
        let Some(Field::Array(a)) = s.get("a") else {
            panic!()
        };
        assert_eq!((a.dtype, a.shape.clone()), (DType::F64, vec![2]));
        let Some(Field::Array(n)) = s.get("n") else {
            panic!()
        };
        assert_eq!((n.dtype, &n.data[..]), (DType::I16, &[1u8, 0, 2, 0][..]));
        assert!(matches!(s.get("t"), Some(Field::Text(_))));
    }
}
