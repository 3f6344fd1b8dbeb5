"""rules: the lowering rule table's entries, one module per op family.

Importing this package fills the rule table `kiln.lower.rule_table.lowerings`:
`pointwise` (elementwise math, casts, creation ops), `reduction`, `views` (index maps, cat, pad),
`indexing` (embedding, gather, index, scatter), `pooling` (max-pool backward), `extern` (matmul, convolution, attention) and
`inplace` (functional forms of in-place ops).
"""
from __future__ import annotations

from kiln.lower.rules import (extern, indexing, inplace, pointwise, pooling, reduction, sizes,
                              views)

__all__ = ["extern", "indexing", "inplace", "pointwise", "pooling", "reduction", "sizes",
           "views"]
