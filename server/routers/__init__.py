"""One router per resource: health, buffers, fusions, infer."""
