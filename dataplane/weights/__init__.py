"""Paged multi-precision expert weights: codec, store, paged experts, model transform.

Layout contract: docs/WEIGHT_LAYOUT.md (constants in layout.py).
"""

from dataplane.weights.codec import DEFAULT_SCALE_FIT, EncodedBlock, ScaleFit, decode, encode, rtn_quantize
from dataplane.weights.copy_engine import CopyEngine, CopyHandle, CudaCopyEngine, SyncCopyEngine
from dataplane.weights.layout import FIELD_WIDTHS, GROUP, NUM_FIELDS, VIEW_BITS, block_index
from dataplane.weights.paged_experts import PagedExperts
from dataplane.weights.store import BlockView, WeightCounters, WeightStore
from dataplane.weights.transform import quantize_experts

__all__ = [
    "DEFAULT_SCALE_FIT",
    "FIELD_WIDTHS",
    "GROUP",
    "NUM_FIELDS",
    "VIEW_BITS",
    "BlockView",
    "CopyEngine",
    "CopyHandle",
    "CudaCopyEngine",
    "EncodedBlock",
    "PagedExperts",
    "ScaleFit",
    "SyncCopyEngine",
    "WeightCounters",
    "WeightStore",
    "block_index",
    "decode",
    "encode",
    "quantize_experts",
    "rtn_quantize",
]
