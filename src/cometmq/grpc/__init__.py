"""The RocketMQ 5 gRPC endpoint (``apache.rocketmq.v2.MessagingService``): a proxy that speaks remoting to
brokers, so the official 5.x clients work against cometmq unchanged.

Nothing here is imported by the core package: ``cometmq.grpc.server`` needs the optional ``grpc`` extra
(grpcio, protobuf). The pure helpers (``auth``, ``handles``) import neither. See docs/grpc.md.
"""
