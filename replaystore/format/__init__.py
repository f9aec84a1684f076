"""What is on disk: the schema and its zarr attributes, shard bytes and their index, validation of
user input and of metadata read back. See docs/format.md."""
