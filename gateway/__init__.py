"""PagedWeight gateway: the OpenAI-compatible HTTP front of the dataplane.

It owns text (chat templates, tokenization, incremental detokenization, stop
strings), request validation, API keys, admission control and metrics, and
speaks token ids to the dataplane over gRPC (`Inference` service).
"""
