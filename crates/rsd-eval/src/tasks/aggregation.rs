//! RULER's aggregation tasks: common words (cwe) and frequent words (fwe) extraction.
use super::*;

impl Generator<'_> {
    pub(super) fn cwe(&self, spec: &Spec, rng: &mut SplitMix64) -> Result<Outcome> {
        const NUM_CW: usize = 10;
        let vocab = &self.haystack.vocabulary;
        if vocab.len() < 100 {
            return Err(TaskError::Haystack {
                path: self.haystack.source.clone().into(),
                reason: format!(
                    "cwe needs at least 100 distinct words, this haystack has {}",
                    vocab.len()
                ),
            });
        }
        // RULER's setting: below 4K tokens the list repeats the common words 6 times and the
        // others once, after a one-shot example of 20 words (3 and 1 times); from 4K on, 30 and 3
        // times after an example of 40 words (10 and 3 times).
        let ((freq_cw, freq_ucw), (ex_words, ex_cw, ex_ucw)) = if spec.length < 4096 {
            ((6, 1), (20, 3, 1))
        } else {
            ((30, 3), (40, 10, 3))
        };
        let head = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n";
        let tail =
            format!("\nQuestion: What are the {NUM_CW} most common words in the above list?");
        let answer =
            format!(" Answer: The top {NUM_CW} words that appear most often in the list are:");
        // A list of `distinct` words from a random order of the vocabulary, the first ten
        // `freq_cw` times and the rest `freq_ucw` times, shuffled and numbered on one line.
        let list = |order: &[usize],
                    distinct: usize,
                    freq_cw: usize,
                    freq_ucw: usize,
                    r: &mut SplitMix64| {
            let mut words: Vec<&str> = Vec::new();
            for (j, &i) in order[..distinct].iter().enumerate() {
                let times = if j < NUM_CW { freq_cw } else { freq_ucw };
                words.extend(std::iter::repeat_n(vocab[i].as_str(), times));
            }
            shuffle(&mut words, r);
            numbered(&words)
        };
        let mut example_order: Vec<usize> = (0..vocab.len()).collect();
        shuffle(&mut example_order, rng);
        let example_common: Vec<&str> = example_order[..NUM_CW]
            .iter()
            .map(|&i| vocab[i].as_str())
            .collect();
        let example = format!(
            "{head}{}{tail}{answer} {}\n",
            list(&example_order, ex_words, ex_cw, ex_ucw, rng),
            numbered(&example_common)
        );
        let head = format!("{example}{head}");
        let mut order: Vec<usize> = (0..vocab.len()).collect();
        shuffle(&mut order, rng);
        let common: Vec<String> = order[..NUM_CW].iter().map(|&i| vocab[i].clone()).collect();
        let list_rng = rng.clone();
        let build = |n: usize| {
            let mut r = list_rng.clone();
            let ctx = list(&order, NUM_CW + n, freq_cw, freq_ucw, &mut r);
            wrap(&head, &ctx, &tail, &answer, &[])
        };
        let built = self.fill(spec, vocab.len() - NUM_CW, build)?;
        Ok((built, common, Vec::new(), Vec::new()))
    }

    pub(super) fn fwe(&self, spec: &Spec, rng: &mut SplitMix64) -> Result<Outcome> {
        const ALPHA: f64 = 2.0;
        let zeta = std::f64::consts::PI * std::f64::consts::PI / 6.0;
        let vocab_size = (spec.length / 50).max(10);
        let mut seen = HashSet::new();
        let mut vocab: Vec<String> = Vec::new();
        while vocab.len() < vocab_size {
            let w: String = (0..6)
                .map(|_| (b'a' + rng.range(0, 25) as u8) as char)
                .collect();
            if seen.insert(w.clone()) {
                vocab.push(w);
            }
        }
        // The most frequent "word" is noise, as in RULER; the answer is ranks 2 to 4.
        vocab[0] = "...".into();
        let expected = vocab[1..4].to_vec();
        let head = "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. ";
        let tail = "\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?";
        let answer = " Answer: According to the coded text above, the three most frequently appeared words are:";
        let text_rng = rng.clone();
        let build = |n: usize| {
            let mut words: Vec<&str> = Vec::new();
            for (k, w) in vocab.iter().enumerate() {
                let c = (n as f64 * ((k + 1) as f64).powf(-ALPHA) / zeta) as usize;
                words.extend(std::iter::repeat_n(w.as_str(), c));
            }
            let mut r = text_rng.clone();
            shuffle(&mut words, &mut r);
            wrap(head, &words.join(" "), tail, answer, &[])
        };
        let built = self.fill(spec, usize::MAX, build)?;
        Ok((built, expected, Vec::new(), Vec::new()))
    }
}
