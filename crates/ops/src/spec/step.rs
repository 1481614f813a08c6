//! A field's ops compiled into [`Step`]s when the [`SampleOps`](super::SampleOps) is built.
//!
//! The fusions are decided once, from the op list: `decode` with the `random_resized_crop` or
//! `resize` after it (the region is drawn from the header and decoded alone, at a reduced
//! size where that covers the output), `normalize` with the `chw` after it, and, for a field
//! with a batch slot, the step that writes into the slot. Running a sample is then a flat loop
//! ([`run`]). Steps run in op order, so the sample's RNG is drawn in op order too: the crops
//! and flips do not depend on the fusions.

use std::str::FromStr;

use bytes::Bytes;
use chute_core::{Array, Corruption, DType, Field, FieldName, Sample, SampleRng};

use super::{Op, Size};
use crate::image::{self, ColorMode, Image};
use crate::{OpError, Slot};

/// A field's value between steps.
pub(super) enum Value {
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
    /// A nested value (`json` of an object, or of a list that is not all numbers).
    Nested(chute_core::Value),
    /// The value is in the batch slot (a step wrote it there).
    InSlot,
    /// Decoded audio; `flat`: one channel given as `[frames]` (`mono`); `valid`: after a
    /// `crop_audio`, the frames holding audio (the rest is padding).
    #[cfg(feature = "audio")]
    Audio {
        audio: crate::audio::Audio,
        flat: bool,
        valid: Option<usize>,
    },
    /// Speech features, `rows x cols`, time along `time_axis`.
    #[cfg(feature = "audio")]
    Features {
        data: Vec<f32>,
        rows: usize,
        cols: usize,
        time_axis: usize,
    },
    /// Video clips and their frames' times.
    #[cfg(feature = "video")]
    Video(crate::video::Clips),
}

/// One field's compiled steps.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CompiledField {
    /// What `apply` runs.
    pub(super) steps: Vec<Step>,
    /// For a field with a batch slot: the slot's index and what `apply_into` runs, which
    /// leaves the value in the slot.
    pub(super) into_slot: Option<(usize, Vec<Step>)>,
}

impl CompiledField {
    /// The plan for `ops` (checked to fit together), with `slot` (index and column) when
    /// the field has one.
    pub(super) fn new(ops: &[Op], slot: Option<(usize, &Slot)>) -> CompiledField {
        CompiledField {
            steps: compile(ops, None),
            into_slot: slot.map(|(at, slot)| (at, compile(ops, Some(slot)))),
        }
    }
}

/// One step of a field's plan: an op, or ops fused.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Step {
    /// `decode` alone: the whole picture at full size.
    Decode {
        mode: ColorMode,
        max_pixels: u64,
    },
    /// `decode` fused with the crop or resize after it.
    DecodeRegion {
        mode: ColorMode,
        region: Region,
        to_slot: bool,
        max_pixels: u64,
    },
    Resize {
        size: Size,
        max_size: Option<usize>,
        to_slot: bool,
    },
    CenterCrop {
        size: (usize, usize),
        to_slot: bool,
    },
    RandomResizedCrop {
        size: (usize, usize),
        scale: [f64; 2],
        ratio: [f64; 2],
        to_slot: bool,
    },
    Flip {
        p: f64,
    },
    /// `horizontal_flip` after the step that wrote the image into the slot: flips the slot's
    /// rows in place.
    FlipSlot {
        p: f64,
        width: usize,
        channels: usize,
    },
    /// `normalize`, with `chw` when the op after it was `chw`.
    Normalize {
        mean: Vec<f32>,
        std: Vec<f32>,
        chw: bool,
        to_slot: bool,
    },
    Chw,
    Cast(DType),
    Label,
    Npy,
    Text,
    Json,
    Msgpack,
    Npz,
    Tenbin,
    /// The bytes as they are (`auto`'s choice for members it does not decode).
    Bytes,
    /// `tokenize`: the tokenizer and options, or why they could not be had.
    #[cfg(feature = "tokenizers")]
    Tokenize(Result<(crate::text::TextTokenizer, crate::text::EncodeOptions), String>),
    #[cfg(not(feature = "tokenizers"))]
    Tokenize,
    /// The final value converted into the slot, for a field whose ops have no step that
    /// writes into it (labels, a cast last, ...).
    FillSlot(Slot),
    #[cfg(feature = "audio")]
    DecodeAudio {
        mono: bool,
        sample_rate: Option<u32>,
        limits: crate::audio::AudioLimits,
    },
    #[cfg(feature = "audio")]
    Resample(u32),
    #[cfg(feature = "video")]
    DecodeVideo(Box<crate::video::ClipRequest>),
    #[cfg(feature = "audio")]
    CropAudio {
        seconds: Option<f64>,
        samples: Option<usize>,
        random: bool,
    },
    #[cfg(feature = "audio")]
    LogMel {
        n_mels: usize,
        n_samples: Option<usize>,
    },
    #[cfg(feature = "audio")]
    Fbank(super::FbankOptions),
    #[cfg(feature = "audio")]
    SpecAugment {
        masks: [(usize, usize); 2],
        max_time_ratio: f64,
        value: f32,
    },
}

/// The op a [`Step::DecodeRegion`] stands in for, which says the region and the output size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Region {
    RandomResizedCrop {
        size: (usize, usize),
        scale: [f64; 2],
        ratio: [f64; 2],
    },
    Resize {
        size: Size,
        max_size: Option<usize>,
    },
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

