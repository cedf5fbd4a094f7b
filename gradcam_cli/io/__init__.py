"""Files in and out: finding inputs, reading images and videos, naming outputs, atomic writes, the manifest."""
