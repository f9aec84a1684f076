"""Getting batches to a learner: the prefetcher (worker threads drawing blocks of batches), the
decode processes it uses, and the tf.data bridge.

Imports nothing by itself: the decode worker runs as a script and ``tfdata`` imports TensorFlow, so
each module is imported only where it is needed."""
