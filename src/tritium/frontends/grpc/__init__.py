"""grpc package."""
