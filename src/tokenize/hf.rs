//! Hugging Face `tokenizer.json` (WordPiece, BPE, Unigram as HF serialises them).

use std::path::Path;

use tokenizers::{Encoding, PostProcessor, Token, Tokenizer};

use super::bert_wordpiece::BertWordPiece;
use super::{Encoded, TokenizeError, Vocabulary};

pub struct HfTokenizer {
    inner: Tokenizer,
    /// BERT's pipeline without the crate's per-byte bookkeeping, when the file is BERT's.
    bert: Option<BertWordPiece>,
    vocab_size: usize,
    pad_id: i64,
    specials: usize,
    pair_specials: usize,
    frame: Option<Frame>,
}

/// The post-processor's single-sequence output as fixed tokens around the
/// content (BERT: `[CLS]` content `[SEP]`, type ids 0), when probes show it is
/// one. Wrapping then copies ids; the post-processor itself builds a string
/// per token, a fifth of the time tokenizing took.
struct Frame {
    prefix: Encoded,
    suffix: Encoded,
    content_type: i64,
}

impl Frame {
    /// The frame that `wrap` shows around probes of 0, 1 and 3 tokens, if one
    /// frame explains all three.
    fn find(wrap: impl Fn(&[u32]) -> Option<Encoded>, specials: usize, a: u32, b: u32) -> Option<Frame> {
        let probes: [&[u32]; 3] = [&[], &[a], &[a, b, a]];
        let outputs: Vec<Encoded> = probes.iter().map(|p| wrap(p)).collect::<Option<_>>()?;
        (0..=specials).find_map(|k| {
            let one = &outputs[1];
            if one.ids.len() != specials + 1 {
                return None;
            }
            let frame = Frame {
                prefix: Encoded { ids: one.ids[..k].to_vec(), type_ids: one.type_ids[..k].to_vec() },
                suffix: Encoded { ids: one.ids[k + 1..].to_vec(), type_ids: one.type_ids[k + 1..].to_vec() },
                content_type: one.type_ids[k],
            };
            probes.iter().zip(&outputs).all(|(probe, output)| frame.wrap(probe) == *output).then_some(frame)
        })
    }

    fn wrap(&self, content: &[u32]) -> Encoded {
        let mut ids = Vec::with_capacity(self.prefix.ids.len() + content.len() + self.suffix.ids.len());
        ids.extend_from_slice(&self.prefix.ids);
        ids.extend(content.iter().map(|&i| i as i64));
        ids.extend_from_slice(&self.suffix.ids);
        let mut type_ids = Vec::with_capacity(ids.len());
        type_ids.extend_from_slice(&self.prefix.type_ids);
        type_ids.extend(std::iter::repeat_n(self.content_type, content.len()));
        type_ids.extend_from_slice(&self.suffix.type_ids);
        Encoded { ids, type_ids }
    }
}

impl HfTokenizer {
    /// Padding and truncation baked into the file are dropped: the batcher pads,
    /// and the shared layer truncates or windows the content ids.
    pub fn from_file(path: &Path) -> Result<Self, TokenizeError> {
        let mut inner = Tokenizer::from_file(path).map_err(|e| TokenizeError::Tokenizer(format!("{}: {e}", path.display())))?;
        let pad_id = inner.get_padding().map(|p| p.pad_id as i64).unwrap_or(0);
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let vocab_size = inner.get_vocab_size(true);
        let specials = inner.get_post_processor().map(|p| p.added_tokens(false)).unwrap_or(0);
        let pair_specials = inner.get_post_processor().map(|p| p.added_tokens(true)).unwrap_or(0);
        let bert = BertWordPiece::find(&inner);
        let mut tokenizer = Self { inner, bert, vocab_size, pad_id, specials, pair_specials, frame: None };
        // Two ordinary ids to probe with: the vocabulary's last two.
        if vocab_size >= 2 {
            let (a, b) = (vocab_size as u32 - 1, vocab_size as u32 - 2);
            tokenizer.frame = Frame::find(|probe| tokenizer.post_process(tokenizer.encoding(probe, 0), None).ok(), specials, a, b);
        }
        Ok(tokenizer)
    }

    /// Special tokens the post-processor adds to a pair of sequences.
    pub fn pair_specials(&self) -> usize {
        self.pair_specials
    }

    fn encoding(&self, content: &[u32], type_id: u32) -> Encoding {
        let tokens = content.iter().map(|&id| Token::new(id, self.inner.id_to_token(id).unwrap_or_default(), (0, 0))).collect();
        Encoding::from_tokens(tokens, type_id)
    }

    /// A pair as the model's template joins two sequences (BERT: `[CLS] a
    /// [SEP] b [SEP]`, type ids 0 then 1).
    pub fn wrap_pair(&self, first: &[u32], second: &[u32]) -> Result<Encoded, TokenizeError> {
        self.post_process(self.encoding(first, 0), Some(self.encoding(second, 1)))
    }

