//! RULER's retrieval tasks: needle in a haystack (single, multi-key, multi-value, multi-query and
//! the ordinal variant), passkey, and JSON key-value retrieval.
use super::*;

impl Generator<'_> {
    pub(super) fn niah(&self, spec: &Spec, depth: f64, rng: &mut SplitMix64) -> Result<Outcome> {
        let p = spec.task.niah().unwrap_or(Niah {
            hay: Hay::Essay,
            key: Kind::Words,
            value: Kind::Numbers,
            k: 1,
            v: 1,
            q: 1,
        });
        let ordinal = match spec.task {
            Task::NiahOrdinal(o) => Some(o),
            _ => None,
        };
        let type_v = p.value.plural();
        // Keys are distinct; so are all values.
        let (keys, values) = niah_keys_and_values(&p, rng);
        let (expected, distractors, evidence_idx) = niah_answers(&p, ordinal, &values);
        // Depths: the first evidence needle at `depth`; the rest random (RULER's whole-percent
        // depths), except that the ordinal variant keeps its occurrences in order around `depth`.
        let (placed, evidence) = match ordinal {
            Some(_) => place_ordinal(&p, type_v, &keys, &values, evidence_idx[0].1, depth, rng),
            None => place_needles(type_v, &keys, &values, &evidence_idx, depth, rng),
        };
        // Template: RULER's, in the singular when one value is asked for.
        let single = expected.len() == 1;
        // Which keys are asked for: the first `q` (keys are random, so this is a random choice).
        let query = join_and(&keys[..p.q]);
        let (head, tail, answer) = niah_template(ordinal, type_v, &query, single);
        let n_ev = evidence.len();
        let start = rng.range(0, self.haystack.words.len() as i64 - 1) as usize;
        let hay_rng = rng.clone();
        let build = |n: usize| {
            let (units, sep): (Vec<String>, &str) = match p.hay {
                Hay::Essay => (sentences(self.haystack.words_from(start, n)), " "),
                Hay::Noise => (vec![NOISE.to_string(); n], "\n"),
                Hay::Needles => {
                    let mut r = hay_rng.clone();
                    let units = (0..n)
                        .map(|_| loop {
                            let k = random_of(p.key, &mut r);
                            if !keys.contains(&k) {
                                break niah_needle(type_v, &k, &random_of(p.value, &mut r));
                            }
                        })
                        .collect();
                    (units, "\n")
                }
            };
            let (ctx, offs) = insert(&units, &placed, sep, n_ev);
            wrap(&head, &ctx, &tail, &answer, &offs)
        };
        let max_n = usize::MAX;
        let (tokens, built) = self.fill(spec, max_n, build)?;
        Ok(((tokens, built), expected, distractors, evidence))
    }

    /// The passkey prompt of Landmark Attention's evaluation (the noise sentences joined by
    /// spaces), with a 5-digit key.
    pub(super) fn passkey(&self, spec: &Spec, depth: f64, rng: &mut SplitMix64) -> Result<Outcome> {
        let key = rng.range(10000, 99999).to_string();
        let needle = format!("The pass key is {key}. Remember it. {key} is the pass key.");
        let placed: Placed = vec![(depth, needle.clone(), Some(0))];
        let head =
            "There is an important info hidden inside a lot of irrelevant text. Find it and \
                    memorize them. I will quiz you about the important information there.\n";
        let (tail, answer) = ("\nWhat is the pass key?", " The pass key is");
        let build = |n: usize| {
            let (ctx, offs) = insert(&vec![NOISE.to_string(); n], &placed, " ", 1);
            wrap(head, &ctx, tail, answer, &offs)
        };
        let built = self.fill(spec, usize::MAX, build)?;
        Ok((built, vec![key], Vec::new(), vec![needle]))
    }

    /// HELMET's JSON KV prompt: a JSON object of UUID pairs, formatted as "Lost in the Middle"
    /// formats it (`JSON data:`, one `"key": "value"` per line), then HELMET's instruction, two
    /// demonstrations (other pairs of the same object, as HELMET's published example shows) and
    /// the asked key. The asked pair sits at `depth`.
    pub(super) fn json_kv(&self, spec: &Spec, depth: f64, rng: &mut SplitMix64) -> Result<Outcome> {
        let uuid = |rng: &mut SplitMix64| random_of(Kind::Uuids, rng);
        let record = |k: &str, v: &str| format!("\"{k}\": \"{v}\"");
        let (key, value) = (uuid(rng), uuid(rng));
        let demos: Vec<(String, String)> = (0..2).map(|_| (uuid(rng), uuid(rng))).collect();
        let gold = record(&key, &value);
        let placed: Placed = vec![(depth, gold.clone(), Some(0))];
        // The demonstrations' pairs sit in the object too, at random depths.
        let demo_placed: Placed = demos
            .iter()
            .map(|(k, v)| (rng.uniform(), record(k, v), None))
            .collect();
        // A pair takes well over 16 tokens with any tokenizer: enough pairs for any budget.
        let others: Vec<String> = (0..spec.budget / 16 + 1)
            .map(|_| record(&uuid(rng), &uuid(rng)))
            .collect();
        let head = "JSON data:\n{";
        let demo_text: String = demos
            .iter()
            .map(|(k, v)| format!("Key: {k}\nCorresponding value: {v}\n\n"))
            .collect();
        let tail = format!("}}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n{demo_text}Key: {key}");
        let answer = "\nCorresponding value:";
        let build = |n: usize| {
            let mut all = placed.clone();
            all.extend(demo_placed.iter().cloned());
            let (ctx, offs) = insert(&others[..n], &all, ",\n ", 1);
            wrap(head, &ctx, &tail, answer, &offs)
        };
        let built = self.fill(spec, others.len(), build)?;
        Ok((built, vec![value], Vec::new(), vec![gold]))
    }
}

