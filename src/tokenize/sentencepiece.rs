//! SentencePiece `.model` files, tokenized by the SentencePiece library itself:
//! a unigram vocabulary segmented by a BPE merge loop gives different pieces
//! than training did, and that skew silently costs retrieval quality.

use std::path::Path;

use sentencepiece::SentencePieceProcessor;

use super::{Encoded, TokenizeError, Vocabulary};
use crate::config::TokenIds;

pub struct SpTokenizer {
    inner: SentencePieceProcessor,
    ids: TokenIds,
    bos: u32,
    eos: u32,
    pad: u32,
    unk: u32,
    vocab_size: usize,
}

/// XLM-R's HF ids: <s>=0 <pad>=1 </s>=2 <unk>=3, SentencePiece's own ids shifted
/// by one (fairseq kept its dictionary's first four entries), <mask> last.
const FAIRSEQ_OFFSET: u32 = 1;

impl SpTokenizer {
    pub fn from_file(path: &Path, ids: TokenIds) -> Result<Self, TokenizeError> {
        let inner = SentencePieceProcessor::open(path).map_err(|e| TokenizeError::Tokenizer(format!("{}: {e}", path.display())))?;
        let len = inner.len();
        let (bos, eos, pad, unk, vocab_size) = match ids {
            TokenIds::Raw => {
                let need = |id: Option<u32>, what: &str| {
                    id.ok_or_else(|| TokenizeError::Tokenizer(format!("{}: the SentencePiece model defines no {what} id", path.display())))
                };
                let (bos, eos) = (need(inner.bos_id(), "bos")?, need(inner.eos_id(), "eos")?);
                // A model without a pad piece pads with <unk>; the mask hides it either way.
                (bos, eos, inner.pad_id().unwrap_or(inner.unk_id()), inner.unk_id(), len)
            }
            TokenIds::Fairseq => (0, 2, 1, 3, len + FAIRSEQ_OFFSET as usize + 1),
        };
        Ok(Self { inner, ids, bos, eos, pad, unk, vocab_size })
    }
}

impl Vocabulary for SpTokenizer {
    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn pad_id(&self) -> i64 {
        self.pad as i64
    }

    fn specials(&self) -> usize {
        2
    }

    fn content(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let pieces = self.inner.encode(text).map_err(|e| TokenizeError::Tokenizer(e.to_string()))?;
        let unk = self.inner.unk_id();
        Ok(pieces
            .into_iter()
            .map(|p| match self.ids {
                TokenIds::Raw => p.id,
                TokenIds::Fairseq if p.id == unk => self.unk,
                TokenIds::Fairseq => p.id + FAIRSEQ_OFFSET,
            })
            .collect())
    }

    fn check_id(&self, id: i64) -> Option<u32> {
        u32::try_from(id).ok().filter(|&id32| (id32 as usize) < self.vocab_size)
    }

    fn wrap(&self, content: &[u32]) -> Result<Encoded, TokenizeError> {
        let ids: Vec<i64> = std::iter::once(self.bos).chain(content.iter().copied()).chain([self.eos]).map(i64::from).collect();
        Ok(Encoded { type_ids: vec![0; ids.len()], ids })
    }
}
