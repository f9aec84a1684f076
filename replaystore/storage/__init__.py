"""Where steps live: the ring of per-step scalars in RAM, the writer and its commit, the shard files
and chunk-aware reads, chunk decoders, and the writer lock."""
