"""The KServe v2 gRPC protocol (Triton's `inference.GRPCInferenceService`) beside the HTTP API, on
`--grpc-port` (off by default; the grpc extra): server.py starts it on the HTTP server's event loop,
service.py answers each RPC through the functions the HTTP routes call, infer_messages.py
translates infer requests and responses, calls.py authorizes, counts and maps errors."""