/// The steps for `ops` (checked to fit together). With `slot`, they leave the value in it:
/// the [`writer`] op writes its output there and the flips after it flip the slot, or, with
/// no writer, a last [`Step::FillSlot`] converts the final value.
fn compile(ops: &[Op], slot: Option<&Slot>) -> Vec<Step> {
    let writer = slot.and_then(|_| writer(ops));
    let mut steps = Vec::with_capacity(ops.len() + 1);
    let mut i = 0;
    while i < ops.len() {
        let to_slot = writer == Some(i);
        let step = match &ops[i] {
            Op::Decode {
                mode,
                reduced,
                max_pixels,
            } => {
                let (mode, max_pixels) = (*mode, *max_pixels);
                let region = match ops.get(i + 1).filter(|_| *reduced) {
                    Some(Op::RandomResizedCrop { size, scale, ratio }) => {
                        Some(Region::RandomResizedCrop {
                            size: size.square(),
                            scale: *scale,
                            ratio: *ratio,
                        })
                    }
                    Some(Op::Resize { size, max_size }) => Some(Region::Resize {
                        size: *size,
                        max_size: *max_size,
                    }),
                    _ => None,
                };
                match region {
                    Some(region) => {
                        i += 1;
                        Step::DecodeRegion {
                            mode,
                            region,
                            to_slot: writer == Some(i),
                            max_pixels,
                        }
                    }
                    None => Step::Decode { mode, max_pixels },
                }
            }
            Op::Resize { size, max_size } => Step::Resize {
                size: *size,
                max_size: *max_size,
                to_slot,
            },
            Op::CenterCrop { size } => Step::CenterCrop {
                size: size.square(),
                to_slot,
            },
            Op::RandomResizedCrop { size, scale, ratio } => Step::RandomResizedCrop {
                size: size.square(),
                scale: *scale,
                ratio: *ratio,
                to_slot,
            },
            Op::HorizontalFlip { p } => match (writer, slot) {
                // Only flips follow the writer, so the slot holds the image as it is,
                // `uint8 [H, W, C]`.
                (Some(w), Some(slot)) if w < i => Step::FlipSlot {
                    p: *p,
                    width: slot.shape[1],
                    channels: slot.shape[2],
                },
                _ => Step::Flip { p: *p },
            },
            Op::Normalize { mean, std } => {
                let chw = matches!(ops.get(i + 1), Some(Op::Chw));
                i += usize::from(chw);
                Step::Normalize {
                    mean: mean.clone(),
                    std: std.clone(),
                    chw,
                    to_slot,
                }
            }
            Op::Chw => Step::Chw,
            Op::Cast { dtype } => {
                Step::Cast(DType::from_str(dtype).expect("checked when the pipeline was built"))
            }
            Op::Label => Step::Label,
            Op::Npy => Step::Npy,
            Op::Text => Step::Text,
            Op::Json => Step::Json,
            Op::Msgpack => Step::Msgpack,
            Op::Npz => Step::Npz,
            Op::Tenbin => Step::Tenbin,
            // Run by `auto` in `SampleOps::apply_fields`, which knows the field's name.
            Op::Auto { .. } => Step::Bytes,
            #[cfg(feature = "tokenizers")]
            op @ Op::Tokenize { .. } => Step::Tokenize(super::tokenizing(op)),
            #[cfg(not(feature = "tokenizers"))]
            Op::Tokenize { .. } => Step::Tokenize,
            // Run by the field's `ChatOp`, never compiled into steps.
            Op::Chat { .. } => {
                i += 1;
                continue;
            }
            #[cfg(feature = "audio")]
            Op::DecodeAudio {
                mono,
                sample_rate,
                max_seconds,
                max_channels,
            } => Step::DecodeAudio {
                mono: *mono,
                sample_rate: *sample_rate,
                limits: crate::audio::AudioLimits {
                    max_channels: *max_channels,
                    max_rate: super::MAX_RATE,
                    max_seconds: *max_seconds,
                },
            },
            #[cfg(feature = "audio")]
            Op::Resample { sample_rate } => Step::Resample(*sample_rate),
            #[cfg(feature = "audio")]
            Op::CropAudio {
                seconds,
                samples,
                random,
            } => Step::CropAudio {
                seconds: *seconds,
                samples: *samples,
                random: *random,
            },
            #[cfg(feature = "audio")]
            Op::LogMel { n_mels, n_samples } => Step::LogMel {
                n_mels: *n_mels,
                n_samples: *n_samples,
            },
            #[cfg(feature = "audio")]
            Op::Fbank(o) => Step::Fbank(o.clone()),
            #[cfg(feature = "audio")]
            Op::SpecAugment {
                freq_masks,
                freq_width,
                time_masks,
                time_width,
                max_time_ratio,
                value,
            } => Step::SpecAugment {
                masks: [(*freq_masks, *freq_width), (*time_masks, *time_width)],
                max_time_ratio: *max_time_ratio,
                value: *value,
            },
            #[cfg(feature = "video")]
            op @ Op::DecodeVideo { .. } => Step::DecodeVideo(Box::new(clip_request(op))),
            // Refused when the pipeline is built, in a build without video.
            #[cfg(not(feature = "video"))]
            Op::DecodeVideo { .. } => {
                i += 1;
                continue;
            }
            // Refused when the pipeline is built, in a build without audio.
            #[cfg(not(feature = "audio"))]
            Op::DecodeAudio { .. }
            | Op::Resample { .. }
            | Op::CropAudio { .. }
            | Op::LogMel { .. }
            | Op::Fbank(_)
            | Op::SpecAugment { .. } => {
                i += 1;
                continue;
            }
        };
        steps.push(step);
        i += 1;
    }
    if let Some(slot) = slot
        && writer.is_none()
    {
        steps.push(Step::FillSlot(slot.clone()));
    }
    steps
}

