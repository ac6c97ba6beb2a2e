//! RULER's multi-hop tracing: variable tracking (vt), chains of assignments spread over noise.
use super::*;

impl Generator<'_> {
    pub(super) fn vt(&self, spec: &Spec, rng: &mut SplitMix64) -> Result<Outcome> {
        const HOPS: usize = 4;
        // RULER's one-shot example: the same task with 3-letter variables in noise filling 500
        // tokens (here at most a quarter of the length, so that short lengths still have room),
        // its answer after the answer prefix, then a blank line before the task itself.
        const EXAMPLE_TOKENS: usize = 500;
        let (ex_vars, ex_value, ex_chain) = vt_chain(3, HOPS, rng);
        let ex_placed = vt_placed(&ex_chain, rng);
        let ex_build = |n: usize| vt_prompt("", &ex_chain, &ex_placed, &ex_value, n);
        let plain = Generator {
            chat: None,
            ..*self
        };
        let ex_budget = EXAMPLE_TOKENS.min(spec.length / 4);
        let ex_spec = Spec {
            budget: ex_budget,
            max_new_tokens: 0,
            ..*spec
        };
        let example = match plain.fill(&ex_spec, usize::MAX, ex_build) {
            Ok((_, b)) => b.prompt,
            Err(TaskError::TooShort { .. }) => ex_build(0).prompt,
            Err(e) => return Err(e),
        };
        let example = format!("{example} {}\n\n", ex_vars.join(" "));
        let (vars, value, chain) = vt_chain(5, HOPS, rng);
        let placed = vt_placed(&chain, rng);
        let build = |n: usize| vt_prompt(&example, &chain, &placed, &value, n);
        let built = self.fill(spec, usize::MAX, build)?;
        Ok((built, vars, Vec::new(), chain))
    }
}

/// A variable-tracking chain: `hops + 1` distinct variables of `letters` capital letters, a
/// 5-digit value, and RULER's assignment lines ("VAR A = 12345", then "VAR B = VAR A " …, with
/// RULER's trailing space).
pub(super) fn vt_chain(
    letters: usize,
    hops: usize,
    rng: &mut SplitMix64,
) -> (Vec<String>, String, Vec<String>) {
    let mut vars: Vec<String> = Vec::new();
    while vars.len() < hops + 1 {
        let v: String = (0..letters)
            .map(|_| (b'A' + rng.range(0, 25) as u8) as char)
            .collect();
        if !vars.contains(&v) {
            vars.push(v);
        }
    }
    let value = rng.range(10000, 99999).to_string();
    let mut chain = vec![format!("VAR {} = {value}", vars[0])];
    for j in 0..hops {
        chain.push(format!("VAR {} = VAR {} ", vars[j + 1], vars[j]));
    }
    (vars, value, chain)
}

/// The chain's lines at random depths, in chain order.
pub(super) fn vt_placed(chain: &[String], rng: &mut SplitMix64) -> Placed {
    let mut ds: Vec<f64> = (0..chain.len()).map(|_| rng.uniform()).collect();
    ds.sort_by(f64::total_cmp);
    chain
        .iter()
        .zip(&ds)
        .enumerate()
        .map(|(i, (c, d))| (*d, c.clone(), Some(i)))
        .collect()
}

/// RULER's variable-tracking prompt after `before` (the one-shot example): the chain in `n`
/// noise lines, the question, and the answer prefix.
pub(super) fn vt_prompt(
    before: &str,
    chain: &[String],
    placed: &Placed,
    value: &str,
    n: usize,
) -> Built {
    let head = format!("{before}Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n");
    let tail = format!(
        "\nQuestion: Find all variables that are assigned the value {value} in the text above."
    );
    let answer = format!(" Answer: According to the chain(s) of variable assignment in the text above, {} variables are assigned the value {value}, they are: ", chain.len());
    let (ctx, offs) = insert(&vec![NOISE.to_string(); n], placed, "\n", chain.len());
    wrap(&head, &ctx, &tail, &answer, &offs)
}
