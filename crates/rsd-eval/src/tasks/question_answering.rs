//! RULER's question answering (qa_1: SQuAD, qa_2: HotpotQA): the gold paragraphs among
//! distractor paragraphs, the answering one at the asked depth.
use super::*;

impl Generator<'_> {
    /// RULER's QA prompt: question `sample` of the set, its documents and distractors drawn as
    /// RULER draws them (the question's own first, then the other paragraphs of its article,
    /// then any others), numbered "Document i:". RULER's fixed shuffle puts the answering
    /// document at the same place in every prompt of a length; here it sits at `depth` (several
    /// answering documents together), the others in random order around it.
    pub(super) fn qa(
        &self,
        spec: &Spec,
        depth: f64,
        sample: usize,
        rng: &mut SplitMix64,
    ) -> Result<Outcome> {
        let source = spec.task.qa_source().unwrap_or(QaSource::Squad);
        let set = self
            .qa
            .and_then(|q| q.get(source))
            .ok_or_else(|| TaskError::NoQaData {
                task: spec.task.name().into(),
                file: source.file_name().into(),
                url: source.url().into(),
            })?;
        let q = &set.questions[sample % set.questions.len()];
        let mut own: Vec<usize> = q
            .context
            .iter()
            .copied()
            .filter(|d| !q.evidence.contains(d))
            .collect();
        shuffle(&mut own, rng);
        let mut more = q.more_context.clone();
        shuffle(&mut more, rng);
        let taken: HashSet<usize> = q.context.iter().chain(&q.more_context).copied().collect();
        let mut rest: Vec<usize> = (0..set.docs.len()).filter(|d| !taken.contains(d)).collect();
        shuffle(&mut rest, rng);
        let order: Vec<usize> = own.into_iter().chain(more).chain(rest).collect();
        let mut evidence = q.evidence.clone();
        shuffle(&mut evidence, rng);
        let evidence_text: Vec<String> = evidence.iter().map(|&d| set.docs[d].clone()).collect();
        let head = "Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n";
        let tail = format!("\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {}", q.query);
        let answer = " Answer:";
        let order_rng = rng.clone();
        let build = |n: usize| {
            let mut others: Vec<usize> = order[..n].to_vec();
            shuffle(&mut others, &mut order_rng.clone());
            let mut cum = vec![0usize];
            for &d in &others {
                cum.push(cum[cum.len() - 1] + set.docs[d].len());
            }
            let at = nearest_boundary(&cum, depth);
            let docs: Vec<(&str, bool)> = others[..at]
                .iter()
                .map(|&d| (set.docs[d].as_str(), false))
                .chain(evidence_text.iter().map(|e| (e.as_str(), true)))
                .chain(others[at..].iter().map(|&d| (set.docs[d].as_str(), false)))
                .collect();
            let mut ctx = String::new();
            let mut offs = Vec::new();
            for (i, (doc, is_evidence)) in docs.iter().enumerate() {
                if i > 0 {
                    ctx.push_str("\n\n");
                }
                ctx.push_str(&format!("Document {}:\n", i + 1));
                if *is_evidence {
                    offs.push(ctx.len());
                }
                ctx.push_str(doc);
            }
            wrap(head, &ctx, &tail, answer, &offs)
        };
        let built = self.fill(spec, order.len(), build)?;
        Ok((built, q.outputs.clone(), Vec::new(), evidence_text))
    }
}
