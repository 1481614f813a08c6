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
//! Fields are processed in sorted key order; fields not named pass through unchanged. The key
//! `"*"` stands for every field that no other key names (nor gives as an output, nor starts
//! with `__`): `{"*": [{"op": "auto"}]}` decodes a WebDataset sample as the `webdataset`
//! package's `.decode()` does.
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
//! | `json` | JSON bytes | a number a scalar, a list of numbers a 1-D array, a string text; anything else (an object, null, other lists) a nested value ([`chute_core::Value`]: a dict or list in Python, as `json.loads` gives it) |
//! | `msgpack` | msgpack bytes (`.mp`) | as `json` gives values, from what `msgpack.unpackb` reads (maps with str keys dicts, with bytes keys maps; extension types refused) |
//! | `npz` | an `.npz` archive | a nested value: a record of its arrays by name, as `dict(numpy.load(f))` (each member's size against `max_decoded_bytes`) |
//! | `tenbin` | a tenbin buffer (`.ten`, `webdataset.tenbin`) | a nested value: a list of arrays |
//! | `auto` (`pickle` = false) | a WebDataset member | decoded by its name's last extension as the `webdataset` package's default decoder does: `txt`/`text`/`transcript` text, `cls`/`cls2`/`index`/`inx`/`id` an `int64` label, `json`/`jsn` as `json`, `npy`, `npz`, `ten`/`tb` as `tenbin`, `mp`/`msg`/`msgpack` as `msgpack`; everything else (images, audio, video, `pth`, `cbor`) its bytes; `pyd`/`pkl`/`pickle` refused (unpickling runs code) unless `pickle: true`, which passes them on as bytes for the Python package to unpickle; its field's only op |
//! | `tokenize` (`tokenizer`: a `tokenizer.json`; `add_special_tokens` = true; `bos`, `eos`: an id or a token; `max_length`; `prompt`, `labels`: see [`Op::Tokenize`]) | UTF-8 text or bytes | `int64 [n]` token ids, as Hugging Face's `tokenizers` gives them (feature `tokenizers`); with `prompt`, the prompt's ids then this field's, and `labels` with the prompt's as -100 |
//! | `chat` (`tokenizer`: a tokenizer folder; `chat_template`, `template_name`, `train_on`, `train_on_eos`, `max_length`, `truncation`, `kwargs`, `date`, `tools`, `completion`, `chosen`, `rejected`, `labels`: see [`Op::Chat`]) | a conversation's messages (or a prompt, or a chosen completion), with the sample's other fields it names | `int64 [n]` ids rendered with the chat template as `transformers` renders them, and `labels` (-100 where the loss does not count), see [`crate::chat`] (feature `chat`); a preference pair gives `chosen_input_ids`, `chosen_labels`, `rejected_input_ids`, `rejected_labels`; its field's only op |
//!
//! | `decode_audio` (`mono`, `sample_rate`, `max_seconds`, `max_channels`) | encoded audio (WAV, FLAC, MP3, Vorbis, Opus, AAC/ALAC in MP4, ...), or a path or URL naming a file | `float32 [channels, frames]` (`[frames]` with `mono`), see [`crate::audio`] (feature `audio`) |
//! | `resample` (`sample_rate`) | decoded audio | decoded audio at that rate |
//! | `crop_audio` (`seconds` or `samples`, `random`) | decoded audio | decoded audio of that length, and a `<name>_mask` field |
//! | `log_mel` (`n_mels`, `n_samples`) | 16 kHz mono audio | Whisper's log-mel spectrogram, `float32 [n_mels, frames]` |
//! | `fbank` (torchaudio's Kaldi options, `scale`) | decoded audio | Kaldi filter banks, `float32 [frames, bins]` |
//! | `spec_augment` (`freq_masks`, `freq_width`, `time_masks`, `time_width`, `max_time_ratio`, `value`) | `log_mel` or `fbank` features | the features, masked |
//! | `decode_video` (`frames`, `clips`, `stride` or `fps`, `sampler`, `step`, `policy`, `indices`, `resize`, `crop`, `crop_mode`, `scale`, `ratio`, `layout`, `max_pixels`, `max_frames`: see [`Op::DecodeVideo`]) | encoded video (any codec and container the system's FFmpeg reads), or a path or URL naming a file | `uint8 [T, H, W, 3]` RGB clips (`[clips, T, ...]` for several; `TCHW` on request) and a `<name>_pts` field of the frames' times, `float64` seconds (feature `video`); its field's only op |
//!
//! Output sizes are at most 65,535 a side and 178,956,970 pixels (PIL's bomb limit): a spec
//! asking for more is refused when built, and a `resize` of the shorter side that would give
//! more (an image of an extreme aspect ratio, without `max_size`) fails its sample before
//! anything is allocated.
//!
//! Randomness (`random_resized_crop`, `horizontal_flip`, `crop_audio`'s offset, `fbank`'s
//! dither, `spec_augment`, `decode_video`'s clip starts and crops) comes only from the sample's
//! RNG, so
//! crops and flips depend on (seed, epoch, sample), never on the worker. When `decode` is
//! followed by `random_resized_crop` or `resize`, the crop is drawn from the image's header
//! size before decoding, so the decoder may decode at a reduced size where the output is much
//! smaller: the same crop either way.
//!
//! Each field's ops are compiled into steps when the pipeline is built: the fusions (`decode`
//! with the crop or resize after it, `normalize` with `chw`, and for a field of fixed shape
//! the op that writes straight into its batch slot) are decided once, and a sample runs
//! through a flat list of steps, in op order.

use std::str::FromStr;

use chute_core::{BoxError, ConfigError, DType, Field, FieldName, Sample, SampleRng};

use serde::Deserialize;

use crate::image::ColorMode;
use crate::{BadData, OpError, Slot, Transform};

