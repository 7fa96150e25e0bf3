"""Data: synthetic recall tasks and real text for language modelling.

- Recall: MQAR (Zoology's multi-query associative recall) and lagged recall, as :class:`RecallSet` s.
- Text (:mod:`.corpus`, :mod:`.tokenizer`, :mod:`.token_stream`, :mod:`.lm_data`): public-domain books as
  whole documents, a split by document, a byte-level BPE or plain bytes, token streams on disk and the
  training batches drawn from them.
"""

from .corpus import Document, load_corpus, split_documents
from .lagged import lagged_recall
from .lm_data import TextData, TextSpec, prepare_text
from .multiquery import mqar
from .recall import IGNORE_INDEX, RecallSet, drop_repeats
from .token_stream import TokenStream, evaluation_starts, training_batch
from .tokenizer import BPETokenizer, ByteTokenizer, load_tokenizer, train_bpe

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "Document",
    "IGNORE_INDEX",
    "RecallSet",
    "TextData",
    "TextSpec",
    "TokenStream",
    "drop_repeats",
    "evaluation_starts",
    "lagged_recall",
    "load_corpus",
    "load_tokenizer",
    "mqar",
    "prepare_text",
    "split_documents",
    "training_batch",
    "train_bpe",
]
