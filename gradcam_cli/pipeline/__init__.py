"""Many inputs: decoding, batching, writing, resuming, videos, and whole runs into one output folder."""