mod chat;
mod step;
use step::{CompiledField, Value};

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
        /// Most pixels (height x width, from the header) an image may declare: a larger one
        /// is a data error naming its size, refused before any pixel buffer is allocated, as
        /// PIL's `MAX_IMAGE_PIXELS` does (default: the process's
        /// [`Limits::max_image_pixels`](chute_core::Limits) when the spec is built,
        /// [`crate::image::DEFAULT_MAX_PIXELS`], PIL's limit for its `DecompressionBombError`,
        /// unless raised). Raise it for images that large.
        #[serde(default = "default_max_pixels")]
        max_pixels: u64,
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
    /// msgpack bytes (`.mp`), as `msgpack.unpackb` reads them, given as `json` gives values.
    Msgpack,
    /// An `.npz` archive: a record of its arrays by name, as `dict(numpy.load(f))`.
    Npz,
    /// A tenbin buffer (`.ten`, `webdataset.tenbin`): a list of arrays.
    Tenbin,
    /// Each member decoded by its name's extension as the `webdataset` package's default
    /// decoder does (see [`crate::members::by_extension`]): text, integer labels, JSON, `.npy`,
    /// `.npz`, tenbin, msgpack; anything else (images, audio, video, `.pth`, `.cbor`) stays
    /// bytes. Pickles (`.pyd`, `.pkl`, `.pickle`) are refused, since unpickling runs code:
    /// `pickle: true` passes them on as bytes, and the Python package then unpickles them.
    /// Its field's only op; the key `"*"` applies it to every field no other key names.
    Auto {
        /// Let pickles through (as bytes; the Python package unpickles them).
        #[serde(default)]
        pickle: bool,
    },
    /// UTF-8 text (or bytes) to its token ids, `int64 [n]`, with Hugging Face's `tokenizers`
    /// (the ids its Python package gives for the same `tokenizer.json`).
    Tokenize {
        /// The `tokenizer.json`'s path.
        tokenizer: String,
        /// The tokenizer's own special tokens (its post-processor), as
        /// `tokenizer.encode(text)` adds them by default (default true).
        #[serde(default = "yes")]
        add_special_tokens: bool,
        /// An id (or a token, such as `"<s>"`) put before the text's.
        #[serde(default)]
        bos: Option<TokenRef>,
        /// An id (or a token, such as `"<|endoftext|>"`) put after the text's.
        #[serde(default)]
        eos: Option<TokenRef>,
        /// At most this many ids (the text's are cut; BOS and EOS kept).
        #[serde(default)]
        max_length: Option<usize>,
        /// Supervised fine-tuning: the field holding the prompt. This field is then the
        /// response: the ids are the prompt's then the response's, and a `labels` field holds
        /// the same ids with the prompt's replaced by -100 (the ignore index of PyTorch's
        /// cross-entropy), so only the response counts in the loss. Only as the first op.
        #[serde(default)]
        prompt: Option<String>,
        /// The labels field's name (default `labels`), with `prompt`.
        #[serde(default)]
        labels: Option<String>,
    },
    /// A conversation (this field: a list of messages), a prompt (with `completion`, or
    /// `chosen` and `rejected`) or a preference pair (this field the chosen, with `rejected`)
    /// rendered with a chat template as `transformers` renders it, tokenized, and labelled
    /// (see [`crate::chat`]; feature `chat`). Gives `int64 [n]` ids (the output field,
    /// default `input_ids`) and `labels` (-100 where the loss does not count); a pair gives
    /// `chosen_input_ids`, `chosen_labels`, `rejected_input_ids`, `rejected_labels`. The
    /// fields it reads are taken out of the sample. The only op of its field.
    Chat {
        /// A tokenizer folder (`tokenizer.json`, `tokenizer_config.json`, ...) or a
        /// `tokenizer.json` path.
        tokenizer: String,
        /// A template's text or a `.jinja` file, instead of the tokenizer's.
        #[serde(default)]
        chat_template: Option<String>,
        /// Which named template (default: `tool_use` for a sample with tools, else `default`).
        #[serde(default)]
        template_name: Option<String>,
        /// `assistant` (default), `last` or `all`.
        #[serde(default)]
        train_on: Option<String>,
        /// Whether an assistant's end-of-turn token is trained (default true).
        #[serde(default = "yes")]
        train_on_eos: bool,
        /// At most this many ids.
        #[serde(default)]
        max_length: Option<usize>,
        /// `keep_start` (default), `keep_end` or `drop` (then the sample fails, a counted skip
        /// with `on_error="skip"`).
        #[serde(default)]
        truncation: Option<String>,
        /// Template variables (`{"enable_thinking": false}`).
        #[serde(default)]
        kwargs: Option<serde_json::Map<String, serde_json::Value>>,
        /// What `strftime_now` formats (`2024-07-26`; default today, UTC).
        #[serde(default)]
        date: Option<String>,
        /// The field of the tools (default `tools`), when a sample has it.
        #[serde(default)]
        tools: Option<String>,
        /// The field of the completion: this field is then the prompt.
        #[serde(default)]
        completion: Option<String>,
        /// The field of the chosen completion: this field is then the prompt.
        #[serde(default)]
        chosen: Option<String>,
        /// The field of the rejected completion (a preference pair).
        #[serde(default)]
        rejected: Option<String>,
        /// The labels field's name (default `labels`).
        #[serde(default)]
        labels: Option<String>,
        /// Render with the assistant's header after the conversation.
        #[serde(default)]
        add_generation_prompt: bool,
        /// Leave the last message open (`transformers`' `continue_final_message`).
        #[serde(default)]
        continue_final_message: bool,
    },
    /// Encoded audio (WAV, FLAC, MP3, Ogg Vorbis or Opus, Opus in WebM, AAC or ALAC in MP4,
    /// ..., told by the content) to `float32 [channels, frames]` in [-1, 1] (feature `audio`;
    /// see [`crate::audio`]).
    DecodeAudio {
        /// One channel, the mean of all: `float32 [frames]` (as `datasets`' `Audio` gives).
        #[serde(default)]
        mono: bool,
        /// Resample to this rate (see [`Op::Resample`]).
        #[serde(default)]
        sample_rate: Option<u32>,
        /// Most seconds a stream may decode to (default 3,600): longer is a data error.
        #[serde(default = "default_max_seconds")]
        max_seconds: f64,
        /// Most channels a stream may have (default 64).
        #[serde(default = "default_max_channels")]
        max_channels: usize,
    },
    /// Audio to another rate: a band-limited polyphase windowed-sinc filter designed as
    /// soxr's high quality preset is (see [`crate::audio::resample`]).
    Resample {
        /// The rate, frames per second.
        sample_rate: u32,
    },
    /// Audio cut or zero-padded to a fixed length, with a `<name>_mask` field (bool, the
    /// audio's shape) true where audio is (every sample has it, padded or not).
    CropAudio {
        /// The length in seconds (or give `samples`).
        #[serde(default)]
        seconds: Option<f64>,
        /// The length in frames.
        #[serde(default)]
        samples: Option<usize>,
        /// A random offset (drawn from the sample's RNG) instead of the start.
        #[serde(default)]
        random: bool,
    },
    /// Whisper's log-mel spectrogram of 16 kHz mono audio, `float32 [n_mels, frames]` (see
    /// [`crate::audio::features::log_mel`]).
    LogMel {
        /// 80 (Whisper up to large-v2) or 128 (large-v3).
        #[serde(default = "default_n_mels")]
        n_mels: usize,
        /// Pad or cut the audio to this many samples first (default 480,000, Whisper's 30 s:
        /// 3,000 frames); `null` keeps its length.
        #[serde(default = "default_n_samples")]
        n_samples: Option<usize>,
    },
    /// Kaldi filter banks, as `torchaudio.compliance.kaldi.fbank` computes them, `float32
    /// [frames, bins]` (see [`FbankOptions`] for the options and their defaults).
    Fbank(FbankOptions),
    /// SpecAugment's masks on `log_mel` or `fbank` features: frequency bands and time spans
    /// set to `value`, drawn from the sample's RNG.
    SpecAugment {
        /// Frequency masks (default 2).
        #[serde(default = "two")]
        freq_masks: usize,
        /// Widest frequency mask, bins (torchaudio's `freq_mask_param`; default 27).
        #[serde(default = "default_freq_width")]
        freq_width: usize,
        /// Time masks (default 2).
        #[serde(default = "two")]
        time_masks: usize,
        /// Widest time mask, frames (torchaudio's `time_mask_param`; default 100).
        #[serde(default = "default_time_width")]
        time_width: usize,
        /// Widest time mask as a fraction of the frames (torchaudio's `p`; default 1).
        #[serde(default = "one")]
        max_time_ratio: f64,
        /// What masked values become (default 0).
        #[serde(default)]
        value: f32,
    },
    /// Encoded video (H.264, H.265, VP9, AV1, ... in MP4, MKV/WebM, MPEG-TS, AVI, told by the
    /// content), or a path or URL naming a file, to clips of `uint8` RGB frames `[T, H, W,
    /// 3]` (`[clips, T, H, W, 3]` for several clips), with a `<name>_pts` field: each frame's
    /// presentation time, `float64` seconds (feature `video`; see the `chute_ops::video`
    /// module for the sampling rules). Its field's only op.
    DecodeVideo {
        /// Frames per clip (default 16).
        #[serde(default = "sixteen")]
        frames: usize,
        /// Clips per video (default 1).
        #[serde(default = "one_usize")]
        clips: usize,
        /// Frames between a clip's frames, by index (default 1; torchcodec's
        /// `num_indices_between_frames`).
        #[serde(default = "one_usize")]
        stride: usize,
        /// Frames at this rate instead (the frame shown every `1 / fps` seconds).
        #[serde(default)]
        fps: Option<f64>,
        /// Where clips start: `random` (default; the sample's RNG) or `regular`.
        #[serde(default)]
        sampler: ClipSampler,
        /// Instead of `clips` and `sampler`: every clip that fits, starting this far apart from
        /// the first frame: frames (a whole number; DALI's `step`), or seconds with `fps`
        /// (torchcodec's `clips_at_regular_timestamps`, `seconds_between_clip_starts`). The
        /// output always has the clips axis, `[clips, T, ...]`, its length the video's (at
        /// least one clip, at most 10,000, more being the sample's error): batch such samples with
        /// `pad=True`, or get a list.
        #[serde(default)]
        step: Option<f64>,
        /// Past the end of the video: `repeat_last` (default), `wrap` or `error`.
        #[serde(default)]
        policy: ClipPolicy,
        /// Exactly these frames, in this order (instead of clips).
        #[serde(default)]
        indices: Option<Vec<usize>>,
        /// Resize first: the shorter side (one number) or `[h, w]`.
        #[serde(default)]
        resize: Option<Size>,
        /// Crop to this size (one number, square, or `[h, w]`).
        #[serde(default)]
        crop: Option<Size>,
        /// Where the crop is taken: `center` (default), `random`, or `random_resized`
        /// (torchvision's `RandomResizedCrop` with `scale` and `ratio`).
        #[serde(default)]
        crop_mode: VideoCrop,
        /// `random_resized`'s area fraction range (default `[0.08, 1]`).
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        /// `random_resized`'s aspect ratio range (default `[3/4, 4/3]`).
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
        /// `THWC` (default) or `TCHW`.
        #[serde(default)]
        layout: VideoLayout,
        /// Most pixels a frame may declare (default: the process's `max_image_pixels`).
        #[serde(default = "default_max_pixels")]
        max_pixels: u64,
        /// Most frames a stream may hold (default 1,000,000).
        #[serde(default = "default_max_frames")]
        max_frames: usize,
    },
}