/// A NIAH needle: `value` for `key`, as RULER words it.
fn niah_needle(type_v: &str, key: &str, value: &str) -> String {
    format!("One of the special magic {type_v} for {key} is: {value}.")
}

/// `p.k` distinct keys, then `p.v` values for each, all values distinct.
fn niah_keys_and_values(p: &Niah, rng: &mut SplitMix64) -> (Vec<String>, Vec<Vec<String>>) {
    let mut keys: Vec<String> = Vec::new();
    while keys.len() < p.k {
        let k = random_of(p.key, rng);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut seen = HashSet::new();
    let mut values: Vec<Vec<String>> = Vec::new();
    for _ in 0..p.k {
        let mut vs = Vec::new();
        while vs.len() < p.v {
            let v = random_of(p.value, rng);
            if seen.insert(v.clone()) {
                vs.push(v);
            }
        }
        values.push(vs);
    }
    (keys, values)
}

/// The expected values, the distractors (the ordinal variant's other occurrences) and the
/// evidence needles as (key, value) indices, in the order the answer lists them: every value of
/// the first `p.q` keys, or the ordinal variant's asked occurrence of the first key.
fn niah_answers(
    p: &Niah,
    ordinal: Option<Ordinal>,
    values: &[Vec<String>],
) -> (Vec<String>, Vec<String>, Vec<(usize, usize)>) {
    match ordinal {
        Some(o) => {
            let asked = match o {
                Ordinal::First => 0,
                Ordinal::Second => 1,
                Ordinal::Last => p.v - 1,
            };
            let others = (0..p.v)
                .filter(|&j| j != asked)
                .map(|j| values[0][j].clone());
            (
                vec![values[0][asked].clone()],
                others.collect(),
                vec![(0, asked)],
            )
        }
        None => {
            let idx: Vec<(usize, usize)> = (0..p.q)
                .flat_map(|i| (0..p.v).map(move |j| (i, j)))
                .collect();
            let exp = idx.iter().map(|&(i, j)| values[i][j].clone()).collect();
            (exp, Vec::new(), idx)
        }
    }
}

/// A random whole-percent depth between `lo` and `hi` (RULER's depths are whole percents), or
/// `lo` when no whole percent lies strictly inside.
fn whole_percent(rng: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    let (a, b) = ((lo * 100.0).ceil() as i64, (hi * 100.0).floor() as i64);
    if b <= a {
        lo
    } else {
        rng.range(a, b) as f64 / 100.0
    }
}

/// Where the ordinal variant's needles go: its occurrences of the first key in order around
/// `depth`, the asked one (`asked`) at `depth`; and the evidence, that one needle.
fn place_ordinal(
    p: &Niah,
    type_v: &str,
    keys: &[String],
    values: &[Vec<String>],
    asked: usize,
    depth: f64,
    rng: &mut SplitMix64,
) -> (Placed, Vec<String>) {
    let mut placed: Placed = Vec::new();
    let mut ds: Vec<f64> = Vec::new();
    for j in 0..p.v {
        ds.push(match j.cmp(&asked) {
            std::cmp::Ordering::Less => whole_percent(rng, 0.0, depth),
            std::cmp::Ordering::Equal => depth,
            std::cmp::Ordering::Greater => whole_percent(rng, depth, 1.0),
        });
    }
    let (before, after) = ds.split_at_mut(asked);
    before.sort_by(f64::total_cmp);
    after[1..].sort_by(f64::total_cmp);
    for (j, d) in ds.iter().enumerate() {
        let ev = (j == asked).then_some(0);
        placed.push((*d, niah_needle(type_v, &keys[0], &values[0][j]), ev));
    }
    (
        placed,
        vec![niah_needle(type_v, &keys[0], &values[0][asked])],
    )
}

/// Where the needles go: the first evidence needle at `depth`, the rest at random whole-percent
/// depths; and the evidence needles, in the order of `evidence_idx`.
fn place_needles(
    type_v: &str,
    keys: &[String],
    values: &[Vec<String>],
    evidence_idx: &[(usize, usize)],
    depth: f64,
    rng: &mut SplitMix64,
) -> (Placed, Vec<String>) {
    let mut placed: Placed = Vec::new();
    let mut ev = Vec::new();
    for (i, (key, vals)) in keys.iter().zip(values).enumerate() {
        for (j, value) in vals.iter().enumerate() {
            let e = evidence_idx.iter().position(|&x| x == (i, j));
            let d = if e == Some(0) {
                depth
            } else {
                whole_percent(rng, 0.0, 1.0)
            };
            placed.push((d, niah_needle(type_v, key, value), e));
            if e.is_some() {
                ev.push((e, niah_needle(type_v, key, value)));
            }
        }
    }
    ev.sort();
    (placed, ev.into_iter().map(|(_, s)| s).collect())
}

/// RULER's NIAH template for the query: the question, then the answer prefix (split where RULER
/// splits `template` and `answer_prefix`), as (head, tail, answer prefix).
fn niah_template(
    ordinal: Option<Ordinal>,
    type_v: &str,
    query: &str,
    single: bool,
) -> (String, String, String) {
    match ordinal {
        Some(o) => (
            format!("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_v} afterwards.\n"),
            format!("\nWhat is the {w} special magic {t} for {query} mentioned in the provided text?", w = o.word(), t = singular(type_v)),
            format!(" The {w} special magic {t} for {query} mentioned in the provided text is", w = o.word(), t = singular(type_v)),
        ),
        None if single => {
            let t = singular(type_v);
            (
                format!("A special magic {t} is hidden within the following text. Make sure to memorize it. I will quiz you about the {t} afterwards.\n"),
                format!("\nWhat is the special magic {t} for {query} mentioned in the provided text?"),
                format!(" The special magic {t} for {query} mentioned in the provided text is"),
            )
        }
        None => (
            format!("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_v} afterwards.\n"),
            format!("\nWhat are all the special magic {type_v} for {query} mentioned in the provided text?"),
            format!(" The special magic {type_v} for {query} mentioned in the provided text are"),
        ),
    }
}

/// The values of a JSON KV context's `"key": "value"` records, in order.
pub(super) fn json_kv_values(context: &str) -> Vec<String> {
    context
        .split(",\n ")
        .filter_map(|r| {
            r.split_once("\": \"")
                .map(|(_, v)| v.trim_end_matches(['"', '}']))
        })
        .map(str::to_string)
        .collect()
}
