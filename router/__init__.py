"""Router: OpenAI-compatible HTTP gateway and gRPC API in front of the workers (next issue)."""
