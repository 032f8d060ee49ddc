"""A tokenizer.json for a repository that ships only its vocabulary files,
built as transformers' own tokenizer classes build theirs (transformers 5
constructs every tokenizer from these files with the `tokenizers` library):

- RoBERTa's byte-level BPE, from vocab.json + merges.txt: BPE without
  prefixes or suffixes, ByteLevel pre-tokenizer (add_prefix_space from
  tokenizer_config.json, default off), RobertaProcessing (<s> A </s>, pairs
  <s> A </s> </s> B </s>), ByteLevel decoder;
- BERT's WordPiece, from vocab.txt: BertNormalizer (clean text, Chinese
  characters split, lower case from do_lower_case (default on), accents
  stripped when strip_accents says so or, unset, when lower-casing),
  BertPreTokenizer, [CLS] A [SEP] (pairs [CLS] A [SEP] B [SEP], token types
  0 then 1), WordPiece decoder. DistilBERT's is BERT's; MPNet's is BERT's
  with <s> A </s> (pairs <s> A </s> </s> B </s>).

- XLM-R's SentencePiece, from sentencepiece.bpe.model: a Unigram over
  fairseq's numbering (<s>, <pad>, </s>, <unk>, then the model's pieces from
  its fourth on, <mask> last; unk id 3), the model's own precompiled
  normalizer, WhitespaceSplit then Metaspace (prefix "▁" unless
  add_prefix_space is off), <s> A </s> (pairs <s> A </s> </s> B </s>).

The special tokens (and any added tokens tokenizer_config.json lists) are
added as transformers adds them. Which class applies comes from
tokenizer_config.json's tokenizer_class, else from the files present.
CamemBERT's and T5's SentencePiece numberings are refused by name for now,
with the command that gives them a tokenizer.json.
"""
import json
from pathlib import Path

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, Unigram, WordPiece

BYTE_LEVEL_BPE = ("RobertaTokenizer",)
WORDPIECE = ("BertTokenizer", "DistilBertTokenizer", "MPNetTokenizer")
SENTENCEPIECE = ("XLMRobertaTokenizer",)
SENTENCEPIECE_REFUSED = ("CamembertTokenizer", "T5Tokenizer")

DEFAULTS = {
    "RobertaTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>",
                         "pad_token": "<pad>", "mask_token": "<mask>"},
    "BertTokenizer": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"},
    "MPNetTokenizer": {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>", "unk_token": "[UNK]",
                       "pad_token": "<pad>", "mask_token": "<mask>"},
}
DEFAULTS["DistilBertTokenizer"] = DEFAULTS["BertTokenizer"]
DEFAULTS["XLMRobertaTokenizer"] = DEFAULTS["RobertaTokenizer"]


class Unsupported(SystemExit):
    pass


def _read_json(path):
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _content(token):
    """A special token as tokenizer_config.json or special_tokens_map.json writes it: a string or an AddedToken dict."""
    return token["content"] if isinstance(token, dict) else token


def tokenizer_class(snapshot):
    snapshot = Path(snapshot)
    named = (_read_json(snapshot / "tokenizer_config.json").get("tokenizer_class") or "").removesuffix("Fast")
    if named:
        return named
    if (snapshot / "vocab.json").is_file() and (snapshot / "merges.txt").is_file():
        return "RobertaTokenizer"
    if (snapshot / "vocab.txt").is_file():
        return "BertTokenizer"
    if (snapshot / "sentencepiece.bpe.model").is_file():
        return "XLMRobertaTokenizer"
    return None


