//! The human-readable form of an inspect [`Report`] (what `tnn inspect` prints).

use std::fmt::Write;

use crate::inspect::Report;

/// Byte counts in the largest unit that keeps them ≥ 1: 512 B, 2.3 KiB, 92.1 MiB, 4.07 GiB.
fn mib(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    match bytes {
        n if n < 1 << 10 => format!("{n} B"),
        n if n < 1 << 20 => format!("{:.1} KiB", b / KIB),
        n if n < 1 << 30 => format!("{:.1} MiB", b / (KIB * KIB)),
        _ => format!("{:.2} GiB", b / (KIB * KIB * KIB)),
    }
}

/// Parameter counts as people quote them: 134.5 M, 7.24 B.
pub fn params(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_string(), T::to_string)
}

/// The report as text: a summary, the config, the metadata, totals by type and the tensor
/// table (when the report holds it).
pub fn render(r: &Report) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut s, r);
    s
}

fn write_report(s: &mut String, r: &Report) -> std::fmt::Result {
    let format = match r.gguf_version {
        Some(v) => format!("GGUF v{v}"),
        None => r.format.to_string(),
    };
    writeln!(s, "file:          {} ({})", r.path, mib(r.file_bytes))?;
    writeln!(s, "format:        {format}")?;
    writeln!(s, "architecture:  {}", opt(&r.architecture))?;
    if r.architecture.is_some() {
        let support = if r.support.is_empty() {
            format!("none (tinynn runs {})", crate::arch::names(|_| true))
        } else {
            r.support.join(", ")
        };
        writeln!(s, "support:       {support}")?;
    }
    writeln!(s, "name:          {}", opt(&r.name))?;
    writeln!(s, "file type:     {}", opt(&r.file_type))?;
    writeln!(s, "parameters:    {} ({})", params(r.n_params), r.n_params)?;
    writeln!(
        s,
        "tensors:       {} ({} of data)",
        r.n_tensors,
        mib(r.tensor_bytes)
    )?;
    if let Some(split) = &r.split {
        writeln!(s, "split:         {split}")?;
    }
    if let Some(t) = &r.tokenizer_json {
        writeln!(s, "tokenizer:     {t}")?;
    }
    if let Some(c) = &r.config {
        writeln!(s, "\nhyperparameters:")?;
        let mut rows: Vec<(&str, String)> = vec![
            ("context length", opt(&c.n_ctx_train)),
            ("embedding", c.n_embd.to_string()),
            ("blocks", c.n_layer.to_string()),
        ];
        match &c.ssm {
            // A state-space model: no attention, feed-forward or RoPE to show.
            Some(x) => rows.extend([
                (
                    "ssm",
                    "selective scan, no attention (a state per sequence)".into(),
                ),
                ("ssm inner", x.inner_size.to_string()),
                ("ssm state", x.state_size.to_string()),
                ("ssm conv", x.conv_kernel.to_string()),
                ("ssm dt rank", x.time_step_rank.to_string()),
            ]),
            None => rows.extend([
                ("heads", c.n_head.to_string()),
                ("KV heads", c.n_head_kv.to_string()),
                ("head dim", c.head_dim.to_string()),
                ("feed forward", opt(&c.n_ff)),
            ]),
        }
        rows.extend([("vocab", opt(&c.n_vocab)), ("norm eps", opt(&c.norm_eps))]);
        if c.ssm.is_none() {
            rows.extend([
                ("rope dims", opt(&c.rope_dims)),
                ("rope base", opt(&c.rope_freq_base)),
            ]);
        }
        rows.push(("tied output", opt(&c.tie_word_embeddings)));
        for (k, v) in rows {
            writeln!(s, "  {k:<16}{v}")?;
        }
        if c.ssm.is_none() {
            writeln!(s, "  {:<16}{:?}", "rope scaling", c.rope_scaling)?;
        }
        if let Ok(hp) = crate::arch::Hparams::from_config(c, false) {
            for (k, v) in special_rows(&hp) {
                writeln!(s, "  {k:<16}{v}")?;
            }
        }
    }
    if let Some(e) = &r.config_error {
        writeln!(s, "\nhyperparameters: unavailable ({e})")?;
    }
    if !r.metadata.is_empty() {
        writeln!(s, "\nmetadata ({} keys):", r.metadata.len())?;
        let w = r.metadata.iter().map(|m| m.key.len()).max().unwrap_or(0);
        for m in &r.metadata {
            writeln!(s, "  {:<w$}  {:<14} {}", m.key, m.value_type, m.summary)?;
        }
    }
    if !r.tensors.is_empty() {
        writeln!(s, "\ntensors:")?;
        let w = r.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
        writeln!(
            s,
            "  {:<w$}  {:<8} {:<22} {:>12}",
            "name", "type", "shape", "bytes"
        )?;
        for t in &r.tensors {
            let shape = format!("{:?}", t.shape);
            writeln!(
                s,
                "  {:<w$}  {:<8} {:<22} {:>12}",
                t.name, t.dtype, shape, t.bytes
            )?;
        }
    }
    writeln!(s, "\ntotals by type:")?;
    for t in &r.type_totals {
        writeln!(
            s,
            "  {:<8} {:>5} tensors {:>14} params {:>12}",
            t.dtype,
            t.tensors,
            t.n_elements,
            mib(t.bytes)
        )?;
    }
    writeln!(
        s,
        "  {:<8} {:>5} tensors {:>14} params {:>12}",
        "all",
        r.n_tensors,
        r.n_params,
        mib(r.tensor_bytes)
    )?;
    Ok(())
}

/// The hyperparameters past a plain Llama block that the architecture applies (with its
/// defaults where the file is silent): experts, sliding window, attention scale, soft-capping.
fn special_rows(hp: &crate::arch::Hparams) -> Vec<(&'static str, String)> {
    let mut rows = Vec::new();
    if hp.n_expert > 0 {
        rows.push((
            "experts",
            format!("{} per block, {} per token", hp.n_expert, hp.n_expert_used),
        ));
    }
    if let Some(swa) = &hp.swa {
        let global: Vec<String> = swa
            .layers
            .iter()
            .enumerate()
            .filter(|(_, &w)| !w)
            .map(|(l, _)| l.to_string())
            .collect();
        let n_window = swa.layers.len() - global.len();
        let global = match global.is_empty() {
            true => String::new(),
            false => format!(" (global: {})", global.join(", ")),
        };
        rows.push((
            "sliding window",
            format!(
                "{} tokens on {n_window} of {} blocks{global}",
                swa.window,
                swa.layers.len()
            ),
        ));
        if swa.rope.freq_base != hp.rope.freq_base {
            rows.push(("swa rope base", swa.rope.freq_base.to_string()));
        }
    }
    let plain = 1.0 / (hp.head_dim as f32).sqrt();
    if hp.ssm.is_none() && (hp.attn_scale - plain).abs() > 1e-7 {
        rows.push((
            "attn scale",
            format!("{} (1/sqrt(head dim) = {plain})", hp.attn_scale),
        ));
    }
    if let Some(e) = hp.embd_scale {
        rows.push(("embd scale", e.to_string()));
    }
    if hp.attn_softcap > 0.0 {
        rows.push(("attn softcap", hp.attn_softcap.to_string()));
    }
    if let Some(f) = hp.final_softcap {
        rows.push(("logit softcap", f.to_string()));
    }
    rows
}
