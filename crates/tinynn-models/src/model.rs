//! An opened model, owned and shareable: the memory-mapped file(s) (a GGUF file or a Hugging
//! Face directory), its typed config, tokenizer, vocabulary, chat template, and the packed copies
//! of its matrix weights that every session of the model shares. Sessions hold it through an
//! `Arc`, so a server, a C caller or Python can keep a model and many sessions without lifetimes.

#![warn(missing_docs)]

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tinynn_core::backend::{Backend, WeightStore};
use tinynn_format::gguf::{GgufFile, Key};
use tinynn_format::hf_config::TokenIds;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::HfModelDir;
use tinynn_format::GgmlType;

use crate::chat::ChatTemplate;
use crate::tokenizer::Tokenizer;
use crate::vocab::Vocab;
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// The files a model was opened from.
// One value per model: the variants' size difference does not matter.
#[allow(clippy::large_enum_variant)]
enum Files {
    Gguf(GgufFile),
    Hf(HfModelDir),
}

/// A backend's packed copy of a weight (type-erased) and its bytes.
type Packed = (Arc<dyn Any + Send + Sync>, usize);

/// A model ready to be run by any number of sessions (see [`crate::session::Session`]).
pub struct Model {
    files: Files,
    path: PathBuf,
    config: ModelConfig,
    /// The tokenizer and vocabulary, or why the model has none usable.
    text: std::result::Result<(Tokenizer, Vocab), String>,
    chat_template: Option<String>,
    /// Packed copies of matrix weights by backend and GGUF name (`None`: not packable; with
    /// their bytes), made on first use.
    packs: Mutex<HashMap<(&'static str, String), Option<Packed>>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("architecture", &self.config.architecture.name())
            .finish()
    }
}

pub(crate) fn first(ids: &Option<TokenIds>) -> Option<u32> {
    match ids {
        Some(TokenIds::One(i)) => u32::try_from(*i).ok(),
        Some(TokenIds::Many(v)) => v.first().and_then(|&i| u32::try_from(i).ok()),
        None => None,
    }
}

impl Model {
    /// Opens a GGUF file or a Hugging Face model directory (`config.json`, `*.safetensors`,
    /// optionally `tokenizer.json` and a chat template in `chat_template.jinja` or
    /// `tokenizer_config.json`). Weights stay in the memory map.
    pub fn open(path: impl AsRef<Path>) -> Result<Arc<Model>> {
        let path = path.as_ref();
        if path.is_dir() {
            Model::from_hf(HfModelDir::open(path)?)
        } else {
            Model::from_gguf(GgufFile::open(path)?)
        }
    }

    /// A model over an opened GGUF file.
    pub fn from_gguf(file: GgufFile) -> Result<Arc<Model>> {
        let config = ModelConfig::from_gguf(file.gguf())?;
        let text = Tokenizer::from_gguf(file.gguf())
            .and_then(|t| Ok((t, Vocab::from_gguf(file.gguf())?)))
            .map_err(|e| format!("{}: tokenizer: {e}", file.path().display()));
        let chat_template = file
            .gguf()
            .get_str(Key::TokenizerChatTemplate)
            .ok()
            .flatten()
            .map(str::to_string);
        Ok(Arc::new(
            Model {
                path: file.path().to_path_buf(),
                files: Files::Gguf(file),
                config,
                text,
                chat_template,
                packs: Mutex::default(),
            }
            .vocab_checked(),
        ))
    }

    /// A model over an opened Hugging Face directory.
    pub fn from_hf(dir: HfModelDir) -> Result<Arc<Model>> {
        let config = ModelConfig::from_hf(&dir.config)?;
        let model_type = dir.config.model_type.as_deref().unwrap_or("");
        if let Some(plan) = crate::arch::by_hf_model_type(model_type).and_then(|a| a.hf_rearranged)
        {
            dir.rearrange(|n| plan(n, &config))?;
        }
        let text = match &dir.tokenizer_json {
            None => Err(format!("{}: no tokenizer.json", dir.dir.display())),
            Some(p) => Tokenizer::from_hf_file(
                p,
                first(&dir.config.bos_token_id),
                first(&dir.config.eos_token_id),
            )
            .map(|t| {
                let v = Vocab::from_strings(t.token_strings(), t.vocab_kind());
                (t, v)
            })
            .map_err(|e| format!("{}: {e}", p.display())),
        };
        let chat_template = hf_chat_template(&dir.dir)?;
        Ok(Arc::new(
            Model {
                path: dir.dir.clone(),
                files: Files::Hf(dir),
                config,
                text,
                chat_template,
                packs: Mutex::default(),
            }
            .vocab_checked(),
        ))
    }

    /// The model with its tokenizer refused when the vocabulary holds more tokens than the
    /// token embedding has rows (a token id past the last row has no embedding). More rows
    /// than tokens is legitimate (Hugging Face checkpoints pad the embedding).
    fn vocab_checked(mut self) -> Model {
        let rows = self
            .source()
            .get("token_embd.weight")
            .ok()
            .flatten()
            .and_then(|w| w.dims.get(1).copied());
        if let (Ok((_, vocab)), Some(rows)) = (&self.text, rows) {
            let n = vocab.len() as u64;
            if n > rows {
                self.text = Err(format!(
                    "{}: the vocabulary has {n} tokens but token_embd.weight has {rows} rows \
                     (tokens {rows}..{n} would have no embedding)",
                    self.path.display()
                ));
            }
        }
        self
    }

