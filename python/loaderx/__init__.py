"""loaderx: a typed on-disk record store (Zrecord) and an endless, step-based
training data loader, with a Rust core.

Modules:
    loaderx.zrecord     Dense and Ragged record stores, ZrecordError, SchemaError, DICT_TIERS
    loaderx.zsampler    Sampler: sequential, IID and cyclic index batches
    loaderx.dataloader  DataLoader over a dict of equal-length stores
    loaderx.utils       train_dict for zstd_dict stores
"""

from loaderx import _native

__version__: str = _native.__version__

__all__ = ["__version__"]