/// `decode_video`'s clip starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipSampler {
    /// Uniform in the range clips may start in, from the sample's RNG.
    #[default]
    Random,
    /// Evenly spaced over that range.
    Regular,
}

/// `decode_video`'s policy past the end of the video.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipPolicy {
    /// Repeat the clip's last frame.
    #[default]
    RepeatLast,
    /// Start the clip's frames over.
    Wrap,
    /// A data error.
    Error,
}

/// `decode_video`'s crop placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VideoCrop {
    /// The center.
    #[default]
    Center,
    /// Anywhere, from the sample's RNG.
    Random,
    /// torchvision's `RandomResizedCrop`.
    RandomResized,
}

/// `decode_video`'s frame layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum VideoLayout {
    /// `[T, H, W, C]`.
    #[default]
    #[serde(rename = "THWC")]
    Thwc,
    /// `[T, C, H, W]`.
    #[serde(rename = "TCHW")]
    Tchw,
}

fn sixteen() -> usize {
    16
}

fn one_usize() -> usize {
    1
}

fn default_max_frames() -> usize {
    1_000_000
}

fn default_max_seconds() -> f64 {
    3600.0
}

fn default_max_channels() -> usize {
    64
}

fn default_n_mels() -> usize {
    80
}

#[allow(clippy::unnecessary_wraps)]
fn default_n_samples() -> Option<usize> {
    Some(480_000)
}

fn two() -> usize {
    2
}

fn one() -> f64 {
    1.0
}

fn default_freq_width() -> usize {
    27
}

fn default_time_width() -> usize {
    100
}

/// `torchaudio.compliance.kaldi.fbank`'s options that change its output, with its defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FbankOptions {
    /// Mel bins (23).
    pub num_mel_bins: usize,
    /// Frame length, ms (25).
    pub frame_length: f64,
    /// Frame shift, ms (10).
    pub frame_shift: f64,
    /// Gaussian noise added (0: none; drawn from the sample's RNG).
    pub dither: f64,
    /// Pre-emphasis (0.97).
    pub preemphasis_coefficient: f64,
    /// Subtract each frame's mean (true).
    pub remove_dc_offset: bool,
    /// `povey` (default), `hanning`, `hamming`, `rectangular` or `blackman`.
    pub window_type: String,
    /// FFT size rounded up to a power of two (true).
    pub round_to_power_of_two: bool,
    /// Lowest mel frequency, Hz (20).
    pub low_freq: f64,
    /// Highest mel frequency, Hz; 0 or negative: relative to Nyquist (0).
    pub high_freq: f64,
    /// Power (true) or magnitude spectrum.
    pub use_power: bool,
    /// Log of the energies (true).
    pub use_log_fbank: bool,
    /// Frames only where they fit whole (true); false centres them as Kaldi's
    /// `--snip-edges=false`.
    pub snip_edges: bool,
    /// Add the log energy as a first column (false).
    pub use_energy: bool,
    /// Energy before windowing (true).
    pub raw_energy: bool,
    /// Floor of the energy (1.0; 0 for none).
    pub energy_floor: f64,
    /// Subtract each bin's mean over the frames (false).
    pub subtract_mean: bool,
    /// Blackman's coefficient (0.42).
    pub blackman_coeff: f64,
    /// The waveform is multiplied by this first (1; 32768 for features of int16-scaled audio,
    /// as Kaldi's tools read WAV files).
    pub scale: f64,
}

impl Default for FbankOptions {
    fn default() -> Self {
        FbankOptions {
            num_mel_bins: 23,
            frame_length: 25.0,
            frame_shift: 10.0,
            dither: 0.0,
            preemphasis_coefficient: 0.97,
            remove_dc_offset: true,
            window_type: "povey".into(),
            round_to_power_of_two: true,
            low_freq: 20.0,
            high_freq: 0.0,
            use_power: true,
            use_log_fbank: true,
            snip_edges: true,
            use_energy: false,
            raw_energy: true,
            energy_floor: 1.0,
            subtract_mean: false,
            blackman_coeff: 0.42,
            scale: 1.0,
        }
    }
}