/// A `tokenize` step with a prompt: the ids of the prompt (the text field `prompt` of
/// `sample`) and of the response (`value`), and the labels (the prompt's ids as -100).
pub(super) fn tokenize_pair(
    step: &Step,
    sample: &Sample,
    prompt: &str,
    value: Value,
) -> Result<(Value, Value), OpError> {
    #[cfg(feature = "tokenizers")]
    {
        let Step::Tokenize(t) = step else {
            return Err(step.bug());
        };
        let (tok, options) = t
            .as_ref()
            .map_err(|why| OpError::wrong_input("tokenize", why.clone()))?;
        let text = |b: &[u8]| -> Result<String, OpError> {
            std::str::from_utf8(b)
                .map(str::to_owned)
                .map_err(|source| OpError::NotUtf8 { source })
        };
        let b = match value {
            Value::Bytes(b) | Value::Text(b) => b,
            Value::Array(a) if a.dtype == DType::U8 && a.shape.len() == 1 => a.data,
            other => return Err(step.refuse(&other)),
        };
        let response = text(&b)?;
        let prompt_text = match sample.get(prompt) {
            Some(Field::Text(p) | Field::Bytes(p)) => text(p)?,
            _ => {
                return Err(OpError::wrong_input(
                    "tokenize",
                    format!("the prompt field {prompt:?} is missing or not text"),
                ));
            }
        };
        let (ids, n) = tok
            .encode_pair(&prompt_text, &response, *options)
            .map_err(|why| OpError::wrong_input("tokenize", why))?;
        let as_array = |v: &[i64]| -> Value {
            let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::Array(Array::new(DType::I64, vec![v.len()], data.into()))
        };
        let ids: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
        let mut labels = ids.clone();
        labels[..n].fill(-100);
        Ok((as_array(&ids), as_array(&labels)))
    }
    #[cfg(not(feature = "tokenizers"))]
    {
        let _ = (sample, prompt, value);
        Err(step.bug())
    }
}

/// Runs `steps` on `value`; `slot` is the field's batch slot, for plans that write into it.
pub(super) fn run(
    steps: &[Step],
    mut value: Value,
    rng: &mut SampleRng,
    mut slot: Option<&mut [u8]>,
) -> Result<Value, OpError> {
    for step in steps {
        value = step.run(value, rng, slot.as_deref_mut())?;
    }
    Ok(value)
}

