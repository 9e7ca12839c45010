"""The streaming input pipeline: data read, decoded and augmented on the host every epoch.

For data that is not decoded once and held on the device (``hasten.data``):
``records`` (the raw-bytes record cache), ``rank_split`` (each rank's example indices per epoch),
``decode_pool`` (decoding in the worker pool of ``hasten.data.workers``),
``slow_storage`` (emulated slow upstream storage) and ``loader.StreamLoader``,
which composes them with the host augmentation of ``hasten.data.host_augment``
and the echo stages of ``hasten.echo``. For sets larger than memory: ``pack``
(an image folder or archive to tar shards; with ``presize``, JPEGs stored at a
bounded side), ``shard_loader.ShardLoader`` (streams them, per rank, resumable
mid-epoch) with its pieces ``shard_store`` (where the shards are), ``tar_members``
(reading one shard), ``epoch_plan`` (each rank's examples per epoch),
``chunk_decode`` and ``shared_buffers`` (decode in workers into reused batches),
``virtual_shards`` and ``sources`` (an image folder or archive streamed without packing),
``fused_crop`` (JPEG decode fused with the random-resized crop) and ``shard_cache``
(a local copy of shards read from slow storage); ``shards`` gathers the public
names of all of these. Import from the submodules.
"""