/// A token given by id or by its text in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum TokenRef {
    /// An id.
    Id(u32),
    /// A token's text (`"<|endoftext|>"`).
    Token(String),
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
            Op::Msgpack => "msgpack",
            Op::Npz => "npz",
            Op::Tenbin => "tenbin",
            Op::Auto { .. } => "auto",
            Op::Tokenize { .. } => "tokenize",
            Op::Chat { .. } => "chat",
            Op::DecodeAudio { .. } => "decode_audio",
            Op::Resample { .. } => "resample",
            Op::CropAudio { .. } => "crop_audio",
            Op::LogMel { .. } => "log_mel",
            Op::Fbank(_) => "fbank",
            Op::SpecAugment { .. } => "spec_augment",
            Op::DecodeVideo { .. } => "decode_video",
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
    /// Decoded audio, `float32 [channels, frames]`.
    Audio,
    /// Speech features (`log_mel`, `fbank`).
    Features,
    /// Video clips.
    Video,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Bytes => "encoded bytes",
            Kind::Image => "a decoded image",
            Kind::Float => "normalized pixels",
            Kind::Array => "an array",
            Kind::Text => "text",
            Kind::Audio => "decoded audio",
            Kind::Features => "speech features",
            Kind::Video => "video clips",
        }
    }
}

