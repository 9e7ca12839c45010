"""The streaming input pipeline: data read, decoded and augmented on the host every epoch.

For data that is not decoded once and held on the device (``hasten.data``), one
pipeline: ``sources.open_source`` (tar shards, their URL, an image folder or an
archive, as one store of shards), ``shard_loader.ShardLoader`` (streams them, per
rank, exactly once per epoch, resumable mid-epoch) and ``echo_stage.EchoStage``
(data echoing as a stage on its output). Their pieces: ``shard_store`` (where the
shards are), ``remote_store`` and ``store_url`` (shards behind a URL), ``tar_members``
(reading one shard), ``virtual_shards`` (a folder or the record blob of ``records``
cut into shards), ``epoch_plan`` (each rank's examples per epoch), ``chunk_decode``
and ``shared_buffers`` (decode in workers into reused batches), ``fused_crop`` (JPEG
decode fused with the random-resized crop), ``device_copy`` (pinned, non-blocking
copies to the device), ``shard_cache`` (a local copy of shards read from slow
storage) and ``slow_storage`` (emulated slow upstream storage). Beside them:
``pack`` (an image folder or archive to tar shards; with ``presize``, JPEGs stored at
a bounded side), ``shuffle_buffer`` (a stream shuffled through a bounded buffer),
``decode_pool`` (a list of records decoded into one array).

Import each name from its module (``from hasten.stream.shard_loader import ShardLoader``),
the one way the docs show: this package imports nothing itself, so that the command
line, which reads ``store_url`` as it parses, starts without loading torch.
"""
