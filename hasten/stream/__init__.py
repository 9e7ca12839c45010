"""The streaming input pipeline: data read, decoded and augmented on the host every epoch.

For data that is not decoded once and held on the device (``hasten.data``):
``records`` (the raw-bytes record cache), ``sharding`` (per-rank, per-epoch shards),
``decode_pool`` (decoding in the worker pool of ``hasten.data.workers``),
``slow_storage`` (emulated slow upstream storage) and ``loader.StreamLoader``,
which composes them with the host augmentation of ``hasten.data.host_augment``
and the echo stages of ``hasten.echo``. Import from the submodules.
"""
