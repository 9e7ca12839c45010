"""Tar shards in the web-dataset layout: data larger than memory, read as a stream.

The front door of shard streaming, as the docs show it
(``from hasten.stream.shards import ShardLoader, open_shards``); each piece lives in
a module named for what it holds:

- ``hasten.stream.shard_store``: where the shards are (``ShardFiles``, ``open_shards``,
  ``is_shard_dir``; the store interface every source of shards has);
- ``hasten.stream.tar_members``: reading one shard (``Record``, ``read_shard``,
  ``scan_shard``, ``read_member``, ``count_examples``);
- ``hasten.stream.epoch_plan``: one epoch's plan of a rank on example numbers
  (``EpochPlan``, ``epoch_plan``) and the records it names (``plan_records``);
- ``hasten.stream.shared_buffers``: shared-memory buffers reused between the loading
  process and the decode workers (``shared_uint8``, ``BufferPool``, ``BatchPool``);
- ``hasten.stream.chunk_decode``: fused decode + crop of chunks of records in the
  workers (``pack_chunk``, ``decode_chunk``, ``CROPS``, ``default_image_size``);
- ``hasten.stream.shard_loader``: ``ShardLoader``, which composes them;
- ``hasten.stream.echo_stage``: ``EchoStage``, data echoing as a stage on its output;
- ``hasten.stream.virtual_shards`` and ``hasten.stream.sources``: an image folder or
  archive streamed without packing (``FolderShards``, ``RecordShards``), and
  ``open_source``, which opens whichever a path holds.

Changes the training math: no (an order of the data, like any shuffling sampler).
"""

from hasten.stream.chunk_decode import CROPS, default_image_size
from hasten.stream.echo_stage import EchoStage
from hasten.stream.epoch_plan import EpochPlan, epoch_plan, plan_records
from hasten.stream.shard_loader import ShardLoader
from hasten.stream.shard_store import INDEX, ShardFiles, is_shard_dir, open_shards
from hasten.stream.sources import open_source
from hasten.stream.tar_members import Record, read_shard, scan_shard
from hasten.stream.virtual_shards import FolderShards, RecordShards

__all__ = ["CROPS", "INDEX", "EchoStage", "EpochPlan", "FolderShards", "Record", "RecordShards", "ShardFiles", "ShardLoader",
           "default_image_size", "epoch_plan", "is_shard_dir", "open_shards", "open_source", "plan_records",
           "read_shard", "scan_shard"]