impl Step {
    fn name(&self) -> &'static str {
        match self {
            Step::Decode { .. } | Step::DecodeRegion { .. } => "decode",
            Step::Resize { .. } => "resize",
            Step::CenterCrop { .. } => "center_crop",
            Step::RandomResizedCrop { .. } => "random_resized_crop",
            Step::Flip { .. } | Step::FlipSlot { .. } => "horizontal_flip",
            Step::Normalize { .. } => "normalize",
            Step::Chw => "chw",
            Step::Cast(_) => "cast",
            Step::Label => "label",
            Step::Npy => "npy",
            Step::Text => "text",
            Step::Json => "json",
            Step::Msgpack => "msgpack",
            Step::Npz => "npz",
            Step::Tenbin => "tenbin",
            Step::Bytes => "auto",
            #[cfg(feature = "tokenizers")]
            Step::Tokenize(_) => "tokenize",
            #[cfg(not(feature = "tokenizers"))]
            Step::Tokenize => "tokenize",
            Step::FillSlot(_) => "batch column",
            #[cfg(feature = "audio")]
            Step::DecodeAudio { .. } => "decode_audio",
            #[cfg(feature = "audio")]
            Step::Resample(_) => "resample",
            #[cfg(feature = "audio")]
            Step::CropAudio { .. } => "crop_audio",
            #[cfg(feature = "audio")]
            Step::LogMel { .. } => "log_mel",
            #[cfg(feature = "audio")]
            Step::Fbank(_) => "fbank",
            #[cfg(feature = "audio")]
            Step::SpecAugment { .. } => "spec_augment",
            #[cfg(feature = "video")]
            Step::DecodeVideo(_) => "decode_video",
        }
    }

    /// A value or slot this step was not compiled for (a slot step without its slot: the
    /// pipeline's own wiring).
    fn bug(&self) -> OpError {
        OpError::wrong_input(
            self.name(),
            "got a value it does not take (a bug: the pipeline was checked)",
        )
    }

    /// True for steps that read encoded bytes (an image file, `.npy`, text, JSON).
    fn takes_bytes(&self) -> bool {
        #[cfg(feature = "tokenizers")]
        if matches!(self, Step::Tokenize(_)) {
            return true;
        }
        #[cfg(not(feature = "tokenizers"))]
        if matches!(self, Step::Tokenize) {
            return true;
        }
        #[cfg(feature = "audio")]
        if matches!(self, Step::DecodeAudio { .. }) {
            return true;
        }
        #[cfg(feature = "video")]
        if matches!(self, Step::DecodeVideo(_)) {
            return true;
        }
        matches!(
            self,
            Step::Decode { .. }
                | Step::DecodeRegion { .. }
                | Step::Npy
                | Step::Text
                | Step::Json
                | Step::Msgpack
                | Step::Npz
                | Step::Tenbin
                | Step::Bytes
        )
    }

    /// What a user gave that this step does not take: what it takes, what it got.
    fn refuse(&self, got: &Value) -> OpError {
        let got = match got {
            Value::Bytes(_) => "bytes".to_string(),
            Value::Text(_) => "text".to_string(),
            Value::Image(img) => format!("a decoded image ({} x {})", img.height, img.width),
            Value::Float { h, w, c, .. } => format!("a float32 image [{h}, {w}, {c}]"),
            Value::Array(a) => format!("a {} array of shape {:?}", a.dtype, a.shape),
            Value::Nested(v) => format!("a nested value ({})", v.describe()),
            Value::InSlot => "a value already written to the batch".to_string(),
            #[cfg(feature = "audio")]
            Value::Audio { audio, .. } => format!(
                "decoded audio ({} channels at {} Hz)",
                audio.channels, audio.rate
            ),
            #[cfg(feature = "audio")]
            Value::Features { rows, cols, .. } => format!("features [{rows}, {cols}]"),
            #[cfg(feature = "video")]
            Value::Video(c) => format!("video clips {:?}", c.shape),
        };
        let takes = if self.takes_bytes() {
            "encoded bytes (bytes, or a one-dimensional uint8 array)"
        } else {
            match self {
                Step::Label => "a class label (text such as b\"3\", or an integer)",
                Step::Cast(_) => "an array",
                _ => "an image (after decode) or an array",
            }
        };
        OpError::wrong_input(
            self.name(),
            format!("takes {takes}, got {got}: check the field's value and the order of its ops"),
        )
    }

    /// This step on `value`. A step with `to_slot` writes its output into `slot` and gives
    /// [`Value::InSlot`].
    fn run(
        &self,
        value: Value,
        rng: &mut SampleRng,
        slot: Option<&mut [u8]>,
    ) -> Result<Value, OpError> {
        // A one-dimensional uint8 array is a file's bytes to every user (numpy.frombuffer):
        // encoded bytes, as `bytes` are.
        let value = match value {
            Value::Array(a) if self.takes_bytes() && a.dtype == DType::U8 && a.shape.len() == 1 => {
                Value::Bytes(a.data)
            }
            v => v,
        };
        Ok(match (self, value) {
            (Step::Decode { mode, max_pixels }, Value::Bytes(b)) => {
                let b = crate::files::resolve(b, "decode")?;
                image::check_pixels(&b, image::image_size(&b)?, *max_pixels)?;
                Value::Image(image::decode(&b, *mode, None)?)
            }
            (
                Step::DecodeRegion {
                    mode,
                    region,
                    to_slot,
                    max_pixels,
                },
                Value::Bytes(b),
            ) => {
                let b = crate::files::resolve(b, "decode")?;
                // The crop is drawn from the header's size: the same draw as after a decode.
                let (h, w) = image::image_size(&b)?;
                image::check_pixels(&b, (h, w), *max_pixels)?;
                let (crop, out) = match *region {
                    Region::RandomResizedCrop { size, scale, ratio } => (
                        image::random_resized_crop_params(h, w, scale, ratio, rng),
                        size,
                    ),
                    Region::Resize { size, max_size } => {
                        let whole = image::Rect {
                            top: 0,
                            left: 0,
                            height: h,
                            width: w,
                        };
                        (whole, resize_to(size, max_size, h, w)?)
                    }
                };
                decode_crop_resize(&b, *mode, (h, w), crop, out, slot.filter(|_| *to_slot))?
            }
            (
                Step::Resize {
                    size,
                    max_size,
                    to_slot,
                },
                Value::Image(img),
            ) => {
                let out = resize_to(*size, *max_size, img.height, img.width)?;
                resized(&img, None, out, slot.filter(|_| *to_slot))?
            }
            (Step::CenterCrop { size, to_slot }, Value::Image(img)) => {
                let (ch, cw) = *size;
                let (top, left) = image::center_crop_offsets(img.height, img.width, ch, cw);
                let cropped = img.padded_crop(top, left, ch, cw);
                match slot.filter(|_| *to_slot) {
                    Some(dst) => {
                        dst.copy_from_slice(&cropped.data);
                        Value::InSlot
                    }
                    None => Value::Image(cropped),
                }
            }
            (
                Step::RandomResizedCrop {
                    size,
                    scale,
                    ratio,
                    to_slot,
                },
                Value::Image(img),
            ) => {
                let crop =
                    image::random_resized_crop_params(img.height, img.width, *scale, *ratio, rng);
                resized(&img, Some(crop), *size, slot.filter(|_| *to_slot))?
            }
            (Step::Flip { p }, Value::Image(mut img)) => {
                if rng.chance(*p) {
                    img.flip_horizontal();
                }
                Value::Image(img)
            }
            (Step::FlipSlot { p, width, channels }, Value::InSlot) => {
                if rng.chance(*p)
                    && let Some(dst) = slot
                {
                    image::flip_horizontal(dst, *width, *channels);
                }
                Value::InSlot
            }
            (
                Step::Normalize {
                    mean,
                    std,
                    chw,
                    to_slot,
                },
                Value::Image(img),
            ) => {
                let c = img.channels;
                if mean.len() != c && mean.len() != 1 {
                    return Err(OpError::wrong_input(
                        "normalize",
                        format!("{} means for an image of {c} channels", mean.len()),
                    ));
                }
                let (h, w) = (img.height, img.width);
                match slot.filter(|_| *to_slot) {
                    Some(dst) => {
                        normalize(&img, mean, std, *chw, |at, v| {
                            dst[at * 4..at * 4 + 4].copy_from_slice(&v.to_le_bytes());
                        });
                        Value::InSlot
                    }
                    None => {
                        let mut data = vec![0f32; h * w * c];
                        normalize(&img, mean, std, *chw, |at, v| data[at] = v);
                        if *chw {
                            Value::Array(float_array(vec![c, h, w], &data))
                        } else {
                            Value::Float { h, w, c, data }
                        }
                    }
                }
            }
            (Step::Chw, Value::Image(img)) => Value::Array(Array::new(
                DType::U8,
                vec![img.channels, img.height, img.width],
                hwc_to_chw(&img.data, img.height, img.width, img.channels, 1).into(),
            )),
            (Step::Chw, Value::Float { h, w, c, data }) => {
                let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                Value::Array(Array::new(
                    DType::F32,
                    vec![c, h, w],
                    hwc_to_chw(&bytes, h, w, c, 4).into(),
                ))
            }
            (Step::Chw, Value::Array(a)) => {
                let [h, w, c] = a.shape[..] else {
                    return Err(OpError::wrong_input(
                        "chw",
                        format!("needs [H, W, C], the array is {:?}", a.shape),
                    ));
                };
                let size = a.dtype.size();
                let data = hwc_to_chw(&a.data, h, w, c, size);
                let mut out = Array::new(a.dtype, vec![c, h, w], data.into());
                out.cast = a.cast;
                Value::Array(out)
            }
            (Step::Cast(dtype), Value::Image(img)) => cast(image_array(img), *dtype),
            (Step::Cast(dtype), Value::Float { h, w, c, data }) => {
                cast(float_array(vec![h, w, c], &data), *dtype)
            }
            (Step::Cast(dtype), Value::Array(a)) => cast(a, *dtype),
            #[cfg(feature = "audio")]
            (Step::Cast(dtype), v @ (Value::Audio { .. } | Value::Features { .. })) => {
                let Field::Array(a) = into_field(v) else {
                    return Err(self.bug());
                };
                cast(a, *dtype)
            }
            (Step::Label, Value::Bytes(b)) => Value::Array(Array::scalar_i64(parse_label(&b)?)),
            // A label stored as a number already (a Parquet, Arrow or TFRecord int column).
            (Step::Label, Value::Array(a)) => {
                let integer =
                    !matches!(a.dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64);
                if !a.shape.is_empty() || !integer {
                    return Err(OpError::wrong_input(
                        "label",
                        format!(
                            "a {} array of shape {:?}; a label is text digits or one integer",
                            a.dtype, a.shape
                        ),
                    ));
                }
                let mut v = [0u8; 8];
                chute_core::cast_into(a.dtype, &a.data, DType::I64, &mut v);
                Value::Array(Array::scalar_i64(i64::from_le_bytes(v)))
            }
            (Step::Npy, Value::Bytes(b)) => {
                let (header, data) =
                    chute_core::npy::read_npy(&b, "the field").map_err(|e| OpError::BadNpy {
                        kind: e.corruption().unwrap_or(Corruption::Malformed),
                        reason: e.to_string(),
                    })?;
                let start = data.as_ptr() as usize - b.as_ptr() as usize;
                Value::Array(Array::new(
                    header.dtype(),
                    header.shape().to_vec(),
                    b.slice(start..start + data.len()),
                ))
            }
            (Step::Text, Value::Bytes(b)) => {
                std::str::from_utf8(&b).map_err(|source| OpError::NotUtf8 { source })?;
                Value::Text(b)
            }
            (Step::Json, Value::Bytes(b)) => json_value(&b)?,
            (Step::Msgpack, Value::Bytes(b)) => {
                top_level(crate::members::msgpack(&b).map_err(bad_member("msgpack"))?)
            }
            (Step::Npz, Value::Bytes(b)) => Value::Nested(
                crate::members::npz(&b, chute_core::Limits::current().max_decoded_bytes)
                    .map_err(bad_member("npz"))?,
            ),
            (Step::Tenbin, Value::Bytes(b)) => {
                Value::Nested(crate::members::tenbin(&b).map_err(bad_member("tenbin"))?)
            }
            (Step::Bytes, v @ Value::Bytes(_)) => v,
            #[cfg(feature = "tokenizers")]
            (Step::Tokenize(t), Value::Bytes(b) | Value::Text(b)) => {
                let (tok, options) = t
                    .as_ref()
                    .map_err(|why| OpError::wrong_input("tokenize", why.clone()))?;
                let text = std::str::from_utf8(&b).map_err(|source| OpError::NotUtf8 { source })?;
                let ids = tok
                    .encode(text, *options)
                    .map_err(|why| OpError::wrong_input("tokenize", why))?;
                let data: Vec<u8> = ids
                    .iter()
                    .flat_map(|&i| i64::from(i).to_le_bytes())
                    .collect();
                Value::Array(Array::new(DType::I64, vec![ids.len()], data.into()))
            }
            (Step::FillSlot(column), value) if !matches!(value, Value::InSlot) => {
                let Some(dst) = slot else {
                    return Err(self.bug());
                };
                let mut tmp = Sample::new(0);
                tmp.set(FieldName::Owned(column.name.clone()), into_field(value));
                column
                    .fill_from(&mut tmp, dst)
                    .map_err(|e| OpError::wrong_input("batch column", e.to_string()))?;
                Value::InSlot
            }
            #[cfg(feature = "audio")]
            (step, value) if step.is_audio() => step.run_audio(value, rng)?,
            #[cfg(feature = "video")]
            (Step::DecodeVideo(req), Value::Bytes(b)) => {
                let b = crate::files::resolve(b, "decode_video")?;
                Value::Video(crate::video::decode_clips(&b, req, rng)?)
            }
            (step, value) => return Err(step.refuse(&value)),
        })
    }
}

