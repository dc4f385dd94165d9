//! The engine thread: one [`Session`] whose sequences are the server's slots, stepped in a
//! loop. Every step decodes one token for each generating slot and a chunk of each new prompt
//! in one plan run (continuous batching); requests wait in a bounded queue when every slot is
//! busy, and a request whose client went away gives its slot back at the next step.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use tinynn_models::embed::Pooling;
use tinynn_models::generate::Finish;
use tinynn_models::sampling::{Penalties, Sampler, Strategy};
use tinynn_models::session::{BatchToken, Session};
use tinynn_models::stop::StopMatcher;
use tinynn_models::tokenizer::TextStream;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::metrics::Metrics;

/// Prompt tokens one step takes in all (new prompts are fed in chunks, so a long prompt does
/// not stall the slots that are streaming).
const STEP_PROMPT_TOKENS: usize = 256;

/// How one request generates.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Greedy or sampled.
    pub strategy: Strategy,
    /// Presence and frequency penalties.
    pub penalties: Penalties,
    /// Stop before any of these texts.
    pub stop: Vec<String>,
    /// Log-probabilities of each chosen token and of this many alternatives (`None`: off).
    pub logprobs: Option<usize>,
    /// Added to the logits of these tokens before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    /// Never sample an end-of-text token (llama-server's `ignore_eos`).
    pub ignore_eos: bool,
}

/// One token's log-probability and the most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens with theirs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What a request hears back, in order: text pieces, then exactly one `Done` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Generated text (possibly empty while a character or a stop string is incomplete).
    Piece {
        /// The sampled token (`None` for text flushed at the end).
        token: Option<u32>,
        /// Complete UTF-8 text.
        text: String,
        /// With `logprobs`: the token's log-probability.
        logprob: Option<TokenLogprob>,
    },
    /// The end, with why and the token counts.
    Done {
        /// Why generation ended.
        finish: Finish,
        /// Tokens of the prompt.
        prompt_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The request failed.
    Error(String),
}

/// A request for the engine.
pub struct Request {
    /// The prompt's tokens (not empty, shorter than a slot's context).
    pub prompt: Vec<u32>,
    /// How to generate.
    pub params: GenParams,
    /// Which choice of its HTTP request this is (events are tagged with it).
    pub index: usize,
    /// Where the events go; a closed channel cancels the request.
    pub events: UnboundedSender<(usize, Event)>,
    /// When the server received it (for time-to-first-token).
    pub received: Instant,
}

/// Embeddings of some token sequences (one plan run each, in a free slot).
pub struct EmbedRequest {
    /// The inputs (each non-empty and at most a slot's context).
    pub inputs: Vec<Vec<u32>>,
    /// How to pool each input's hidden states.
    pub pooling: Pooling,
    /// Where the vectors go (unit length, the model's width each); a closed channel cancels.
    pub reply: oneshot::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// What the engine is asked to do.
pub enum Work {
    /// Generate text.
    Generate(Request),
    /// Compute embeddings.
    Embed(EmbedRequest),
}

impl Work {
    fn cancelled(&self) -> bool {
        match self {
            Work::Generate(r) => r.events.is_closed(),
            Work::Embed(e) => e.reply.is_closed(),
        }
    }
}

/// Why the engine did not take a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// `queue` requests already wait.
    QueueFull,
    /// The engine thread is gone (it panicked).
    Stopped,
}

/// The server's side of the engine: submits requests.
#[derive(Clone)]
pub struct EngineHandle {
    /// Each message is one submission: all of a request's choices arrive together.
    tx: mpsc::Sender<Vec<Work>>,
    /// Requests submitted and not yet in a slot.
    waiting: Arc<AtomicUsize>,
    /// Most requests that may wait.
    queue: usize,
    /// Tokens a slot holds (prompt and generated).
    pub slot_ctx: usize,
}

impl EngineHandle {
    /// Hands `req` to the engine, or refuses it when `queue` requests already wait.
    pub fn submit(&self, req: Work) -> Result<(), Refused> {
        self.submit_all(vec![req])
    }

    /// Hands `reqs` (a request's choices) to the engine in one message, so that they reach its
    /// backlog together and are admitted in the same step when slots are free: the steps, and
    /// so the arithmetic, of a seeded request do not depend on when its choices arrived. All
    /// or none: refused when fewer than `reqs.len()` places are left in the queue.
    pub fn submit_all(&self, reqs: Vec<Work>) -> Result<(), Refused> {
        let (slots, n) = (self.queue, reqs.len());
        if self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                (w + n <= slots).then_some(w + n)
            })
            .is_err()
        {
            return Err(Refused::QueueFull);
        }
        self.tx.send(reqs).map_err(|_| {
            self.waiting.fetch_sub(n, Ordering::AcqRel);
            Refused::Stopped
        })
    }
}

