"""Generated protobuf/gRPC modules for apache.rocketmq.v2 (scripts/gen-proto)."""