/// The output size of `resize` for an `h` x `w` image, refused when too large ([`bounded`]).
fn resize_to(
    size: Size,
    max_size: Option<usize>,
    h: usize,
    w: usize,
) -> Result<(usize, usize), OpError> {
    let out = match size {
        Size::One(n) => image::resize_shorter(h, w, n, max_size),
        Size::Two([h, w]) => (h, w),
    };
    bounded(out, (h, w))
}

/// Refuses a resize to more than `max_image_pixels` pixels (an image of an extreme
/// aspect ratio, its shorter side resized without `max_size`) before anything is allocated.
fn bounded((oh, ow): (usize, usize), (h, w): (usize, usize)) -> Result<(usize, usize), OpError> {
    match oh.checked_mul(ow) {
        Some(n)
            if n <= super::max_out_pixels() && oh <= super::MAX_SIDE && ow <= super::MAX_SIDE =>
        {
            Ok((oh, ow))
        }
        _ => Err(OpError::wrong_input(
            "resize",
            format!(
                "a {h} x {w} image would be resized to {oh} x {ow}, more than {} pixels \
                 (max_image_pixels) or {} a side; give resize a max_size",
                super::max_out_pixels(),
                super::MAX_SIDE
            ),
        )),
    }
}

/// `img` (its region `crop`, if given) resized to `(oh, ow)`: into `dst` if given, otherwise
/// as a new image.
fn resized(
    img: &Image,
    crop: Option<image::Rect>,
    (oh, ow): (usize, usize),
    dst: Option<&mut [u8]>,
) -> Result<Value, OpError> {
    match dst {
        Some(dst) => {
            img.resize_into(crop, oh, ow, dst)?;
            Ok(Value::InSlot)
        }
        None => Ok(Value::Image(img.resize(crop, oh, ow)?)),
    }
}

