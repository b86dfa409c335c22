"""Row counts under which a matrix product's sums depend on the batch.

BLAS multiplies a matrix of one or two rows with other kernels than a taller one, and they round
differently: Transformers4Rec's XLNet scored a session alone, or with one other, up to a float32
step apart (2.4e-7 to 9.5e-7 measured) from the same session among more, while every row count
from 3 to 33 gave the same scores, bit for bit (with one torch thread, as steps run by default:
over two threads MKL also splits the rows between them by the batch's size). So models and item
scoring never multiply fewer than ``MIN_ROWS`` rows: a smaller batch runs with its rows repeated
and keeps its own answers.
Then a session gets the same scores alone, in a request of many, or in a merged batch of requests.

TorchScript-compatible (the library's wrappers call it in-process and in libtorch alike).
"""

import torch

#: fewest rows a model or an item-scoring product runs on (3 was enough here; one row of margin)
MIN_ROWS = 4


def repeated_rows(rows: int, min_rows: int = MIN_ROWS) -> torch.Tensor:
    """Indices that take ``rows`` rows (1 or more) to ``min_rows``, each row repeated in turn."""
    return torch.arange(min_rows) % rows