    fn post_process(&self, first: Encoding, second: Option<Encoding>) -> Result<Encoded, TokenizeError> {
        let encoding = self.inner.post_process(first, second, true).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(Encoded { ids: encoding.get_ids().iter().map(|&i| i as i64).collect(), type_ids: encoding.get_type_ids().iter().map(|&i| i as i64).collect() })
    }
}

impl Vocabulary for HfTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn pad_id(&self) -> i64 {
        self.pad_id
    }

    /// Special tokens the post-processor adds to one sequence.
    fn specials(&self) -> usize {
        self.specials
    }

    /// Without offsets: nothing here reads them, and tracking them costs a
    /// fifth of the time (Python tokenizers 0.23, `encode_batch_fast` against
    /// `encode_batch`, one thread, stdlib paragraphs: 2,924-3,104 texts/s
    /// against 2,201-2,774).
    fn content(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        if let Some(ids) = self.bert.as_ref().and_then(|fast| fast.content(text, self.inner.get_model())) {
            return ids;
        }
        let encoding = self.inner.encode_fast(text, false).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    fn check_id(&self, id: i64) -> Option<u32> {
        u32::try_from(id).ok().filter(|&id32| (id32 as usize) < self.vocab_size && self.inner.id_to_token(id32).is_some())
    }

    /// The model's special tokens around `content`, with its type ids.
    fn wrap(&self, content: &[u32]) -> Result<Encoded, TokenizeError> {
        match &self.frame {
            Some(frame) => Ok(frame.wrap(content)),
            None => self.post_process(self.encoding(content, 0), None),
        }
    }

    fn pairs(&self) -> Option<&HfTokenizer> {
        Some(self)
    }

    fn tokens(&self, text: &str, add_special: bool) -> Result<Vec<super::Token>, TokenizeError> {
        // encode (not encode_fast): offsets are the point here, in bytes of `text`.
        let encoding = self.inner.encode(text, add_special).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let tokens = encoding.get_ids().iter().zip(encoding.get_tokens()).zip(encoding.get_offsets()).zip(encoding.get_special_tokens_mask());
        Ok(tokens
            .map(|(((&id, token), &(start, stop)), &special)| match special {
                1 => super::Token { id, text: token.clone(), special: true, start: None, stop: None },
                _ => super::Token { id, text: text.get(start..stop).unwrap_or(token).to_string(), special: false, start: Some(start), stop: Some(stop) },
            })
            .collect())
    }

    fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizeError> {
        self.inner.decode(ids, skip_special).map_err(|e| TokenizeError::Tokenizer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::{Encoded, Frame};

    fn encoded(ids: &[i64], type_ids: &[i64]) -> Encoded {
        Encoded { ids: ids.to_vec(), type_ids: type_ids.to_vec() }
    }

    #[test]
    fn a_fixed_template_becomes_a_frame_and_anything_else_does_not() {
        // BERT: [CLS]=101 content [SEP]=102, type ids 0.
        let bert = |c: &[u32]| {
            let ids: Vec<i64> = [101].into_iter().chain(c.iter().map(|&i| i as i64)).chain([102]).collect();
            Some(Encoded { type_ids: vec![0; ids.len()], ids })
        };
        let frame = Frame::find(bert, 2, 7, 8).expect("BERT's template is a frame");
        assert_eq!(frame.wrap(&[5, 6]), encoded(&[101, 5, 6, 102], &[0, 0, 0, 0]));
        // Content typed 1 between specials typed 0 and 2.
        let typed = |c: &[u32]| {
            let ids: Vec<i64> = [1].into_iter().chain(c.iter().map(|&i| i as i64)).chain([2, 3]).collect();
            let type_ids = [0].into_iter().chain(c.iter().map(|_| 1)).chain([2, 2]).collect();
            Some(Encoded { ids, type_ids })
        };
        assert_eq!(Frame::find(typed, 3, 7, 8).unwrap().wrap(&[9]), encoded(&[1, 9, 2, 3], &[0, 1, 2, 2]));
        // A template that puts a token between content tokens is not a frame.
        let interleaved = |c: &[u32]| {
            let ids: Vec<i64> = c.iter().flat_map(|&i| [i as i64, 0]).collect();
            Some(Encoded { type_ids: vec![0; ids.len()], ids })
        };
        assert!(Frame::find(interleaved, 1, 7, 8).is_none());
        // One that adds nothing is an empty frame.
        let plain = |c: &[u32]| {
            let ids: Vec<i64> = c.iter().map(|&i| i as i64).collect();
            Some(Encoded { type_ids: vec![0; ids.len()], ids })
        };
        assert_eq!(Frame::find(plain, 0, 7, 8).unwrap().wrap(&[4]), encoded(&[4], &[0]));
    }
}