/// The kind `op` gives from `input`, or why it cannot take it.
fn output_kind(op: &Op, input: Kind) -> Result<Kind, String> {
    let out = match (op, input) {
        (
            Op::Decode { .. }
            | Op::Label
            | Op::Npy
            | Op::Json
            | Op::Msgpack
            | Op::Npz
            | Op::Tenbin
            | Op::Auto { .. },
            Kind::Bytes,
        ) => match op {
            Op::Decode { .. } => Kind::Image,
            _ => Kind::Array,
        },
        (Op::Text, Kind::Bytes) => Kind::Text,
        (Op::Tokenize { .. }, Kind::Bytes | Kind::Text) => Kind::Array,
        (
            Op::Resize { .. }
            | Op::CenterCrop { .. }
            | Op::RandomResizedCrop { .. }
            | Op::HorizontalFlip { .. },
            Kind::Image,
        ) => Kind::Image,
        (Op::Normalize { .. }, Kind::Image) => Kind::Float,
        (Op::Chw | Op::Cast { .. }, Kind::Image | Kind::Float | Kind::Array) => Kind::Array,
        (Op::DecodeAudio { .. }, Kind::Bytes) => Kind::Audio,
        (Op::DecodeVideo { .. }, Kind::Bytes) => Kind::Video,
        (Op::Resample { .. } | Op::CropAudio { .. }, Kind::Audio) => Kind::Audio,
        (Op::LogMel { .. } | Op::Fbank(_), Kind::Audio) => Kind::Features,
        (Op::SpecAugment { .. }, Kind::Features) => Kind::Features,
        (Op::Cast { .. }, Kind::Audio | Kind::Features) => Kind::Array,
        _ => {
            let needs = match op {
                Op::Decode { .. }
                | Op::Label
                | Op::Npy
                | Op::Json
                | Op::Text
                | Op::Msgpack
                | Op::Npz
                | Op::Tenbin
                | Op::Auto { .. } => "the field's bytes (put it first)",
                Op::Tokenize { .. } => "text or its bytes (put it first, or after text)",
                Op::Normalize { .. } => "a decoded image (after decode and the geometric ops)",
                Op::Chw | Op::Cast { .. } => "an image, normalized pixels or an array",
                Op::DecodeAudio { .. } | Op::DecodeVideo { .. } => {
                    "the field's bytes (put it first)"
                }
                Op::Resample { .. } | Op::CropAudio { .. } | Op::LogMel { .. } | Op::Fbank(_) => {
                    "decoded audio (after decode_audio)"
                }
                Op::SpecAugment { .. } => "speech features (after log_mel or fbank)",
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
pub struct SampleOps {
    fields: Vec<FieldOps>,
    /// Batch columns written in place (see [`Transform::slots`]).
    slots: Vec<Slot>,
    /// Per field: its ops compiled into steps (see [`step`]).
    plans: Vec<CompiledField>,
    /// Per field: its `chat` op, loaded.
    chats: Vec<Option<chat::ChatOp>>,
}

impl SampleOps {
    /// A pipeline of `fields`, checked: every op must take what the op before it gives.
    pub fn new(fields: Vec<FieldOps>) -> Result<SampleOps, ConfigError> {
        for f in &fields {
            let field = f.names.join(";");
            if f.names.is_empty() || f.names.iter().any(String::is_empty) {
                return Err(ConfigError::new(
                    "transform",
                    format!("field {field:?}: an empty field name"),
                ));
            }
            if let Some(i) = f.ops.iter().skip(1).position(|op| {
                matches!(
                    op,
                    Op::Tokenize {
                        prompt: Some(_),
                        ..
                    }
                )
            }) {
                return Err(ConfigError::new(
                    "transform",
                    format!(
                        "field {field:?}, op {}: tokenize with a prompt reads two fields, so it \
                         comes first",
                        i + 2
                    ),
                ));
            }
            if let Some(i) = f.ops.iter().position(|op| matches!(op, Op::Chat { .. })) {
                if f.ops.len() != 1 {
                    return Err(ConfigError::new(
                        "transform",
                        format!(
                            "field {field:?}, op {}: chat reads a conversation's fields and \
                             gives ids and labels, so it is its field's only op",
                            i + 1
                        ),
                    ));
                }
                chat::ChatOp::new(&f.ops[0]).map_err(|why| {
                    ConfigError::new("transform", format!("field {field:?}, op 1 (chat): {why}"))
                })?;
                continue;
            }
            if let Some(i) = f.ops.iter().position(|op| matches!(op, Op::Auto { .. }))
                && f.ops.len() != 1
            {
                return Err(ConfigError::new(
                    "transform",
                    format!(
                        "field {field:?}, op {}: auto decodes each member by its name, so it \
                         is its field's only op (name a field's ops to do more with it)",
                        i + 1
                    ),
                ));
            }
            if f.names.iter().any(|n| n == ANY) && (f.names.len() != 1 || f.output.is_some()) {
                return Err(ConfigError::new(
                    "transform",
                    format!(
                        "field {field:?}: \"*\" stands for every field no other key names, \
                         alone (not with other names or \"as\")"
                    ),
                ));
            }
            let mut kind = Kind::Bytes;
            for (i, op) in f.ops.iter().enumerate() {
                kind = output_kind(op, kind).map_err(|why| {
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
        let mut slots: Vec<Slot> = Vec::new();
        let mut plans = Vec::with_capacity(fields.len());
        let mut chats = Vec::with_capacity(fields.len());
        for f in &fields {
            if let [op @ Op::Chat { .. }] = &f.ops[..] {
                let op = chat::ChatOp::new(op).map_err(|why| ConfigError::new("transform", why))?;
                chats.push(Some(op));
                plans.push(CompiledField::new(&[], None));
                continue;
            }
            chats.push(None);
            let slot = fixed_output(f).filter(|s| !slots.iter().any(|t| t.name == s.name));
            let at = slot.map(|s| {
                slots.push(s);
                slots.len() - 1
            });
            plans.push(CompiledField::new(&f.ops, at.map(|at| (at, &slots[at]))));
        }
        Ok(SampleOps {
            fields,
            slots,
            plans,
            chats,
        })
    }

    /// Parses the JSON form (see the module docs).
    pub fn from_json(text: &str) -> Result<SampleOps, ConfigError> {
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
        SampleOps::new(fields)
    }

    /// The fields and their ops.
    pub fn fields(&self) -> &[FieldOps] {
        &self.fields
    }
}

impl FromStr for SampleOps {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SampleOps::from_json(s)
    }
}

/// The batch column a field always gives, if its name and shape are known up front: a field
/// that is not optional, with one name (or an output name), and a shape fixed by its ops.
fn fixed_output(f: &FieldOps) -> Option<Slot> {
    if f.names.iter().any(|n| n == ANY) {
        return None;
    }
    let name = f.output.clone().or_else(|| match &f.names[..] {
        [one] => Some(one.clone()),
        _ => None,
    })?;
    let (dtype, shape) = static_output(&f.ops)?;
    (!f.optional).then_some(Slot { name, dtype, shape })
}

/// The batch dtype and per-sample shape `ops` always produce, if fixed by the ops alone.
fn static_output(ops: &[Op]) -> Option<(DType, Vec<usize>)> {
    let (mut channels, mut size, mut dtype, mut chw) = (None, None, DType::U8, false);
    let mut scalar = false;
    let mut features = None;
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
            Op::LogMel {
                n_mels,
                n_samples: Some(n),
            } => features = Some((*n_mels, n / crate::spec::WHISPER_HOP)),
            Op::SpecAugment { .. } => {}
            Op::Npy
            | Op::Text
            | Op::Json
            | Op::Msgpack
            | Op::Npz
            | Op::Tenbin
            | Op::Auto { .. }
            | Op::Tokenize { .. }
            | Op::Chat { .. }
            | Op::DecodeAudio { .. }
            | Op::Resample { .. }
            | Op::CropAudio { .. }
            | Op::LogMel { .. }
            | Op::Fbank(_)
            | Op::DecodeVideo { .. } => return None,
        }
    }
    if let Some((bins, frames)) = features {
        return Some((dtype_of_features(ops), vec![bins, frames]));
    }
    if scalar {
        return Some((dtype, Vec::new()));
    }
    let (c, (h, w)) = (channels?, size?);
    Some((dtype, if chw { vec![c, h, w] } else { vec![h, w, c] }))
}

/// The key that stands for every field no other key names (each one's ops run on each).
const ANY: &str = "*";

/// Whisper's hop, samples per frame.
pub(crate) const WHISPER_HOP: usize = 160;

/// Features' batch dtype: `float32`, or a `cast` after them.
fn dtype_of_features(ops: &[Op]) -> DType {
    match ops.last() {
        Some(Op::Cast { dtype }) => DType::from_str(dtype).unwrap_or(DType::F32),
        _ => DType::F32,
    }
}

fn default_max_pixels() -> u64 {
    chute_core::Limits::current().max_image_pixels
}

fn yes() -> bool {
    true
}

/// The largest side an op's output may have (JPEG's largest).
pub(crate) const MAX_SIDE: usize = 65_535;

/// The most pixels an op's output may have: the process's
/// [`Limits::max_image_pixels`](chute_core::Limits), as `decode`'s `max_pixels` default (PIL's
/// decompression-bomb limit unless raised).
pub(crate) fn max_out_pixels() -> usize {
    usize::try_from(chute_core::Limits::current().max_image_pixels).unwrap_or(usize::MAX)
}

fn check_params(op: &Op) -> Result<(), String> {
    let positive = |s: Size| {
        let (h, w) = s.square();
        if h == 0 || w == 0 {
            Err("a size of 0".to_string())
        } else if h > MAX_SIDE || w > MAX_SIDE || h * w > max_out_pixels() {
            Err(format!(
                "a size of {h} x {w}: at most {MAX_SIDE} a side and {} pixels (max_image_pixels)",
                max_out_pixels()
            ))
        } else {
            Ok(())
        }
    };
    match op {
        Op::Resize { size, max_size } => {
            positive(*size)?;
            if let Some(m) = max_size
                && *m > MAX_SIDE
            {
                return Err(format!("max_size {m}: at most {MAX_SIDE}"));
            }
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
        Op::Tokenize { .. } => {
            tokenizing(op)?;
        }
        Op::DecodeAudio { .. }
        | Op::Resample { .. }
        | Op::CropAudio { .. }
        | Op::LogMel { .. }
        | Op::Fbank(_)
        | Op::SpecAugment { .. } => check_audio(op)?,
        Op::DecodeVideo { .. } => check_video(op)?,
        _ => {}
    }
    Ok(())
}

#[cfg(not(feature = "video"))]
fn check_video(_: &Op) -> Result<(), String> {
    Err(
        "this build of chute has no video ops: build it with the cargo feature `video` (it \
         links the system's FFmpeg libraries; Debian: apt-get install libavcodec-dev \
         libavformat-dev libswscale-dev libclang-dev; the Python package: pip install with \
         MATURIN_PEP517_ARGS=\"--features video\")"
            .into(),
    )
}

#[cfg(feature = "video")]
fn check_video(op: &Op) -> Result<(), String> {
    let Op::DecodeVideo {
        frames,
        clips,
        stride,
        fps,
        step,
        indices,
        resize,
        crop,
        scale,
        ratio,
        max_frames,
        ..
    } = op
    else {
        return Ok(());
    };
    if let Some(s) = step {
        if fps.is_some() {
            if !(s.is_finite() && *s > 0.0 && *s <= 1e9) {
                return Err(format!("step {s}: seconds between clip starts, above 0"));
            }
        } else if !(s.is_finite() && *s >= 1.0 && s.fract() == 0.0 && *s <= 1e9) {
            return Err(format!(
                "step {s}: frames between clip starts, a whole number from 1 (or seconds, \
                 with fps)"
            ));
        }
        if *clips != 1 {
            return Err(format!(
                "clips {clips} with step: step takes every clip that fits; give one of them"
            ));
        }
        if indices.is_some() {
            return Err("step with indices: indices name the frames themselves".into());
        }
    }
    if *frames == 0 || *frames > 100_000 {
        return Err(format!("frames {frames}: 1 to 100,000 per clip"));
    }
    if *clips == 0 || *clips > 10_000 {
        return Err(format!("clips {clips}: 1 to 10,000"));
    }
    if *stride == 0 || *stride > 1_000_000 {
        return Err(format!("stride {stride}: 1 to 1,000,000"));
    }
    if let Some(f) = fps
        && !(f.is_finite() && *f > 0.0 && *f <= 10_000.0)
    {
        return Err(format!("fps {f}: a rate above 0, at most 10,000"));
    }
    if let Some(ix) = indices
        && (ix.is_empty() || ix.len() > 1_000_000)
    {
        return Err(format!("indices: 1 to 1,000,000 of them, got {}", ix.len()));
    }
    for (what, s) in [("resize", resize), ("crop", crop)] {
        if let Some(s) = s {
            let (h, w) = s.square();
            if h == 0 || w == 0 || h > MAX_SIDE || w > MAX_SIDE || h * w > max_out_pixels() {
                return Err(format!(
                    "{what} {h} x {w}: 1 to {MAX_SIDE} a side, at most {} pixels",
                    max_out_pixels()
                ));
            }
        }
    }
    if !(scale[0] > 0.0 && scale[0] <= scale[1]) {
        return Err(format!("scale {scale:?}: want 0 < lo <= hi"));
    }
    if !(ratio[0] > 0.0 && ratio[0] <= ratio[1]) {
        return Err(format!("ratio {ratio:?}: want 0 < lo <= hi"));
    }
    if *max_frames == 0 {
        return Err("max_frames 0".into());
    }
    Ok(())
}

/// The highest rate an audio op takes or gives.
pub(crate) const MAX_RATE: u32 = 768_000;

#[cfg(not(feature = "audio"))]
fn check_audio(_: &Op) -> Result<(), String> {
    Err("this build of chute has no audio ops (the cargo feature `audio` of chute-ops)".into())
}

#[cfg(feature = "audio")]
fn check_audio(op: &Op) -> Result<(), String> {
    let rate = |r: u32| {
        if r == 0 || r > MAX_RATE {
            Err(format!("sample_rate {r}: 1 to {MAX_RATE} Hz"))
        } else {
            Ok(())
        }
    };
    match op {
        Op::DecodeAudio {
            sample_rate,
            max_seconds,
            max_channels,
            ..
        } => {
            if let Some(r) = sample_rate {
                rate(*r)?;
            }
            if !(max_seconds.is_finite() && *max_seconds > 0.0) {
                return Err(format!("max_seconds {max_seconds}: a positive number"));
            }
            if *max_channels == 0 || *max_channels > 255 {
                return Err(format!("max_channels {max_channels}: 1 to 255"));
            }
        }
        Op::Resample { sample_rate } => rate(*sample_rate)?,
        Op::CropAudio {
            seconds, samples, ..
        } => match (seconds, samples) {
            (Some(s), None) if s.is_finite() && *s > 0.0 && *s <= 86_400.0 => {}
            (None, Some(n)) if *n > 0 && *n <= 1 << 32 => {}
            _ => {
                return Err(
                    "give the length as seconds (0 to 86,400) or samples (1 to 2^32), one of them"
                        .into(),
                );
            }
        },
        Op::LogMel { n_mels, n_samples } => {
            if *n_mels == 0 || *n_mels > 512 {
                return Err(format!("n_mels {n_mels}: 1 to 512 (Whisper: 80 or 128)"));
            }
            if let Some(n) = n_samples
                && (*n < WHISPER_HOP || *n > 1 << 30)
            {
                return Err(format!("n_samples {n}: {WHISPER_HOP} to 2^30"));
            }
        }
        Op::Fbank(o) => {
            // The sizes and the mel range depend on the audio's rate: checked per sample.
            o.check_static()?;
        }
        Op::SpecAugment { max_time_ratio, .. } if !(0.0..=1.0).contains(max_time_ratio) => {
            return Err(format!("max_time_ratio {max_time_ratio}: in [0, 1]"));
        }
        _ => {}
    }
    Ok(())
}

/// A `tokenize` op's tokenizer (loaded, or from the cache) and options, its `bos` and `eos`
/// tokens looked up in the vocabulary.
#[cfg(feature = "tokenizers")]
pub(crate) fn tokenizing(
    op: &Op,
) -> Result<(crate::text::TextTokenizer, crate::text::EncodeOptions), String> {
    let Op::Tokenize {
        tokenizer,
        add_special_tokens,
        bos,
        eos,
        max_length,
        ..
    } = op
    else {
        return Err("not a tokenize op".into());
    };
    let tok = crate::text::TextTokenizer::load(tokenizer)?;
    let id = |t: &Option<TokenRef>, what: &str| -> Result<Option<u32>, String> {
        match t {
            None => Ok(None),
            Some(TokenRef::Id(i)) => Ok(Some(*i)),
            Some(TokenRef::Token(s)) => tok.token_id(s).map(Some).ok_or_else(|| {
                format!("{what} {s:?} is not a token of {tokenizer}; give its id or another token")
            }),
        }
    };
    let options = crate::text::EncodeOptions {
        add_special_tokens: *add_special_tokens,
        bos: id(bos, "bos")?,
        eos: id(eos, "eos")?,
        max_length: *max_length,
    };
    Ok((tok, options))
}

#[cfg(not(feature = "tokenizers"))]
pub(crate) fn tokenizing(_: &Op) -> Result<(), String> {
    Err("this build of chute has no tokenizer (the cargo feature `tokenizers` of chute-ops)".into())
}

/// Fails a sample with a [`BadData`] naming the field and what was wrong with it.
impl Transform for SampleOps {
    fn apply(&self, sample: &mut Sample, rng: &mut SampleRng) -> Result<(), BoxError> {
        Ok(self.apply_fields(sample, rng, None)?)
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
        Ok(self.apply_fields(sample, rng, Some(out))?)
    }
}

impl SampleOps {
    /// Runs every field's ops; with `out`, fields that have a slot are written into it.
    fn apply_fields(
        &self,
        sample: &mut Sample,
        rng: &mut SampleRng,
        mut out: Option<&mut [&mut [u8]]>,
    ) -> Result<(), BadData> {
        for ((f, plan), chat) in self.fields.iter().zip(&self.plans).zip(&self.chats) {
            if f.names[0] == ANY {
                self.apply_to_the_rest(sample, f, plan, rng)?;
                continue;
            }
            let Some(name) = f.names.iter().find(|n| sample.get(n).is_some()) else {
                if f.optional {
                    continue;
                }
                let have = sample.fields.iter().map(|(n, _)| n.to_string()).collect();
                return Err(BadData::new(
                    f.names.join(";"),
                    OpError::MissingField { have },
                ));
            };
            let name = name.clone();
            if let Some(chat) = chat {
                chat.apply(sample, &name, f.output.as_deref())
                    .map_err(|e| BadData::new(name.as_str(), e))?;
                continue;
            }
            let field = sample.remove(&name).expect("present");
            let value = match field {
                Field::Bytes(b) | Field::Text(b) => Value::Bytes(b),
                Field::Array(a) => Value::Array(a),
                other => {
                    let holds = other.describe();
                    return Err(BadData::new(name, OpError::NotBytes { holds }));
                }
            };
            let context = |e: OpError| BadData::new(name.as_str(), e);
            if let [Op::Auto { pickle }] = &f.ops[..] {
                let value = step::auto(&name, value, *pickle).map_err(context)?;
                let output = f.output.clone().unwrap_or(name);
                sample.set(FieldName::Owned(output), step::into_field(value));
                continue;
            }
            if let Some(Op::Tokenize {
                prompt: Some(prompt),
                labels,
                ..
            }) = f.ops.first()
            {
                let (ids, labels_value) =
                    step::tokenize_pair(&plan.steps[0], sample, prompt, value).map_err(context)?;
                let value = step::run(&plan.steps[1..], ids, rng, None).map_err(context)?;
                let output = f.output.clone().unwrap_or(name);
                sample.set(FieldName::Owned(output), step::into_field(value));
                let labels = labels.clone().unwrap_or_else(|| "labels".to_string());
                sample.set(FieldName::Owned(labels), step::into_field(labels_value));
                continue;
            }
            if let (Some((at, steps)), Some(out)) = (&plan.into_slot, out.as_deref_mut()) {
                // The slot's column replaces a field of that name, as setting it would.
                sample.remove(&self.slots[*at].name);
                step::run(steps, value, rng, Some(&mut *out[*at])).map_err(context)?;
                continue;
            }
            let value = step::run(&plan.steps, value, rng, None).map_err(context)?;
            let output = f.output.clone().unwrap_or(name);
            if let Some((name, field)) = step::companion(&value, &output) {
                sample.set(FieldName::Owned(name), field);
            }
            sample.set(FieldName::Owned(output), step::into_field(value));
        }
        Ok(())
    }

    /// Runs `f`'s ops (the key `"*"`) on every field of `sample` that no other key names
    /// (`__`-prefixed fields aside), each in place.
    fn apply_to_the_rest(
        &self,
        sample: &mut Sample,
        f: &FieldOps,
        plan: &CompiledField,
        rng: &mut SampleRng,
    ) -> Result<(), BadData> {
        let named = |n: &str| {
            n.starts_with("__")
                || self
                    .fields
                    .iter()
                    .any(|g| g.names.iter().any(|m| m == n) || g.output.as_deref() == Some(n))
        };
        let rest: Vec<String> = sample
            .fields
            .iter()
            .map(|(n, _)| n.to_string())
            .filter(|n| !named(n))
            .collect();
        for name in rest {
            let field = sample.remove(&name).expect("present");
            let value = match field {
                Field::Bytes(b) | Field::Text(b) => Value::Bytes(b),
                Field::Array(a) => Value::Array(a),
                other => {
                    // Already decoded (a Python transform's value): left as it is.
                    sample.set(FieldName::Owned(name), other);
                    continue;
                }
            };
            let context = |e: OpError| BadData::new(name.as_str(), e);
            let value = match &f.ops[..] {
                [Op::Auto { pickle }] => step::auto(&name, value, *pickle).map_err(context)?,
                _ => step::run(&plan.steps, value, rng, None).map_err(context)?,
            };
            if let Some((companion, field)) = step::companion(&value, &name) {
                sample.set(FieldName::Owned(companion), field);
            }
            sample.set(FieldName::Owned(name), step::into_field(value));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::image;

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
        let p = SampleOps::from_json(IMAGENET).unwrap();
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

    /// Labels stored as numbers (Parquet, Arrow, TFRecord int columns) pass as int64.
    #[test]
    fn label_takes_integer_scalars_and_refuses_other_arrays() {
        let p = SampleOps::from_json(r#"{"cls": [{"op": "label"}]}"#).unwrap();
        let mut rng = SampleRng::for_sample(1, 0, 5);
        let int32 = chute_core::Array::new(
            DType::I32,
            vec![],
            Bytes::copy_from_slice(&9i32.to_le_bytes()),
        );
        let mut s = Sample::new(0).with("cls", Field::Array(int32));
        p.apply(&mut s, &mut rng).unwrap();
        let Some(Field::Array(label)) = s.get("cls") else {
            panic!("{s:?}")
        };
        assert_eq!(
            (label.dtype, &label.data[..]),
            (DType::I64, &9i64.to_le_bytes()[..])
        );
        let float = chute_core::Array::new(
            DType::F32,
            vec![],
            Bytes::copy_from_slice(&1f32.to_le_bytes()),
        );
        let mut s = Sample::new(0).with("cls", Field::Array(float));
        let e = p.apply(&mut s, &mut rng).unwrap_err().to_string();
        assert!(e.contains("a label is text digits or one integer"), "{e}");
    }

    /// A file's bytes held as a one-dimensional uint8 array (`numpy.frombuffer`) are encoded
    /// bytes, as `bytes` are; other arrays are refused saying what the op takes.
    #[test]
    fn decode_takes_bytes_held_as_a_uint8_array() {
        let p = SampleOps::from_json(IMAGENET).unwrap();
        let jpg = jpeg(60, 80);
        let pixels = |s: &Sample| match s.get("image") {
            Some(Field::Array(a)) => a.data.clone(),
            other => panic!("{other:?}"),
        };
        let as_bytes = {
            let mut s = sample(jpg.clone());
            p.apply(&mut s, &mut SampleRng::for_sample(1, 0, 5))
                .unwrap();
            pixels(&s)
        };
        let n = jpg.len();
        let array = chute_core::Array::new(DType::U8, vec![n], jpg.into());
        let mut s = Sample::new(5)
            .with("jpg", Field::Array(array))
            .with("cls", Field::Bytes(Bytes::from_static(b"7\n")));
        p.apply(&mut s, &mut SampleRng::for_sample(1, 0, 5))
            .unwrap();
        assert_eq!(pixels(&s), as_bytes, "the same pixels as from bytes");

        let decode = SampleOps::from_json(r#"{"jpg": [{"op": "decode"}]}"#).unwrap();
        let floats = chute_core::Array::new(DType::F32, vec![2, 2], vec![0u8; 16].into());
        let mut s = Sample::new(0).with("jpg", Field::Array(floats));
        let e = decode
            .apply(&mut s, &mut SampleRng::for_sample(1, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("takes encoded bytes") && e.contains("float32 array of shape [2, 2]"),
            "{e}"
        );
        assert!(!e.contains("a bug"), "{e}");
    }

    #[test]
    fn randomness_comes_from_the_sample_rng_only() {
        let p = SampleOps::from_json(IMAGENET).unwrap();
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
        let fused = SampleOps::from_json(
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
            let p = SampleOps::from_json(spec).unwrap();
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
                SampleOps::from_json(spec).unwrap().slots().is_empty(),
                "{spec}"
            );
        }
    }

    /// Decompression bombs: a small PNG whose header declares 60,000 x 60,000 pixels (10.8 GB
    /// of RGB), and a small JPEG whose frame header declares 65,500 x 65,500.
    fn bombs() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("png", crate::testing::png_bomb()),
            ("jpeg", crate::testing::jpeg_bomb(jpeg(16, 16))),
        ]
    }

    #[test]
    fn bombs_are_refused_by_their_header_naming_the_size_and_the_option() {
        for (name, data) in bombs() {
            assert!(image::image_size(&data).is_ok(), "{name}: the header reads");
            for spec in [
                r#"{"img": [{"op": "decode"}]}"#,
                r#"{"img": [{"op": "decode"}, {"op": "random_resized_crop", "size": 16}]}"#,
                r#"{"img": [{"op": "decode", "max_pixels": 1000}]}"#,
            ] {
                let p = SampleOps::from_json(spec).unwrap();
                let mut s = Sample::new(0).with("img", Field::Bytes(data.clone().into()));
                let e = p
                    .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("declares") && e.contains("max_pixels"),
                    "{name} {spec}: {e}"
                );
            }
        }
        // A real image under a lowered limit is refused the same way; under the default, read.
        let small = jpeg(40, 50);
        let p = SampleOps::from_json(r#"{"img": [{"op": "decode", "max_pixels": 1999}]}"#).unwrap();
        let mut s = Sample::new(0).with("img", Field::Bytes(small.clone().into()));
        let e = p
            .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err();
        assert!(e.to_string().contains("50 x 40 = 2000 pixels"), "{e}");
        let p = SampleOps::from_json(r#"{"img": [{"op": "decode"}]}"#).unwrap();
        let mut s = Sample::new(0).with("img", Field::Bytes(small.into()));
        p.apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap();
    }

    /// The bombs again in a child process whose address space is capped at 1.5 GB: an
    /// allocation made from the header alone would abort it instead of being refused.
    #[test]
    fn bombs_are_refused_under_a_memory_limit() {
        const INNER: &str = "CHUTE_BOMB_UNDER_LIMIT";
        if std::env::var_os(INNER).is_some() {
            bombs_are_refused_by_their_header_naming_the_size_and_the_option();
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(
                "ulimit -v 1500000 && exec \"$0\" --exact --test-threads 1 \
                 spec::tests::bombs_are_refused_under_a_memory_limit",
            )
            .arg(&exe)
            .env(INNER, "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "under a 1.5 GB limit: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("1 passed"), "the inner test ran: {stdout}");
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
            let p = SampleOps::from_json(spec).unwrap();
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
    fn output_sizes_are_bounded_before_anything_is_allocated() {
        // A spec's size (found by the op_specs fuzz target: an overflow, then 10^18 bytes).
        let e = SampleOps::from_json(
            r#"{"jpg": [{"op": "decode"}, {"op": "resize", "size": [48, 555555555555555552]}]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("at most 65535 a side"), "{e}");
        assert!(
            SampleOps::from_json(
                r#"{"jpg": [{"op": "decode"}, {"op": "center_crop", "size": 20000}]}"#
            )
            .is_err()
        );
        // A 1 x 60000 image whose shorter side is resized to 4096: 245 G pixels, refused.
        let (h, w) = (1u32, 60_000u32);
        let mut data = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut data, w, h);
            enc.set_color(png::ColorType::Grayscale);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().unwrap();
            writer
                .write_image_data(&vec![9u8; (h * w) as usize])
                .unwrap();
        }
        for spec in [
            r#"{"img": [{"op": "decode"}, {"op": "resize", "size": 4096}]}"#,
            r#"{"img": [{"op": "decode"}, {"op": "horizontal_flip"}, {"op": "resize", "size": 4096}]}"#,
        ] {
            let p = SampleOps::from_json(spec).unwrap();
            let mut s = Sample::new(0).with("img", Field::Bytes(data.clone().into()));
            let e = p
                .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
                .unwrap_err()
                .to_string();
            assert!(e.contains("give resize a max_size"), "{spec}: {e}");
        }
    }

    #[test]
    fn resize_center_crop_gray_and_cast() {
        let p = SampleOps::from_json(
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
        let e = SampleOps::from_json(r#"{"jpg": [{"op": "resize", "size": 3}]}"#).unwrap_err();
        assert!(
            e.to_string().contains("resize needs a decoded image"),
            "{e}"
        );
        let e = SampleOps::from_json(
            r#"{"jpg": [{"op": "decode"}, {"op": "normalize", "mean": [0.5], "std": [0.5]},
                        {"op": "horizontal_flip"}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("op 3"), "{e}");
        let e = SampleOps::from_json(r#"{"jpg": [{"op": "sharpen"}]}"#).unwrap_err();
        assert!(e.to_string().contains("sharpen"), "{e}");
        let e = SampleOps::from_json(r#"{"jpg": [{"op": "decode", "mdoe": "rgb"}]}"#).unwrap_err();
        assert!(e.to_string().contains("mdoe"), "{e}");
        let e = SampleOps::from_json(r#"{"jpg": [{"op": "horizontal_flip", "p": 2}]}"#);
        assert!(e.is_err());
        let e = SampleOps::from_json(r#"[1, 2]"#).unwrap_err();
        assert!(e.to_string().contains("JSON object"), "{e}");
    }

    #[test]
    fn bad_samples_say_what_is_wrong() {
        let p = SampleOps::from_json(IMAGENET).unwrap();
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
        let label = SampleOps::from_json(r#"{"cls": [{"op": "label"}]}"#).unwrap();
        let mut s = Sample::new(0).with("cls", Field::Bytes(Bytes::from_static(b"dog")));
        let e = label
            .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not an integer"), "{e}");
    }

    #[test]
    fn bad_data_names_the_field_and_the_kind() {
        let p = SampleOps::from_json(
            r#"{"img": [{"op": "decode"}], "cls": {"ops": [{"op": "label"}], "optional": true},
                "t": {"ops": [{"op": "text"}], "optional": true},
                "j": {"ops": [{"op": "json"}], "optional": true},
                "n": {"ops": [{"op": "npy"}], "optional": true}}"#,
        )
        .unwrap();
        let run = |field: &str, bytes: &[u8]| -> BadData {
            let mut s = Sample::new(0).with("img", Field::Bytes(jpeg(8, 8).into()));
            s.set(
                FieldName::Owned(field.into()),
                Field::Bytes(Bytes::copy_from_slice(bytes)),
            );
            let e = p
                .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
                .unwrap_err();
            *e.downcast::<BadData>().expect("a BadData")
        };
        let mut cut = jpeg(16, 16);
        cut.truncate(cut.len() - 10);
        let e = run("img", &cut);
        assert_eq!(e.field, "img");
        assert!(
            matches!(
                e.error,
                OpError::CorruptImage {
                    format: image::ImageFormat::Jpeg,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("field \"img\": corrupt or truncated JPEG")
        );
        assert!(matches!(
            run("img", b"GIF89a").error,
            OpError::NotAnImage { len: 6, .. }
        ));
        let e = run("cls", b"dog");
        assert_eq!(
            (e.field.as_str(), &e.error),
            (
                "cls",
                &OpError::BadLabel {
                    label: "dog".into()
                }
            )
        );
        assert!(matches!(run("t", b"\xff").error, OpError::NotUtf8 { .. }));
        assert!(matches!(run("j", b"{").error, OpError::BadJson { .. }));
        assert!(matches!(
            run("n", b"\x93NUMPY").error,
            OpError::BadNpy { .. }
        ));
        let mut s = Sample::new(0);
        let e = p
            .apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .downcast::<BadData>()
            .unwrap();
        assert_eq!(
            (e.field.as_str(), &e.error),
            ("img", &OpError::MissingField { have: vec![] })
        );
    }

    #[test]
    fn json_npy_and_text_fields() {
        let p = SampleOps::from_json(
            r#"{"a": [{"op": "json"}], "b": [{"op": "json"}], "n": [{"op": "npy"}],
                "t": [{"op": "text"}]}"#,
        )
        .unwrap();
        let npy = chute_core::npy::write_npy(DType::I16, &[2], &[1, 0, 2, 0]).unwrap();
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
        // An object (a WebDataset `.json` member's metadata) is a nested value, as
        // `json.loads` gives it; bad JSON is an error.
        let mut s = Sample::new(0)
            .with(
                "a",
                Field::Bytes(Bytes::from_static(br#"{"w": 3, "tags": ["x"]}"#)),
            )
            .with("b", Field::Bytes(Bytes::from_static(b"[1, \"two\"]")))
            .with("n", Field::Bytes(npy_bytes()))
            .with("t", Field::Bytes(Bytes::from_static(b"t")));
        p.apply(&mut s, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap();
        let Some(Field::Value(v)) = s.get("a") else {
            panic!("{:?}", s.get("a"))
        };
        assert_eq!(v.get("w"), Some(&chute_core::Value::Int(3)));
        assert!(
            matches!(s.get("b"), Some(Field::Value(chute_core::Value::List(l))) if l.len() == 2)
        );
        let mut bad = Sample::new(0)
            .with("a", Field::Bytes(Bytes::from_static(b"{oops")))
            .with("b", Field::Bytes(Bytes::from_static(b"1")))
            .with("n", Field::Bytes(npy_bytes()))
            .with("t", Field::Bytes(Bytes::from_static(b"t")));
        let e = p
            .apply(&mut bad, &mut SampleRng::for_sample(0, 0, 0))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not JSON"), "{e}");
    }

    fn npy_bytes() -> Bytes {
        chute_core::npy::write_npy(DType::I16, &[2], &[1, 0, 2, 0])
            .unwrap()
            .into()
    }
}
