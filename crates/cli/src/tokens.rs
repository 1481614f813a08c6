//! `chute tokens`: bring your own tokenized data.

use std::path::PathBuf;

use anyhow::{Context, bail};
use chute::core::DType;
use chute::dataset::{parse_token_text, token_ids_from_npy};
use chute::formats::TokenWriter;
use clap::Args;

/// `chute tokens` arguments.
#[derive(Debug, Clone, Args)]
pub(crate) struct TokensArgs {
    /// A text file of whitespace-separated integer ids, or a `.npy` array of integers.
    input: PathBuf,
    /// The token file to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Stored token type: uint16, uint32, or auto (uint16 when every id is below 65536).
    #[arg(long, default_value = "auto")]
    dtype: String,
}

pub(crate) fn run(args: TokensArgs) -> anyhow::Result<()> {
    let origin = args.input.display().to_string();
    let bytes = std::fs::read(&args.input).with_context(|| format!("reading {origin}"))?;
    let ids = if args.input.extension().is_some_and(|e| e == "npy") {
        token_ids_from_npy(&bytes, &origin)?
    } else {
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            anyhow::anyhow!(
                "{origin} at byte {}: not UTF-8 text; pass whitespace-separated ids or a .npy \
                 file",
                e.valid_up_to()
            )
        })?;
        parse_token_text(text, &origin)?
    };
    let max = ids.iter().copied().max().unwrap_or(0);
    let dtype = match args.dtype.as_str() {
        "auto" if max <= u32::from(u16::MAX) => DType::U16,
        "auto" => DType::U32,
        other => match other.parse::<DType>()? {
            d @ (DType::U16 | DType::U32) => d,
            d => bail!("--dtype {d}: token files store uint16 or uint32"),
        },
    };
    let mut w = TokenWriter::create(&args.output, dtype)
        .with_context(|| format!("creating {}", args.output.display()))?;
    w.write_tokens(&ids)?;
    let n = w.finish()?;
    println!(
        "wrote {n} {dtype} tokens (max id {max}) to {}; read it with `chute bench {} \
         --token-dtype {dtype} --seq-len N`",
        args.output.display(),
        args.output.display()
    );
    Ok(())
}