/// A final value as a sample field.
pub(super) fn into_field(value: Value) -> Field {
    match value {
        Value::Bytes(b) => Field::Bytes(b),
        Value::Text(b) => Field::Text(b),
        Value::Nested(v) => Field::Value(v),
        Value::Array(a) => Field::Array(a),
        Value::Image(img) => Field::Array(image_array(img)),
        Value::Float { h, w, c, data } => Field::Array(float_array(vec![h, w, c], &data)),
        Value::InSlot => unreachable!("values in a slot are never fields"),
        #[cfg(feature = "audio")]
        Value::Audio { audio, flat, .. } => {
            let shape = if flat {
                vec![audio.frames()]
            } else {
                vec![audio.channels, audio.frames()]
            };
            Field::Array(float_array(shape, &audio.data))
        }
        #[cfg(feature = "audio")]
        Value::Features {
            data, rows, cols, ..
        } => Field::Array(float_array(vec![rows, cols], &data)),
        #[cfg(feature = "video")]
        Value::Video(c) => Field::Array(Array::new(DType::U8, c.shape, c.data.into())),
    }
}

/// A `decode_video` op as the video module's request.
#[cfg(feature = "video")]
fn clip_request(op: &Op) -> crate::video::ClipRequest {
    use super::{ClipPolicy, ClipSampler, VideoCrop, VideoLayout};
    use crate::video::{ClipRequest, CropMode, Policy, Resize, Sampler, Sampling, Spacing};
    let Op::DecodeVideo {
        frames,
        clips,
        stride,
        fps,
        sampler,
        step,
        policy,
        indices,
        resize,
        crop,
        crop_mode,
        scale,
        ratio,
        layout,
        max_pixels,
        max_frames,
    } = op
    else {
        unreachable!("clip_request takes decode_video");
    };
    ClipRequest {
        sampling: Sampling {
            frames: *frames,
            clips: *clips,
            spacing: match fps {
                Some(f) => Spacing::Fps(*f),
                None => Spacing::Frames(*stride),
            },
            sampler: match (step, sampler) {
                (Some(s), _) => Sampler::Every(*s),
                (None, ClipSampler::Random) => Sampler::Random,
                (None, ClipSampler::Regular) => Sampler::Regular,
            },
            policy: match policy {
                ClipPolicy::RepeatLast => Policy::RepeatLast,
                ClipPolicy::Wrap => Policy::Wrap,
                ClipPolicy::Error => Policy::Error,
            },
        },
        indices: indices.clone(),
        resize: resize.map(|s| match s {
            Size::One(n) => Resize::Shorter(n),
            Size::Two([h, w]) => Resize::Exact(h, w),
        }),
        crop: crop.map(Size::square),
        crop_mode: match crop_mode {
            VideoCrop::Center => CropMode::Center,
            VideoCrop::Random => CropMode::Random,
            VideoCrop::RandomResized => CropMode::RandomResized {
                scale: *scale,
                ratio: *ratio,
            },
        },
        channels_first: *layout == VideoLayout::Tchw,
        limits: crate::video::VideoLimits {
            max_pixels: *max_pixels,
            max_frames: *max_frames,
            ..Default::default()
        },
    }
}

/// The field a value brings beside itself: the `<name>_mask` of audio after `crop_audio`
/// (bool, the audio's shape, true where audio is).
pub(super) fn companion(value: &Value, name: &str) -> Option<(String, Field)> {
    #[cfg(feature = "video")]
    if let Value::Video(c) = value {
        let bytes: Vec<u8> = c.pts.iter().flat_map(|v| v.to_le_bytes()).collect();
        let pts = Array::new(DType::F64, c.pts_shape.clone(), bytes.into());
        return Some((format!("{name}_pts"), Field::Array(pts)));
    }
    #[cfg(feature = "audio")]
    if let Value::Audio {
        audio,
        flat,
        valid: Some(valid),
    } = value
    {
        let n = audio.frames();
        let mut mask = vec![0u8; audio.channels * n];
        for c in 0..audio.channels {
            mask[c * n..c * n + valid].fill(1);
        }
        let shape = if *flat {
            vec![n]
        } else {
            vec![audio.channels, n]
        };
        let mask = Array::new(DType::Bool, shape, mask.into());
        return Some((format!("{name}_mask"), Field::Array(mask)));
    }
    let _ = (value, name);
    None
}

