//! Opening what `-m` names: a GGUF file, or a Hugging Face directory (config.json,
//! *.safetensors, tokenizer.json, and the chat template in tokenizer_config.json or
//! chat_template.jinja).

use std::path::Path;

use anyhow::{bail, Context, Result};
use tinynn_format::gguf::{GgufFile, Key};
use tinynn_format::hf_config::TokenIds;
use tinynn_format::model_dir::HfModelDir;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;
use tinynn_models::weights::WeightSource;

// One value per process: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Model {
    Gguf(GgufFile),
    Hf(HfModelDir),
}

fn first(ids: &Option<TokenIds>) -> Option<u32> {
    match ids {
        Some(TokenIds::One(i)) => u32::try_from(*i).ok(),
        Some(TokenIds::Many(v)) => v.first().and_then(|&i| u32::try_from(i).ok()),
        None => None,
    }
}

impl Model {
    pub fn open(path: &Path) -> Result<Model> {
        if path.is_dir() {
            return Ok(Model::Hf(HfModelDir::open(path)?));
        }
        Ok(Model::Gguf(GgufFile::open(path)?))
    }

    pub fn source(&self) -> WeightSource<'_> {
        match self {
            Model::Gguf(f) => WeightSource::Gguf(f),
            Model::Hf(d) => WeightSource::Hf(d),
        }
    }

    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match self {
            Model::Gguf(f) => Ok(Tokenizer::from_gguf(f.gguf())
                .with_context(|| format!("{}: tokenizer", f.path().display()))?),
            Model::Hf(d) => {
                let Some(path) = &d.tokenizer_json else {
                    bail!("{}: no tokenizer.json", d.dir.display());
                };
                Ok(Tokenizer::from_hf_file(
                    path,
                    first(&d.config.bos_token_id),
                    first(&d.config.eos_token_id),
                )?)
            }
        }
    }

    pub fn vocab(&self, tokenizer: &Tokenizer) -> Result<Vocab> {
        match self {
            Model::Gguf(f) => Ok(Vocab::from_gguf(f.gguf())?),
            Model::Hf(_) => Ok(Vocab::from_strings(tokenizer.token_strings())),
        }
    }

    /// The model's own chat template, if it ships one.
    pub fn chat_template(&self) -> Result<Option<String>> {
        match self {
            Model::Gguf(f) => Ok(f
                .gguf()
                .get_str(Key::TokenizerChatTemplate)?
                .map(str::to_string)),
            Model::Hf(d) => {
                let jinja = d.dir.join("chat_template.jinja");
                if jinja.is_file() {
                    return Ok(Some(std::fs::read_to_string(&jinja)?));
                }
                let config = d.dir.join("tokenizer_config.json");
                if !config.is_file() {
                    return Ok(None);
                }
                let json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&config)?)
                        .with_context(|| format!("{}", config.display()))?;
                Ok(json
                    .get("chat_template")
                    .and_then(|t| t.as_str())
                    .map(str::to_string))
            }
        }
    }
}
