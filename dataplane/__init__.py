"""PagedWeight dataplane: the GPU engine (token ids in, token ids out)."""
