"""Token id lists in batches of similar length, as the GPU peers run them:
the longest first, each batch right-padded to its longest row."""
import numpy as np


def length_sorted_batches(encoded, size):
    """(rows, input_ids, attention_mask) for each batch of `size` of the
    token id lists `encoded`: the rows' indices in `encoded`, and int64
    arrays [rows, longest]."""
    lengths = np.array([len(e) for e in encoded])
    order = np.argsort(-lengths, kind="stable")
    for start in range(0, len(order), size):
        rows = order[start:start + size]
        seq = int(lengths[rows].max())
        ids = np.zeros((len(rows), seq), np.int64)
        for r, i in enumerate(rows):
            ids[r, : lengths[i]] = encoded[i]
        yield rows, ids, (np.arange(seq)[None, :] < lengths[rows][:, None]).astype(np.int64)