/// A request that holds a slot.
struct Active {
    req: Request,
    /// Prompt tokens already in the cache.
    fed: usize,
    sampler: Sampler,
    stream: TextStream,
    matcher: StopMatcher,
    generated: Vec<u32>,
    /// Sampled and not yet evaluated.
    pending: Option<u32>,
    /// Tokens it may generate (its max_tokens within the slot's context).
    budget: usize,
    first_token: Option<Instant>,
    last_token: Instant,
}

/// Starts the engine thread on `session` (one slot per sequence, each `session.n_ctx() /
/// n_seq` tokens) with a queue of `queue` waiting requests.
pub fn start(session: Session, queue: usize, metrics: Arc<Metrics>) -> EngineHandle {
    let (tx, rx) = mpsc::channel();
    let waiting = Arc::new(AtomicUsize::new(0));
    let slot_ctx = session.n_ctx() / session.n_seq();
    let n_seq = session.n_seq();
    let end_tokens = session
        .model()
        .tokenizer()
        .map(|t| t.end_tokens())
        .unwrap_or_default();
    let engine = Engine {
        slots: (0..n_seq).map(|_| None).collect(),
        session,
        rx,
        waiting: waiting.clone(),
        metrics,
        backlog: VecDeque::new(),
        slot_ctx,
        logits: Vec::new(),
        end_tokens,
        batch: Vec::new(),
        fed: Vec::new(),
        last_used: vec![0; n_seq],
        clock: 0,
    };
    std::thread::Builder::new()
        .name("tinynn-engine".into())
        .spawn(move || engine.run())
        .expect("spawning the engine thread");
    EngineHandle {
        tx,
        waiting,
        queue,
        slot_ctx,
    }
}

struct Engine {
    session: Session,
    slots: Vec<Option<Active>>,
    rx: mpsc::Receiver<Vec<Work>>,
    waiting: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
    /// Received, waiting for a slot.
    backlog: VecDeque<Work>,
    slot_ctx: usize,
    /// A copy of an output row, for requests that bias the logits.
    logits: Vec<f32>,
    /// The model's end-of-text tokens (banned for `ignore_eos`).
    end_tokens: Vec<u32>,
    /// The step's batch and prompt tokens fed per slot, kept between steps.
    batch: Vec<BatchToken>,
    fed: Vec<usize>,
    /// Per slot: when it was last given a request ([`Engine::clock`] ticks).
    last_used: Vec<u64>,
    clock: u64,
}

impl Engine {
    /// Marks slot `s` as just used.
    fn touch(&mut self, s: usize) {
        self.clock += 1;
        self.last_used[s] = self.clock;
    }

    fn run(mut self) {
        loop {
            let idle = self.slots.iter().all(Option::is_none) && self.backlog.is_empty();
            if idle {
                // Nothing to do: sleep until a request comes (or the server is gone).
                match self.rx.recv() {
                    Ok(r) => self.backlog.extend(r),
                    Err(_) => return,
                }
            }
            while let Ok(r) = self.rx.try_recv() {
                self.backlog.extend(r);
            }
            self.drop_cancelled();
            self.admit();
            self.publish_gauges();
            if self.slots.iter().any(Option::is_some) {
                self.step();
            }
            self.publish_gauges();
        }
    }