/// An image as a `uint8 [H, W, C]` array.
fn image_array(img: Image) -> Array {
    Array::new(
        DType::U8,
        vec![img.height, img.width, img.channels],
        img.data.into(),
    )
}

/// `a`, to be cast to `dtype` in the batch.
fn cast(mut a: Array, dtype: DType) -> Value {
    a.cast = Some(dtype);
    Value::Array(a)
}

fn float_array(shape: Vec<usize>, data: &[f32]) -> Array {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    Array::new(DType::F32, shape, bytes.into())
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
) -> Result<Value, OpError> {
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
            Ok(Value::InSlot)
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
fn parse_label(b: &[u8]) -> Result<i64, OpError> {
    let text = String::from_utf8_lossy(b);
    text.trim().parse::<i64>().map_err(|_| OpError::BadLabel {
        label: text.chars().take(40).collect(),
    })
}

fn json_value(b: &[u8]) -> Result<Value, OpError> {
    use serde_json::Value as J;
    let bad = |reason: String| OpError::BadJson { reason };
    let v: J = serde_json::from_slice(b).map_err(|e| bad(format!("not JSON: {e}")))?;
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
        // Objects, null and other lists: a nested value (a dict or list in Python, as
        // `json.loads` gives them).
        J::Array(items) => match numbers(items) {
            Some(v) => Ok(v),
            None => nested(b),
        },
        _ => nested(b),
    }
}

/// A decoded member's value as `json` gives values: a number a scalar, a list of numbers a
/// 1-D array (`int64` when all are integers), text as text, anything else nested.
fn top_level(v: chute_core::Value) -> Value {
    use chute_core::Value as V;
    let scalar = |dtype: DType, b: &[u8]| Array::new(dtype, Vec::new(), Bytes::copy_from_slice(b));
    match v {
        V::Int(i) => Value::Array(Array::scalar_i64(i)),
        V::UInt(u) => Value::Array(scalar(DType::F64, &(u as f64).to_le_bytes())),
        V::Float(f) => Value::Array(scalar(DType::F64, &f.to_le_bytes())),
        V::Bool(x) => Value::Array(scalar(DType::Bool, &[u8::from(x)])),
        V::Text(t) => Value::Text(t),
        V::List(items) if items.iter().all(|x| matches!(x, V::Int(_))) => {
            let data: Vec<u8> = items
                .iter()
                .flat_map(|x| match x {
                    V::Int(i) => i.to_le_bytes(),
                    _ => [0; 8],
                })
                .collect();
            Value::Array(Array::new(DType::I64, vec![items.len()], data.into()))
        }
        V::List(items)
            if items
                .iter()
                .all(|x| matches!(x, V::Int(_) | V::UInt(_) | V::Float(_))) =>
        {
            let data: Vec<u8> = items
                .iter()
                .flat_map(|x| match x {
                    V::Int(i) => (*i as f64).to_le_bytes(),
                    V::UInt(u) => (*u as f64).to_le_bytes(),
                    V::Float(f) => f.to_le_bytes(),
                    _ => [0; 8],
                })
                .collect();
            Value::Array(Array::new(DType::F64, vec![items.len()], data.into()))
        }
        v => Value::Nested(v),
    }
}

/// An [`OpError::BadMember`] of `format`.
fn bad_member(format: &'static str) -> impl Fn(String) -> OpError {
    move |reason| OpError::BadMember { format, reason }
}

/// The `auto` op on the field `name`: decoded as the `webdataset` package's default decoder
/// decodes a member of that name (see [`crate::members::by_extension`]).
pub(super) fn auto(name: &str, value: Value, pickle: bool) -> Result<Value, OpError> {
    use crate::members::Member;
    let Value::Bytes(b) = value else {
        return Ok(value); // an array a source gave: nothing to decode
    };
    let step = match crate::members::by_extension(name) {
        Member::Text => Step::Text,
        Member::Label => Step::Label,
        Member::Json => Step::Json,
        Member::Npy => Step::Npy,
        Member::Npz => Step::Npz,
        Member::Tenbin => Step::Tenbin,
        Member::Msgpack => Step::Msgpack,
        Member::Pickle if pickle => Step::Bytes,
        Member::Pickle => {
            return Err(OpError::BadMember {
                format: "pickle",
                reason: "a pickle is not unpickled: loading one runs its code; if the data \
                         is trusted, give auto \"pickle\": true (the Python package then \
                         unpickles it) or decode it in your own transform"
                    .into(),
            });
        }
        Member::Bytes => Step::Bytes,
    };
    step.run(Value::Bytes(b), &mut SampleRng::for_sample(0, 0, 0), None)
}

fn nested(b: &[u8]) -> Result<Value, OpError> {
    chute_core::Value::from_json(b)
        .map(Value::Nested)
        .map_err(|reason| OpError::BadJson {
            reason: format!("not JSON: {reason}"),
        })
}

#[cfg(feature = "audio")]
impl Step {
    fn is_audio(&self) -> bool {
        matches!(
            self,
            Step::DecodeAudio { .. }
                | Step::Resample(_)
                | Step::CropAudio { .. }
                | Step::LogMel { .. }
                | Step::Fbank(_)
                | Step::SpecAugment { .. }
        )
    }

