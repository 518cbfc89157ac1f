//! `tern bench --sweep`: ik_llama.cpp's sweep-bench. The context fills ub
//! tokens per step; at each depth d (0, ub, 2ub, ...) it times tg n single
//! tokens on top of the d cached ones (then drops them) and pp ub tokens at d
//! (which are kept, so the next step starts at d + ub).

use std::time::Instant;

use super::{csv_row, emit, gen_token, md_header, md_row, random_tokens, Col, Format, Instance, JsonArray, Plan};
use crate::json;
use crate::CliError;

const FIELDS: [&str; 14] = [
    "model_filename",
    "model_type",
    "n_threads",
    "n_ubatch",
    "type_k",
    "type_v",
    "n_ctx",
    "pp",
    "tg",
    "n_kv",
    "t_pp",
    "speed_pp",
    "t_tg",
    "speed_tg",
];

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64().max(1e-9)
}

/// Tokens of each step's tg: -n, else a quarter of the micro-batch.
pub fn tg_tokens(inst: &Instance, n_gen: Option<usize>) -> usize {
    n_gen.unwrap_or(inst.n_ubatch / 4).max(1)
}

pub fn main(plan: &Plan, n_ctx: usize, n_gen: Option<usize>) -> Result<(), CliError> {
    let cols: Vec<Col> =
        [("PP", 6), ("TG", 6), ("N_KV", 6), ("T_PP s", 8), ("S_PP t/s", 8), ("T_TG s", 8), ("S_TG t/s", 8)]
            .iter()
            .map(|&(n, w)| Col::new(n, w, false))
            .collect();
    let mut json_out = None;
    match plan.format {
        Format::Csv => emit(&FIELDS.join(",")),
        Format::Json => json_out = Some(JsonArray::start()),
        Format::Md => {}
    }
    for (i, inst) in plan.instances.iter().enumerate() {
        let m = &plan.models[inst.model];
        let ub = inst.n_ubatch;
        let tg = tg_tokens(inst, n_gen);
        let mut session = inst.load(&plan.models, n_ctx)?;
        let tok = gen_token(&session);
        let n_vocab = session.n_vocab();
        eprintln!(
            "sweep: {} ({}), {} threads, n_ctx {n_ctx}, ub {ub}, tg {tg}, cache {}/{}",
            m.desc,
            m.path.display(),
            inst.threads,
            inst.type_k,
            inst.type_v
        );
        if plan.format == Format::Md {
            if i > 0 {
                emit("");
            }
            emit(&md_header(&cols));
        }
        if plan.warmup {
            session.eval_last(&random_tokens(ub, n_vocab, 1))?;
            session.eval_last(&[tok])?;
        }
        session.reset();
        let mut depth = 0;
        while depth + ub.max(tg) <= n_ctx {
            let t0 = Instant::now();
            for _ in 0..tg {
                session.eval_last(&[tok])?;
            }
            let t_tg = secs(t0);
            session.truncate(depth);
            let prompt = random_tokens(ub, n_vocab, 0x5eed + depth as u64);
            let t0 = Instant::now();
            for chunk in prompt.chunks(inst.n_batch) {
                session.eval_last(chunk)?;
            }
            let t_pp = secs(t0);
            debug_assert_eq!(session.pos(), depth + ub);
            let (s_pp, s_tg) = (ub as f64 / t_pp, tg as f64 / t_tg);
            match plan.format {
                Format::Md => {
                    let cells = [
                        ub.to_string(),
                        tg.to_string(),
                        depth.to_string(),
                        format!("{t_pp:.3}"),
                        format!("{s_pp:.2}"),
                        format!("{t_tg:.3}"),
                        format!("{s_tg:.2}"),
                    ];
                    emit(&md_row(&cols, &cells));
                }
                _ => {
                    let vals = [
                        m.path.display().to_string(),
                        m.desc.clone(),
                        inst.threads.to_string(),
                        ub.to_string(),
                        inst.type_k.clone(),
                        inst.type_v.clone(),
                        n_ctx.to_string(),
                        ub.to_string(),
                        tg.to_string(),
                        depth.to_string(),
                        format!("{t_pp:.6}"),
                        format!("{s_pp:.6}"),
                        format!("{t_tg:.6}"),
                        format!("{s_tg:.6}"),
                    ];
                    match json_out.as_mut() {
                        Some(j) => {
                            let quoted = |k: &str| matches!(k, "model_filename" | "model_type" | "type_k" | "type_v");
                            let fields: Vec<(&str, String)> = FIELDS
                                .iter()
                                .zip(vals)
                                .map(|(&k, v)| (k, if quoted(k) { json::string(&v) } else { v }))
                                .collect();
                            j.push(&fields);
                        }
                        None => emit(&csv_row(&vals)),
                    }
                }
            }
            depth += ub;
        }
    }
    if let Some(j) = json_out {
        j.finish();
    }
    Ok(())
}