def build(snapshot):
    """The tokenizers.Tokenizer for the snapshot's vocabulary files; refuses
    what it does not build, naming the class and the files."""
    snapshot = Path(snapshot)
    config = _read_json(snapshot / "tokenizer_config.json")
    special_map = _read_json(snapshot / "special_tokens_map.json")
    kind = tokenizer_class(snapshot)
    if kind in SENTENCEPIECE_REFUSED:
        raise Unsupported(f"{kind}: eeane builds SentencePiece tokenizers for XLM-R's numbering only so far; save a tokenizer.json "
                          f"with transformers (AutoTokenizer.from_pretrained(repo).save_pretrained(dir)) and serve that folder")
    if kind not in BYTE_LEVEL_BPE + WORDPIECE + SENTENCEPIECE:
        raise Unsupported(f"tokenizer class {kind!r} with no tokenizer.json: eeane builds {', '.join(BYTE_LEVEL_BPE + WORDPIECE + SENTENCEPIECE)} "
                          f"from their vocabulary files")
    specials = dict(DEFAULTS[kind])
    declared = {}  # special tokens written as AddedToken dicts, with their flags
    for key in specials:
        value = config.get(key, special_map.get(key))
        if value is not None:
            specials[key] = _content(value)
            if isinstance(value, dict):
                declared[key] = value

    if kind in BYTE_LEVEL_BPE:
        if not ((snapshot / "vocab.json").is_file() and (snapshot / "merges.txt").is_file()):
            raise Unsupported(f"{kind} needs vocab.json and merges.txt, which the repository does not have")
        vocab, merges = BPE.read_file(str(snapshot / "vocab.json"), str(snapshot / "merges.txt"))
        tok = Tokenizer(BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False))
        add_prefix_space = bool(config.get("add_prefix_space", False))
        trim_offsets = bool(config.get("trim_offsets", True))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        tok.decoder = decoders.ByteLevel()
    elif kind in SENTENCEPIECE:
        tok, add_prefix_space = _xlm_roberta(snapshot, config, specials)
    else:
        if not (snapshot / "vocab.txt").is_file():
            raise Unsupported(f"{kind} needs vocab.txt, which the repository does not have")
        vocab = WordPiece.read_file(str(snapshot / "vocab.txt"))
        tok = Tokenizer(WordPiece(vocab, unk_token=specials["unk_token"]))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
                                                    strip_accents=config.get("strip_accents"),
                                                    lowercase=bool(config.get("do_lower_case", True)))
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")

    # The added tokens the repository lists, with their flags, then the
    # special tokens it names, as transformers adds them (not normalized).
    listed = config.get("added_tokens_decoder") or {}
    added = []
    for token_id, token in sorted(listed.items(), key=lambda kv: int(kv[0])):
        token = token if isinstance(token, dict) else {"content": token, "special": True}
        added.append(AddedToken(token["content"], single_word=token.get("single_word", False), lstrip=token.get("lstrip", False),
                                rstrip=token.get("rstrip", False), normalized=token.get("normalized", not token.get("special", False)),
                                special=token.get("special", False)))
    present = {a.content for a in added}
    for key, content in specials.items():
        if content not in present:
            # Flags as declared (older repositories declare RoBERTa's <mask>
            # with lstrip); undeclared, none, as transformers 5 adds them.
            flags = declared.get(key, {})
            added.append(AddedToken(content, single_word=flags.get("single_word", False), lstrip=flags.get("lstrip", False),
                                    rstrip=flags.get("rstrip", False), normalized=flags.get("normalized", False), special=True))
            present.add(content)
    extra = config.get("additional_special_tokens") or special_map.get("additional_special_tokens") or []
    for token in extra:
        if _content(token) not in present:
            added.append(AddedToken(_content(token), normalized=False, special=True))
            present.add(_content(token))
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])

    def token_id(key):
        found = tok.token_to_id(specials[key])
        if found is None:
            raise Unsupported(f"{kind}: the {key} {specials[key]!r} is not in the vocabulary")
        return found

    if kind in BYTE_LEVEL_BPE:
        tok.post_processor = processors.RobertaProcessing((specials["sep_token"], token_id("sep_token")),
                                                          (specials["cls_token"], token_id("cls_token")),
                                                          trim_offsets=trim_offsets, add_prefix_space=add_prefix_space)
    elif kind in SENTENCEPIECE:
        bos, eos = specials["bos_token"], specials["eos_token"]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
                                                           special_tokens=[(bos, token_id("bos_token")), (eos, token_id("eos_token"))])
    elif kind == "MPNetTokenizer":
        cls, sep = specials["cls_token"], specials["sep_token"]
        tok.post_processor = processors.TemplateProcessing(single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 {sep}:0 $B:1 {sep}:1",
                                                           special_tokens=[(cls, token_id("cls_token")), (sep, token_id("sep_token"))])
    else:
        cls, sep = specials["cls_token"], specials["sep_token"]
        tok.post_processor = processors.TemplateProcessing(single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
                                                           special_tokens=[(cls, token_id("cls_token")), (sep, token_id("sep_token"))])
    return tok


def _xlm_roberta(snapshot, config, specials):
    """XLM-R's tokenizer from sentencepiece.bpe.model (read with the
    sentencepiece package's own protobuf schema), as transformers 5's
    XLMRobertaTokenizer builds it; returns it and its add_prefix_space."""
    path = snapshot / "sentencepiece.bpe.model"
    if not path.is_file():
        raise Unsupported("XLMRobertaTokenizer needs sentencepiece.bpe.model, which the repository does not have")
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(path.read_bytes())
    pieces = [(p.piece, p.score) for p in proto.pieces]
    vocab = [(specials[k], 0.0) for k in ("bos_token", "pad_token", "eos_token", "unk_token")] + pieces[3:] + [(specials["mask_token"], 0.0)]
    tok = Tokenizer(Unigram(vocab, unk_id=3, byte_fallback=False))
    if proto.normalizer_spec.precompiled_charsmap:
        tok.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    add_prefix_space = bool(config.get("add_prefix_space", True))
    scheme = "always" if add_prefix_space else "never"
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    return tok, add_prefix_space


def write(snapshot, path):
    """Builds the tokenizer and writes it to `path` (a temporary name, then renamed)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    build(snapshot).save(str(tmp))
    tmp.replace(path)