    /// An audio step on `value` (see [`crate::audio`]).
    fn run_audio(&self, value: Value, rng: &mut SampleRng) -> Result<Value, OpError> {
        use crate::audio::{self, features};
        Ok(match (self, value) {
            (
                Step::DecodeAudio {
                    mono,
                    sample_rate,
                    limits,
                },
                Value::Bytes(b),
            ) => {
                let b = crate::files::resolve(b, "decode_audio")?;
                let mut a = audio::decode(&b, limits)?;
                if *mono {
                    a = a.mono();
                }
                if let Some(rate) = sample_rate {
                    a = audio::resample::resample(&a, *rate);
                }
                Value::Audio {
                    audio: a,
                    flat: *mono,
                    valid: None,
                }
            }
            (Step::Resample(rate), Value::Audio { audio: a, flat, .. }) => Value::Audio {
                audio: audio::resample::resample(&a, *rate),
                flat,
                valid: None,
            },
            (
                Step::CropAudio {
                    seconds,
                    samples,
                    random,
                },
                Value::Audio { audio: a, flat, .. },
            ) => {
                let n = match (seconds, samples) {
                    (Some(s), _) => (s * f64::from(a.rate)).round() as usize,
                    (None, Some(n)) => *n,
                    (None, None) => return Err(self.bug()),
                };
                let bound = crate::audio::AudioLimits::default();
                if n as f64 > bound.max_seconds * f64::from(bound.max_rate) {
                    return Err(OpError::wrong_input("crop_audio", format!("{n} frames")));
                }
                // The draw happens whether or not the clip is longer, so the RNG's stream
                // does not depend on the clip's length.
                let u = random.then(|| rng.next_f64());
                let (a, kept) = audio::crop(&a, n, u);
                Value::Audio {
                    audio: a,
                    flat,
                    valid: Some(kept),
                }
            }
            (Step::LogMel { n_mels, n_samples }, Value::Audio { audio: a, .. }) => {
                if a.rate != features::WHISPER_RATE || a.channels != 1 {
                    return Err(OpError::wrong_input(
                        "log_mel",
                        format!(
                            "takes 16 kHz mono audio, got {} channels at {} Hz: decode with \
                             {{\"mono\": true, \"sample_rate\": 16000}}",
                            a.channels, a.rate
                        ),
                    ));
                }
                let (data, frames) = features::log_mel(&a.data, *n_mels, *n_samples);
                Value::Features {
                    data,
                    rows: *n_mels,
                    cols: frames,
                    time_axis: 1,
                }
            }
            (Step::Fbank(o), Value::Audio { audio: a, .. }) => {
                let (data, frames, bins) = features::fbank(a.channel(0), a.rate, o, rng)
                    .map_err(|why| OpError::wrong_input("fbank", why))?;
                Value::Features {
                    data,
                    rows: frames,
                    cols: bins,
                    time_axis: 0,
                }
            }
            (
                Step::SpecAugment {
                    masks,
                    max_time_ratio,
                    value,
                },
                Value::Features {
                    mut data,
                    rows,
                    cols,
                    time_axis,
                },
            ) => {
                features::spec_augment(
                    &mut data,
                    rows,
                    cols,
                    time_axis,
                    *masks,
                    *max_time_ratio,
                    *value,
                    rng,
                );
                Value::Features {
                    data,
                    rows,
                    cols,
                    time_axis,
                }
            }
            (step, value) => return Err(step.refuse(&value)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(json: &str) -> Vec<Op> {
        serde_json::from_str(json).unwrap()
    }

    fn column(shape: &[usize], dtype: DType) -> Slot {
        Slot {
            name: "x".into(),
            dtype,
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn fusions_are_decided_when_compiled() {
        let imagenet = ops(
            r#"[{"op": "decode"}, {"op": "random_resized_crop", "size": 8},
                {"op": "horizontal_flip"}, {"op": "normalize", "mean": [0.5], "std": [0.5]},
                {"op": "chw"}]"#,
        );
        let normalize = |to_slot| Step::Normalize {
            mean: vec![0.5],
            std: vec![0.5],
            chw: true,
            to_slot,
        };
        let region = |to_slot| Step::DecodeRegion {
            mode: ColorMode::Rgb,
            region: Region::RandomResizedCrop {
                size: (8, 8),
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0],
            },
            to_slot,
            max_pixels: crate::image::DEFAULT_MAX_PIXELS,
        };
        assert_eq!(
            compile(&imagenet, None),
            [region(false), Step::Flip { p: 0.5 }, normalize(false)]
        );
        let slot = column(&[3, 8, 8], DType::F32);
        assert_eq!(
            compile(&imagenet, Some(&slot)),
            [region(false), Step::Flip { p: 0.5 }, normalize(true)]
        );
        // The fused decode writes into the slot; the flip after it flips the slot.
        let crop = ops(
            r#"[{"op": "decode"}, {"op": "random_resized_crop", "size": 8},
                {"op": "horizontal_flip"}]"#,
        );
        let flip_slot = Step::FlipSlot {
            p: 0.5,
            width: 8,
            channels: 3,
        };
        let slot = column(&[8, 8, 3], DType::U8);
        assert_eq!(
            compile(&crop, Some(&slot)),
            [region(true), flip_slot.clone()]
        );
        // Without `reduced`, the crop is a step of its own, and it writes into the slot.
        let full = ops(
            r#"[{"op": "decode", "reduced": false}, {"op": "random_resized_crop", "size": 8},
                {"op": "horizontal_flip"}]"#,
        );
        assert_eq!(
            compile(&full, Some(&slot))[..2],
            [
                Step::Decode {
                    mode: ColorMode::Rgb,
                    max_pixels: crate::image::DEFAULT_MAX_PIXELS,
                },
                Step::RandomResizedCrop {
                    size: (8, 8),
                    scale: [0.08, 1.0],
                    ratio: [0.75, 4.0 / 3.0],
                    to_slot: true
                }
            ]
        );
        // No step can write a label into its slot: the value is converted at the end.
        let slot = column(&[], DType::I64);
        assert_eq!(
            compile(&ops(r#"[{"op": "label"}]"#), Some(&slot)),
            [Step::Label, Step::FillSlot(slot.clone())]
        );
    }
}