    /// The file or directory the model was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model's typed hyperparameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Where graphs read the weights from (borrowed from this model).
    pub fn source(&self) -> WeightSource<'_> {
        match &self.files {
            Files::Gguf(f) => WeightSource::Gguf(f),
            Files::Hf(d) => WeightSource::Hf(d),
        }
    }

    /// The GGUF file, when the model is one.
    pub fn gguf(&self) -> Option<&GgufFile> {
        match &self.files {
            Files::Gguf(f) => Some(f),
            Files::Hf(_) => None,
        }
    }

    /// The tokenizer (an error says why the model has none).
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.text
            .as_ref()
            .map(|(t, _)| t)
            .map_err(|e| ModelError::Invalid(e.clone()))
    }

    /// The vocabulary (token id → bytes).
    pub fn vocab(&self) -> Result<&Vocab> {
        self.text
            .as_ref()
            .map(|(_, v)| v)
            .map_err(|e| ModelError::Invalid(e.clone()))
    }

    /// The chat template the model ships, if any (its source).
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// A chat template from `source` (e.g. a user's file), or the model's own when `None`.
    pub fn chat_template(&self, source: Option<String>) -> Result<ChatTemplate> {
        let vocab = self.vocab()?;
        let tok = self.tokenizer()?;
        let text = |id: Option<u32>| {
            id.map(|i| String::from_utf8_lossy(&vocab.token_bytes(i)).into_owned())
                .unwrap_or_default()
        };
        let (bos, eos) = (text(tok.bos()), text(tok.eos()));
        match source.or_else(|| self.chat_template.clone()) {
            Some(s) => Ok(ChatTemplate::new(s, &bos, &eos)),
            None => Err(ModelError::Invalid(format!(
                "{} has no chat template; give one (a Jinja file)",
                self.path.display()
            ))),
        }
    }

    /// Where `data` (a weight's bytes from [`Model::source`]) lies: its region (file) and range.
    pub fn locate(&self, data: &[u8]) -> Option<(usize, Range<usize>)> {
        let (p, n) = (data.as_ptr() as usize, data.len());
        (0..)
            .map_while(|i| {
                let r = self.region_bytes(i)?;
                Some((i, r.as_ptr() as usize, r.len()))
            })
            .find(|&(_, base, len)| p >= base && p + n <= base + len)
            .map(|(i, base, _)| (i, p - base..p - base + n))
    }

    fn region_bytes(&self, i: usize) -> Option<&[u8]> {
        match &self.files {
            Files::Gguf(f) => (i == 0).then(|| f.bytes()),
            // The shards, the F32 copies of the small half-precision tensors, then the
            // rearranged copies (matrices stored [in, out], ...), then the stacked experts.
            Files::Hf(d) => d
                .shards
                .get(i)
                .map(|s| s.bytes())
                .or_else(|| (i == d.shards.len()).then(|| d.upcast_bytes()))
                .or_else(|| (i == d.shards.len() + 1).then(|| d.transposed_bytes()))
                .or_else(|| (i == d.shards.len() + 2).then(|| d.stacked_bytes())),
        }
    }

    /// `backend`'s packed copy of matrix weight `name` (made once, shared by every session
    /// on that backend; `None` when its type has no packed layout). After packing, the file's
    /// pages of the weight are released (reads fault them back in).
    pub(crate) fn packed<B: Backend>(
        &self,
        backend: &B,
        name: &str,
        dtype: GgmlType,
        ne: [usize; 4],
        data: &[u8],
    ) -> Option<Arc<B::Packed>> {
        let mut packs = self.packs.lock().unwrap_or_else(|e| e.into_inner());
        let (p, _) = packs
            .entry((backend.name(), name.to_string()))
            .or_insert_with(|| {
                let p = backend.pack(dtype, ne, data)?;
                self.source().release(data);
                let bytes = B::packed_bytes(&p);
                Some((Arc::new(p) as Arc<dyn Any + Send + Sync>, bytes))
            })
            .clone()?;
        p.downcast::<B::Packed>().ok()
    }

    /// Bytes of the packed weight copies made so far (all backends).
    pub fn packed_bytes(&self) -> usize {
        let packs = self.packs.lock().unwrap_or_else(|e| e.into_inner());
        packs.values().flatten().map(|(_, b)| b).sum()
    }
}

impl WeightStore for Model {
    fn region(&self, i: usize) -> &[u8] {
        self.region_bytes(i).unwrap_or_default()
    }
}

/// The chat template of an HF directory: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` string.
fn hf_chat_template(dir: &Path) -> Result<Option<String>> {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| ModelError::Invalid(format!("reading {}: {e}", p.display())))
    };
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return Ok(Some(read(&jinja)?));
    }
    let config = dir.join("tokenizer_config.json");
    if !config.is_file() {
        return Ok(None);
    }
    let json: serde_json::Value = serde_json::from_str(&read(&config)?)
        .map_err(|e| ModelError::Invalid(format!("{}: {e}", config.display())))?;
    Ok(json
        .get("chat_template")
        .and_then(|t| t.as_str())
        .map(str::to_string))
}
