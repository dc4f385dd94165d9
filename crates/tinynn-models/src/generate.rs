//! Text generation on a [`Session`]: a prompt is evaluated (reusing whatever prefix sequence 0
//! already holds), then tokens are sampled one by one and come out as [`Piece`]s of text that
//! never split a UTF-8 character and never show a stop string, even one spread over several
//! tokens. [`Generation`] is an iterator, so a caller streams, collects or stops at will.

#![warn(missing_docs)]

use crate::chat::{ChatTemplate, Message};
use crate::sampling::{Penalties, Sampler, Strategy};
use tinynn_core::backend::Backend;
use tinynn_cpu::Executor;

use crate::session::Session;
use crate::stop::StopMatcher;
use crate::tokenizer::TextStream;
use crate::Result;

/// What to generate and how to sample it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Greedy or seeded sampling.
    pub strategy: Strategy,
    /// Repetition, presence and frequency penalties.
    pub penalties: Penalties,
    /// Stop before any of these texts (matched across tokens; not output).
    pub stop: Vec<String>,
    /// Keep going past the model's end-of-text tokens.
    pub ignore_eos: bool,
}

impl Default for GenerateOptions {
    /// 128 tokens, greedy, no penalties, no stop strings.
    fn default() -> GenerateOptions {
        GenerateOptions {
            max_tokens: 128,
            strategy: Strategy::Greedy,
            penalties: Penalties::default(),
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

impl GenerateOptions {
    /// A sampler for these options.
    pub fn sampler(&self) -> Sampler {
        Sampler::new(self.strategy, self.penalties)
    }
}

/// A piece of generated text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The token sampled for this piece (`None` for the text flushed at the end).
    pub token: Option<u32>,
    /// Complete UTF-8 text (possibly empty while a character or a possible stop string is
    /// incomplete).
    pub text: String,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_tokens` reached, or the context is full.
    Length,
    /// The model produced an end-of-text token.
    EndToken,
    /// A stop string appeared.
    Stop,
}

enum SamplerSlot<'s> {
    Owned(Sampler),
    Borrowed(&'s mut Sampler),
}

impl SamplerSlot<'_> {
    fn get(&mut self) -> &mut Sampler {
        match self {
            SamplerSlot::Owned(s) => s,
            SamplerSlot::Borrowed(s) => s,
        }
    }
}

/// A running generation: an iterator of pieces (see the module docs).
pub struct Generation<'s, B: Backend = Executor> {
    session: &'s mut Session<B>,
    sampler: SamplerSlot<'s>,
    stream: TextStream,
    matcher: StopMatcher,
    ignore_eos: bool,
    /// Tokens this generation may still produce.
    budget: usize,
    /// Sampled, not yet evaluated.
    pending: Option<u32>,
    tokens: Vec<u32>,
    finish: Option<Finish>,
    done: bool,
}

impl<B: Backend> Session<B> {
    /// Evaluates `prompt` on sequence 0 (keeping the prefix the sequence already holds) and
    /// returns the generation that follows it.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> Result<Generation<'_, B>> {
        let sampler = SamplerSlot::Owned(opts.sampler());
        self.start(prompt, opts, sampler)
    }

    /// [`Session::generate`] with the caller's sampler (its penalty history and random state
    /// carry over between calls, as in a conversation).
    pub fn generate_with<'s>(
        &'s mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        sampler: &'s mut Sampler,
    ) -> Result<Generation<'s, B>> {
        self.start(prompt, opts, SamplerSlot::Borrowed(sampler))
    }

    /// Tokenizes `text` (with the model's BOS and special tokens) and generates after it.
    pub fn generate_text(
        &mut self,
        text: &str,
        opts: &GenerateOptions,
    ) -> Result<Generation<'_, B>> {
        let prompt = self.model().tokenizer()?.encode(text, true)?;
        self.generate(&prompt, opts)
    }

    /// Renders `messages` with `template` (ending with the assistant's opener), and generates
    /// the reply; a conversation that grows turn by turn re-evaluates only its new tokens.
    pub fn chat(
        &mut self,
        template: &ChatTemplate,
        messages: &[Message],
        opts: &GenerateOptions,
    ) -> Result<Generation<'_, B>> {
        let text = template.render(messages, true)?;
        self.generate_text(&text, opts)
    }

    fn start<'s>(
        &'s mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut sampler: SamplerSlot<'s>,
    ) -> Result<Generation<'s, B>> {
        if prompt.is_empty() {
            return Err(crate::ModelError::Invalid("the prompt is empty".into()));
        }
        if prompt.len() >= self.n_ctx() {
            return Err(crate::ModelError::Invalid(format!(
                "the prompt is {} tokens, which does not fit the context of {}",
                prompt.len(),
                self.n_ctx()
            )));
        }
        let common = self
            .seq_tokens(0)
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        self.truncate(common);
        prompt.iter().for_each(|&t| sampler.get().accept(t));
        self.eval_batch(&prompt[common..])?;
        let budget = opts.max_tokens.min(self.n_free());
        let stream = self.model().tokenizer()?.text_stream(prompt);
        Ok(Generation {
            session: self,
            sampler,
            stream,
            matcher: StopMatcher::new(&opts.stop),
            ignore_eos: opts.ignore_eos,
            budget,
            pending: None,
            tokens: Vec::new(),
            finish: None,
            done: false,
        })
    }
}

impl<B: Backend> Generation<'_, B> {
    /// Why generation ended (`None` while it runs).
    pub fn finish_reason(&self) -> Option<Finish> {
        self.finish
    }

    /// The tokens generated so far (an end token is not included).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Runs to the end and returns the whole text.
    pub fn text(&mut self) -> Result<String> {
        let mut out = String::new();
        for piece in self.by_ref() {
            out.push_str(&piece?.text);
        }
        Ok(out)
    }

    fn step(&mut self) -> Result<Option<Piece>> {
        if let Some(t) = self.pending.take() {
            self.session.eval(t)?;
        }
        if self.tokens.len() >= self.budget {
            return Ok(self.end(Finish::Length));
        }
        let next = self.sampler.get().sample(self.session.logits());
        let tok = self.session.model().tokenizer()?;
        if tok.is_end(next) && !self.ignore_eos {
            return Ok(self.end(Finish::EndToken));
        }
        self.sampler.get().accept(next);
        self.tokens.push(next);
        let piece = self.stream.step(tok, next)?;
        let (text, stopped) = self.matcher.push(&piece);
        if stopped {
            self.finish = Some(Finish::Stop);
            self.done = true;
        } else if self.tokens.len() < self.budget {
            // Evaluated when the next piece is asked for (the last one never is).
            self.pending = Some(next);
        }
        Ok(Some(Piece {
            token: Some(next),
            text,
        }))
    }

    /// Ends with `why`, flushing held-back text.
    fn end(&mut self, why: Finish) -> Option<Piece> {
        self.done = true;
        self.finish = Some(why);
        let held = match self.session.model().tokenizer() {
            Ok(tok) => self.stream.finish(tok).unwrap_or_default(),
            Err(_) => String::new(),
        };
        let (mut text, stopped) = self.matcher.push(&held);
        if stopped {
            self.finish = Some(Finish::Stop);
        } else {
            text.push_str(&self.matcher.finish());
        }
        (!text.is_empty()).then_some(Piece { token: None, text })
    }
}

impl<B: Backend> Iterator for Generation<'_, B> {
    type Item = Result<Piece>;

    fn next(&mut self) -> Option<Result<Piece>> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(p) => p.map(Ok),
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