    fn publish_gauges(&self) {
        let busy = self.slots.iter().filter(|s| s.is_some()).count();
        self.metrics.slots_busy.store(busy, Ordering::Relaxed);
        self.metrics
            .queue_depth
            .store(self.waiting.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Frees the slots (and drops the waiting requests) whose client went away.
    fn drop_cancelled(&mut self) {
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|a| a.req.events.is_closed()) {
                *slot = None;
                self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
        }
        let before = self.backlog.len();
        self.backlog.retain(|r| !r.cancelled());
        let gone = before - self.backlog.len();
        if gone > 0 {
            self.waiting.fetch_sub(gone, Ordering::AcqRel);
            self.metrics.cancelled.fetch_add(gone, Ordering::Relaxed);
        }
    }

    /// Puts waiting requests into free slots, each in the free slot whose cached tokens share
    /// the longest prefix with its prompt (that prefix is not evaluated again).
    fn admit(&mut self) {
        while let Some(work) = self.backlog.front() {
            let req = match work {
                Work::Generate(req) => req,
                Work::Embed(_) => {
                    if !self.embed() {
                        return;
                    }
                    continue;
                }
            };
            // Ties (no prefix in common, most often) take the slot used longest ago, so the
            // caches of recent prompts survive.
            let best = (0..self.slots.len())
                .filter(|&s| self.slots[s].is_none())
                .map(|s| (common_prefix(self.session.seq_tokens(s), &req.prompt), s))
                .max_by_key(|&(common, s)| (common, std::cmp::Reverse(self.last_used[s])));
            let Some((common, s)) = best else { return };
            self.touch(s);
            let Some(Work::Generate(req)) = self.backlog.pop_front() else {
                unreachable!("the front is a generation request");
            };
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            // Keep at least the prompt's last token to evaluate: its logits start generation.
            let keep = common.min(req.prompt.len() - 1);
            self.session.truncate_seq(s, keep);
            let mut sampler = Sampler::new(req.params.strategy, req.params.penalties);
            req.prompt.iter().for_each(|&t| sampler.accept(t));
            let budget = req
                .params
                .max_tokens
                .min(self.slot_ctx.saturating_sub(req.prompt.len()));
            self.metrics
                .prompt_tokens
                .fetch_add(req.prompt.len(), Ordering::Relaxed);
            self.metrics
                .prompt_tokens_cached
                .fetch_add(keep, Ordering::Relaxed);
            let matcher = StopMatcher::new(&req.params.stop);
            self.slots[s] = Some(Active {
                fed: keep,
                sampler,
                stream: self
                    .session
                    .model()
                    .tokenizer()
                    .map(|t| t.text_stream(&req.prompt))
                    .unwrap_or_default(),
                matcher,
                generated: Vec::new(),
                pending: None,
                budget,
                first_token: None,
                last_token: Instant::now(),
                req,
            });
            if budget == 0 {
                self.finish(s, Finish::Length);
            }
        }
    }

    /// Runs the embedding request at the front of the backlog in the free slot used longest
    /// ago (its cache is cleared; recent prompts' caches survive); false when no slot is free.
    fn embed(&mut self) -> bool {
        let Some(s) = (0..self.slots.len())
            .filter(|&s| self.slots[s].is_none())
            .min_by_key(|&s| self.last_used[s])
        else {
            return false;
        };
        let Some(Work::Embed(req)) = self.backlog.pop_front() else {
            unreachable!("the front is an embedding request");
        };
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let mut out = Vec::with_capacity(req.inputs.len());
        for input in &req.inputs {
            match self.session.embed(s, input, req.pooling) {
                Ok(v) => out.push(v),
                Err(e) => {
                    let _ = req.reply.send(Err(format!("embedding: {e}")));
                    return true;
                }
            }
            self.metrics
                .prompt_tokens
                .fetch_add(input.len(), Ordering::Relaxed);
        }
        let _ = req.reply.send(Ok(out));
        self.metrics.requests_done.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One plan run: a token for every generating slot, then prompt chunks; then sampling.
    fn step(&mut self) {
        // The step's inputs go through buffers kept from step to step.
        let mut batch = std::mem::take(&mut self.batch);
        let mut fed = std::mem::take(&mut self.fed);
        batch.clear();
        fed.clear();
        fed.resize(self.slots.len(), 0);
        for (s, slot) in self.slots.iter().enumerate() {
            if let Some(t) = slot.as_ref().and_then(|a| a.pending) {
                batch.push(BatchToken {
                    token: t,
                    seq: s,
                    logits: true,
                });
            }
        }
        let mut room = STEP_PROMPT_TOKENS;
        for (s, slot) in self.slots.iter().enumerate() {
            let Some(a) = slot else { continue };
            let left = a.req.prompt.len() - a.fed;
            if left == 0 || a.pending.is_some() || room == 0 {
                continue;
            }
            let n = left.min(room);
            room -= n;
            fed[s] = n;
            for (i, &t) in a.req.prompt[a.fed..a.fed + n].iter().enumerate() {
                batch.push(BatchToken {
                    token: t,
                    seq: s,
                    logits: a.fed + i + 1 == a.req.prompt.len(),
                });
            }
        }
        if !batch.is_empty() {
            match self.session.decode(&batch) {
                Err(e) => {
                    let msg = format!("evaluating the batch: {e}");
                    for s in 0..self.slots.len() {
                        if batch.iter().any(|t| t.seq == s) {
                            self.fail(s, &msg);
                        }
                    }
                }
                Ok(()) => {
                    for (s, n) in fed.iter().enumerate() {
                        if let Some(a) = self.slots[s].as_mut() {
                            a.fed += n;
                        }
                    }
                    // Output rows come in the order of the batch's tokens that asked for one.
                    let outputs = batch.iter().filter(|t| t.logits).map(|t| t.seq);
                    for (row, s) in outputs.enumerate() {
                        self.sample(s, row);
                    }
                }
            }
        }
        self.batch = batch;
        self.fed = fed;
    }

    /// Samples slot `s`'s next token from output row `row` and sends its text.
    fn sample(&mut self, s: usize, row: usize) {
        let model = self.session.model().clone();
        let tok = match model.tokenizer() {
            Ok(t) => t,
            Err(e) => return self.fail(s, &e.to_string()),
        };
        let Some(a) = self.slots[s].as_mut() else {
            return;
        };
        a.pending = None;
        let p = &a.req.params;
        // The logits are read in place; a request that biases them gets a copy.
        let logits: &[f32] = if p.logit_bias.is_empty() && !p.ignore_eos {
            self.session.output(row)
        } else {
            self.logits.clear();
            self.logits.extend_from_slice(self.session.output(row));
            for &(t, b) in &p.logit_bias {
                if let Some(l) = self.logits.get_mut(t as usize) {
                    *l += b;
                }
            }
            if p.ignore_eos {
                for &t in &self.end_tokens {
                    if let Some(l) = self.logits.get_mut(t as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            &self.logits
        };
        let next = a.sampler.sample(logits);
        let logprob = p.logprobs.map(|k| token_logprob(logits, next, k));
        let now = Instant::now();
        if a.first_token.is_none() {
            a.first_token = Some(now);
            self.metrics
                .ttft
                .observe(now.duration_since(a.req.received).as_secs_f64());
        } else {
            self.metrics
                .token_latency
                .observe(now.duration_since(a.last_token).as_secs_f64());
        }
        a.last_token = now;
        if tok.is_end(next) {
            return self.finish(s, Finish::EndToken);
        }
        a.sampler.accept(next);
        a.generated.push(next);
        self.metrics
            .completion_tokens
            .fetch_add(1, Ordering::Relaxed);
        let piece = match a.stream.step(tok, next) {
            Ok(p) => p,
            Err(e) => return self.fail(s, &e.to_string()),
        };
        let (text, stopped) = a.matcher.push(&piece);
        let _ = a.req.events.send((
            a.req.index,
            Event::Piece {
                token: Some(next),
                text,
                logprob,
            },
        ));
        if stopped {
            self.done(s, Finish::Stop);
        } else if a.generated.len() >= a.budget {
            self.finish(s, Finish::Length);
        } else {
            a.pending = Some(next);
        }
    }

    /// Ends slot `s` with `why`, flushing the text held back.
    fn finish(&mut self, s: usize, why: Finish) {
        let model = self.session.model().clone();
        let Some(a) = self.slots[s].as_mut() else {
            return;
        };
        let held = match model.tokenizer() {
            Ok(tok) => a.stream.finish(tok).unwrap_or_default(),
            Err(_) => String::new(),
        };
        let (mut text, stopped) = a.matcher.push(&held);
        if !stopped {
            text.push_str(&a.matcher.finish());
        }
        if !text.is_empty() {
            let _ = a.req.events.send((
                a.req.index,
                Event::Piece {
                    token: None,
                    text,
                    logprob: None,
                },
            ));
        }
        self.done(s, if stopped { Finish::Stop } else { why });
    }

    fn done(&mut self, s: usize, finish: Finish) {
        if let Some(a) = self.slots[s].take() {
            let _ = a.req.events.send((
                a.req.index,
                Event::Done {
                    finish,
                    prompt_tokens: a.req.prompt.len(),
                    completion_tokens: a.generated.len(),
                },
            ));
            self.metrics.requests_done.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn fail(&mut self, s: usize, msg: &str) {
        if let Some(a) = self.slots[s].take() {
            let _ = a
                .req
                .events
                .send((a.req.index, Event::Error(msg.to_owned())));
            self.metrics.requests_failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Tokens `a` and `b` share at their start.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `next`'s log-probability under `logits` and the `k` most likely tokens with theirs.
pub fn token_logprob(logits: &[f32], next: u32, k: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |t: u32| (f64::from(logits[t as usize]) - log_z) as f32;
    let mut top: Vec<u32> = Vec::new();
    if k > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let k = k.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| {
            logits[b as usize].total_cmp(&logits[a as usize])
        });
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        top = idx;
    }
    TokenLogprob {
        token: next,
        logprob: lp(next),
        top: top.into_iter().map(|t| (t, lp(t))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_a_normalized_log_softmax_with_the_best_first() {
        let logits = [1.0f32, 3.0, -2.0, 0.5];
        let lp = token_logprob(&logits, 3, 2);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(lp.logprob) - (0.5f64.exp() / z).ln()).abs() < 1e-6);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 0]);
        let total: f64 = (0..4)
            .map(|t| f64::from(token_logprob(&logits, t, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn common_prefix_counts_the_shared_start() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[7, 8], &[7, 8]), 2);
    }
}
